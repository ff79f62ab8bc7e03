// What the units of etmetal's MetalBackend for the stock ExecuTorch runtime share
// (stock_runtime/__init__.py explains the design). The shim trampoline's own state
// (records, native tensors, libtorch slots) is declared by native_tensors.h and
// native_fallbacks.h.
#ifndef ETMETAL_STOCK_BACKEND_H
#define ETMETAL_STOCK_BACKEND_H

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "native_tensors.h"

namespace etm_stock {

// ---- errors: every failure keeps its message for etm_stock_last_error ----
void set_error(const std::string& message);  // also logged through ET_LOG
std::string shim_context();  // " (last unbound shim: ..., last check: ...)" or ""

// ---- integrity and trust (stock_trust.cpp) ----
std::string sha256_hex(const void* data, size_t n);
// the digest of a named-data key ("" when the key does not start with one): its first 64
// characters when they are lower-case hex followed by '_'
std::string key_digest(const std::string& key);
struct Spec {
  std::string key;
  std::string value;
};
// etmetal.common.delegate_blobs.delegate_digest over the same inputs
std::string delegate_digest(const void* processed, size_t n, const std::vector<Spec>& specs);
// trusted by the policy set from Python (etm_stock_set_policy) or the environment
// (ETMETAL_TRUST_NATIVE_CODE, ETMETAL_TRUSTED_BLOBS); so_digest empty when a bare .so
// digest may not vouch for this delegate
bool is_trusted(const std::string& digest, const std::string& so_digest);

// ---- the processed bytes and the weights index (stock_index.cpp) ----
struct Keys {
  std::string so, weights, extern_nodes;
  bool shared_weights = false;  // weights names an index, not one blob
};
bool parse_keys(const void* processed, size_t n, Keys* out, std::string* error);

struct IndexEntry {
  std::string name, fqn, key;
  int64_t dtype = 0, offset = 0, nbytes = 0;
  std::vector<int64_t> shape, stride;
  bool mutable_ = false, share = true;
};
// the entries of an etmetal-weights-index/1 document; false with *error naming the problem
bool parse_index(const char* data, size_t n, std::vector<IndexEntry>* out, std::string* error);

// ---- loading the .so without a compiler (stock_loader.cpp) ----
// a fresh private directory (0700) named etmetal-stock-<pid>-XXXXXX under $TMPDIR or /tmp
bool make_private_dir(std::string* dir, std::string* error);
// write data to dir/name with O_CREAT | O_EXCL | O_NOFOLLOW
bool write_private_file(const std::string& dir, const char* name, const void* data, size_t n,
                        std::string* path, std::string* error);
void remove_private_dir(const std::string& dir);
// dlopen (RTLD_LOCAL) a link group [this library, libtorch_cpu, model]: the wrapper is the
// built-in template with the model's path patched in, written next to the model
void* load_model(const std::string& dir, const std::string& model_path, std::string* error);
// where this library and libtorch_cpu are (set by etm_stock_configure)
const std::string& self_path();
extern std::string libtorch_path;

}  // namespace etm_stock

#endif  // ETMETAL_STOCK_BACKEND_H
