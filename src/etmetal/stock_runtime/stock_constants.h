// The model container's API as this backend calls it, and a delegate's constants
// (stock_constants.cpp). Signatures: torch/csrc/inductor/aoti_runtime/interface.h.
#ifndef ETMETAL_STOCK_CONSTANTS_H
#define ETMETAL_STOCK_CONSTANTS_H

#include <executorch/runtime/core/named_data_map.h>

#include <memory>

#include "stock_backend.h"

namespace etm_stock {

struct ConstantPair {  // AOTInductorConstantMapEntry
  const char* name;
  void* handle;
};

struct Aoti {
  int32_t (*create)(void**, size_t, const char*, const char*);
  int32_t (*remove)(void*);
  int32_t (*run)(void*, void**, size_t, void**, size_t, void*, void*);
  int32_t (*num_inputs)(void*, size_t*);
  int32_t (*num_outputs)(void*, size_t*);
  int32_t (*num_constants)(void*, size_t*);
  int32_t (*blob_size)(void*, uint64_t*);
  int32_t (*from_blob)(void*, const uint8_t*);
  int32_t (*constant_name)(void*, size_t, const char**);
  int32_t (*constant_folded)(void*, size_t, bool*);
  int32_t (*constant_dtype)(void*, size_t, int32_t*);
  int32_t (*constant_size)(void*, size_t, size_t*);
  int32_t (*lend_pairs)(void*, const ConstantPair*, size_t, bool, bool);
  int32_t (*last_error)(const char**);  // may be absent
  int32_t (*constant_type)(void*, size_t, int32_t*);  // may be absent
  int32_t (*extract)(void*, const ConstantPair**, size_t*, bool);  // may be absent
  int32_t (*constant_fqn)(void*, size_t, const char**);  // may be absent
};
// the container functions of a loaded model (lib: its link wrapper's handle)
bool bind_aoti(void* lib, Aoti* api, std::string* error);
// "<step> failed: <the container's message or the code>"
std::string container_error(const Aoti& api, int32_t rc, const std::string& step);

// a constant lent to one container: what the delegate frees after the container
struct Lent {
  std::string name, key;  // AOTI name, named-data key
  const void* data = nullptr;
  bool mutable_ = false;
};

class Constants {
 public:
  ~Constants() { release(); }
  // the weights blob layout: the container copies its constants from the verified blob
  bool load_blob(const Aoti& api, void* container,
                 std::unique_ptr<executorch::runtime::FreeableBuffer> blob,
                 std::string* error);
  // the weights-index layout: each constant lent in place from the named data, shared by
  // every delegate of the program (mutable ones copied per delegate unless "share")
  bool lend_index(const Aoti& api, void* container,
                  const executorch::runtime::NamedDataMap* named,
                  const std::vector<IndexEntry>& entries, std::string* error);
  // the one blob of an emulated-Metal (device 13) container, shared by every delegate of
  // the program that names the same blob: read, checked and laid out once as the device
  // image the container would build (a probe container reports each constant's geometry),
  // then lent as user-managed constants; buffers (the KV caches) copied per delegate
  // unless share_buffers (compile spec share_mutable_buffers): then the image's one copy
  bool share_device_blob(const Aoti& api, void* container, const executorch::runtime::NamedDataMap* named,
                         const std::string& key,
                         std::unique_ptr<executorch::runtime::FreeableBuffer>* blob,
                         bool share_buffers, std::string* error);
  // after the container is deleted: the records, copies and shared entries it held
  void release();
  const std::vector<Lent>& lent() const { return lent_; }

 private:
  std::unique_ptr<executorch::runtime::FreeableBuffer> blob_;
  void* blob_copy_ = nullptr;  // when the blob was not 64-byte aligned
  std::vector<void*> records_;  // native borrowed records lent, and the container's aliases
  std::vector<std::string> shared_;  // entries of the shared cache this delegate holds
  std::vector<void*> copies_;  // this delegate's own mutable buffers
  std::vector<Lent> lent_;
};

// entries of the shared constant cache (for tests: constants read once per program)
int64_t shared_entries();

}  // namespace etm_stock

#endif  // ETMETAL_STOCK_CONSTANTS_H
