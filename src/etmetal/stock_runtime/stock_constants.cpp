// A delegate's constants, given to its model container as etmetal's runtime gives them
// (shims/model.py, shims/user_constants.py, runtime/shared_weights.py): upstream's one
// weights blob through AOTInductorModelUpdateConstantsFromBlob, or the weights index's
// entries lent in place as native borrowed records (user-managed constants). An entry is
// read and checked against its key once per program (named-data map) and shared by every
// delegate that names it, so the methods of a program read one copy of each weight.
#include "stock_constants.h"

#include "stock_mps.h"

#include <dlfcn.h>

#include <cstdlib>
#include <cstring>
#include <map>

extern "C" {
extern void** etm_alias_log;
extern int64_t etm_alias_cap, etm_alias_len;
extern uint64_t etm_mps_lent_start, etm_mps_lent_bytes;
void* etm_native_lend(void* data, int64_t ndim, const int64_t* sizes, const int64_t* strides,
                      int64_t offset, int32_t dtype, int64_t storage_bytes);
int32_t etm_native_delete_handle(void* h);
}

namespace etm_stock {
namespace {

const size_t kAlignment = 64;  // AOTI allocates its own constants at this alignment

void* aligned_copy(const void* data, size_t n) {
  void* p = aligned_alloc(kAlignment, (n + kAlignment - 1) / kAlignment * kAlignment + kAlignment);
  if (p && n) std::memcpy(p, data, n);
  return p;
}

// one constant of a device image, where a probe container put it
struct DeviceConstant {
  std::string name;
  int64_t ndim = 0, sizes[ETM_MAX_DIMS] = {0}, strides[ETM_MAX_DIMS] = {0};
  int64_t offset = 0;    // elements from the image's start (the container's own offset)
  int64_t slot = 0;      // byte offset of its 64-byte aligned slot in the image
  int64_t nbytes = 0;    // its data size in the blob
  int32_t dtype = 0;
  bool buffer = false;   // a mutable buffer (ConstantType::Buffer): copied per delegate
};

// one checked named-data entry (or one shared mutable buffer) and the delegates using it
struct Shared {
  std::unique_ptr<executorch::runtime::FreeableBuffer> buffer;
  void* copy = nullptr;  // aligned copy (a misaligned entry, or a mutable buffer)
  const void* data = nullptr;
  size_t size = 0;
  int64_t refs = 0;
  std::vector<DeviceConstant> layout;  // a device image's constants
};
// (named-data map, key) -> entry; the backend's lock guards it (metal_backend.cpp)
std::map<std::string, Shared>& shared_cache() {
  static auto* cache = new std::map<std::string, Shared>();
  return *cache;
}

std::string cache_key(const executorch::runtime::NamedDataMap* named, const std::string& key) {
  return std::to_string((uintptr_t)named) + ":" + key;
}

// the entry's bytes, read and checked once per program
Shared* checked_entry(const executorch::runtime::NamedDataMap* named, const IndexEntry& e,
                      std::string* error) {
  auto& cache = shared_cache();
  std::string id = cache_key(named, e.key);
  auto it = cache.find(id);
  if (it != cache.end()) return &it->second;
  auto data = named->get_data(e.key.c_str());
  if (!data.ok()) {
    *error = "named data '" + e.key + "' of constant '" + e.name + "' is in neither the " +
             "program nor its data files (error " + std::to_string((int)data.error()) + ")";
    return nullptr;
  }
  auto buffer = std::make_unique<executorch::runtime::FreeableBuffer>(std::move(data.get()));
  if ((int64_t)buffer->size() != e.nbytes) {
    *error = "constant '" + e.name + "' (" + e.fqn + ") has " + std::to_string(buffer->size()) +
             " bytes in named data '" + e.key + "', the index says " + std::to_string(e.nbytes);
    return nullptr;
  }
  std::string actual = sha256_hex(buffer->data(), buffer->size());
  if (actual != key_digest(e.key)) {
    *error = "constant '" + e.name + "' (" + e.fqn + ") does not match its key: sha256 " +
             actual + ", key '" + e.key + "'; the program was altered or corrupted after export";
    return nullptr;
  }
  Shared& s = cache[id];
  s.size = buffer->size();
  if ((uintptr_t)buffer->data() % kAlignment) {
    s.copy = aligned_copy(buffer->data(), buffer->size());
    if (!s.copy) {
      cache.erase(id);
      *error = "out of memory copying constant '" + e.name + "'";
      return nullptr;
    }
    s.data = s.copy;
    buffer.reset();
  } else {
    s.data = buffer->data();
  }
  s.buffer = std::move(buffer);
  return &s;
}

// elements the constant spans must fit in its stored bytes (shared_weights._typed)
bool fits(const IndexEntry& e, std::string* error) {
  int64_t item = e.dtype < ETM_NDTYPES ? etm_itemsize[e.dtype] : 0;
  if (!item) {
    *error = "constant '" + e.name + "' has dtype code " + std::to_string(e.dtype) +
             ", which this backend does not know";
    return false;
  }
  int64_t need = e.offset + 1, span;
  bool empty = false, overflow = false;
  for (size_t d = 0; d < e.shape.size(); d++) {
    if (e.shape[d] == 0) empty = true;
    else if (__builtin_mul_overflow(e.shape[d] - 1, e.stride[d], &span) ||
             __builtin_add_overflow(need, span, &need))
      overflow = true;
  }
  if (empty || e.shape.size() > ETM_MAX_DIMS) {
    *error = "constant '" + e.name + "' has no elements or more than 8 dimensions, which a " +
             "native borrowed record cannot hold";
    return false;
  }
  if (overflow || e.nbytes % item || __builtin_mul_overflow(need, item, &need) ||
      need > e.nbytes) {
    *error = "constant '" + e.name + "' (" + e.fqn + "): " + std::to_string(e.nbytes) +
             " stored bytes do not hold its shape, stride and offset";
    return false;
  }
  return true;
}

const int32_t kBufferType = 2;  // torch::aot_inductor::ConstantType::Buffer

int64_t padded(int64_t n) { return (n + 63) / 64 * 64; }

// load the blob into a probe container of the same .so and read back where it put each
// constant: the image the container builds (one buffer, 64-byte slots), its geometry
bool probe_layout(const Aoti& api, const void* blob, size_t blob_size, Shared* out,
                  std::string* error) {
  if (!api.extract) return *error = "the .so cannot report its constants (no "
                                    "ExtractConstantsMapEntries)", false;
  void* probe = nullptr;
  int32_t rc = api.create(&probe, 1, "mps", nullptr);
  if (rc) return *error = container_error(api, rc, "creating the probe container"), false;
  etm_mps_lent_start = (uint64_t)(uintptr_t)blob;
  etm_mps_lent_bytes = blob_size;
  rc = api.from_blob(probe, (const uint8_t*)blob);
  etm_mps_lent_start = etm_mps_lent_bytes = 0;
  std::string device = etm_stock::take_mps_error();
  bool ok = !rc && device.empty();
  if (!ok) *error = rc ? container_error(api, rc, "loading the probe's constants")
                       : "loading the probe's constants failed (" + device + ")";
  const ConstantPair* entries = nullptr;
  size_t n = 0, count = 0;
  if (ok && ((rc = api.extract(probe, &entries, &n, false)) || (rc = api.num_constants(probe, &count)))) {
    ok = false;
    *error = container_error(api, rc, "reading the probe's constants");
  }
  // the entries are the non-folded constants in table order, named by their original FQN
  size_t next = 0;
  int64_t slot = 0, base = 0;
  for (size_t i = 0; ok && i < count; i++) {
    bool folded = false;
    const char* name = nullptr;
    size_t size = 0;
    int32_t type = 0;
    if ((rc = api.constant_folded(probe, i, &folded)) ||
        (!folded && ((rc = api.constant_name(probe, i, &name)) ||
                     (rc = api.constant_size(probe, i, &size)) ||
                     (api.constant_type && (rc = api.constant_type(probe, i, &type)))))) {
      ok = false;
      *error = container_error(api, rc, "reading the probe's constant table");
      break;
    }
    if (folded) continue;
    DeviceConstant c;
    c.name = name ? name : "";
    c.nbytes = (int64_t)size;
    c.slot = slot;
    c.buffer = type == kBufferType;
    slot += padded(c.nbytes);
    const char* fqn = nullptr;
    bool same = next < n && (!api.constant_fqn || (!api.constant_fqn(probe, i, &fqn) && fqn &&
                                                   entries[next].name &&
                                                   !std::strcmp(fqn, entries[next].name)));
    const etm_rec* r = same ? etm_rec_of(entries[next].handle) : nullptr;
    next++;
    int64_t item = r && r->dtype >= 0 && r->dtype < ETM_NDTYPES ? etm_itemsize[r->dtype] : 0;
    int64_t start = r && item ? r->data_ptr - r->offset * item : 0;
    if (!r || !item || r->device_type != ETM_DEVICE_MPS || !r->native || r->numel <= 0 ||
        (base && start != base) || c.slot % item || r->offset * item < c.slot) {
      ok = false;
      *error = "constant '" + c.name + "' is not a native emulated-Metal tensor in the probe's " +
               "one constant buffer (" + (r ? "device " + std::to_string(r->device_type) +
               ", record kind " + std::to_string(r->native) + ", offset " + std::to_string(r->offset) +
               ", slot " + std::to_string(c.slot) : std::string("not among its ") +
               std::to_string(n) + " constants") + "); its weights cannot be shared";
      break;
    }
    base = start;
    c.ndim = r->dim;
    c.dtype = r->dtype;
    c.offset = r->offset;
    for (int64_t d = 0; d < r->dim; d++) c.sizes[d] = r->sizes[d], c.strides[d] = r->strides[d];
    out->layout.push_back(c);
  }
  if (ok && slot > 0) {  // the probe's buffer is the image: copy it out whole
    void* image = aligned_copy((const void*)(intptr_t)base, (size_t)slot);
    if (!image) ok = false, *error = "out of memory copying the constants' image";
    out->copy = image;
    out->data = image;
    out->size = (size_t)slot;
  }
  api.remove(probe);
  etm_stock::take_mps_error();  // the probe's teardown is not the delegate's
  return ok;
}

}  // namespace

int64_t shared_entries() { return (int64_t)shared_cache().size(); }

bool bind_aoti(void* lib, Aoti* api, std::string* error) {
  struct Row {
    const char* name;
    void** slot;
    bool required;
  } rows[] = {
      {"AOTInductorModelContainerCreateWithDevice", (void**)&api->create, true},
      {"AOTInductorModelContainerDelete", (void**)&api->remove, true},
      {"AOTInductorModelContainerRun", (void**)&api->run, true},
      {"AOTInductorModelContainerGetNumInputs", (void**)&api->num_inputs, true},
      {"AOTInductorModelContainerGetNumOutputs", (void**)&api->num_outputs, true},
      {"AOTInductorModelContainerGetNumConstants", (void**)&api->num_constants, true},
      {"AOTInductorModelContainerGetConstantsBlobSize", (void**)&api->blob_size, true},
      {"AOTInductorModelUpdateConstantsFromBlob", (void**)&api->from_blob, true},
      {"AOTInductorModelContainerGetConstantName", (void**)&api->constant_name, true},
      {"AOTInductorModelContainerGetConstantFromFolded", (void**)&api->constant_folded, true},
      {"AOTInductorModelContainerGetConstantDtype", (void**)&api->constant_dtype, true},
      {"AOTInductorModelContainerGetConstantDataSize", (void**)&api->constant_size, true},
      {"AOTInductorModelContainerUpdateUserManagedConstantBufferPairs",
       (void**)&api->lend_pairs, true},
      {"AOTInductorGetLastError", (void**)&api->last_error, false},
      {"AOTInductorModelContainerGetConstantType", (void**)&api->constant_type, false},
      {"AOTInductorModelContainerExtractConstantsMapEntries", (void**)&api->extract, false},
      {"AOTInductorModelContainerGetConstantOriginalFQN", (void**)&api->constant_fqn, false},
  };
  for (const Row& r : rows) {
    *r.slot = dlsym(lib, r.name);
    if (!*r.slot && r.required) {
      *error = std::string("the .so has no ") + r.name + ": not an AOTI model";
      return false;
    }
  }
  return true;
}

std::string container_error(const Aoti& api, int32_t rc, const std::string& step) {
  const char* msg = nullptr;
  if (api.last_error) api.last_error(&msg);
  std::string text = msg && *msg ? msg : "error code " + std::to_string(rc);
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  return step + " failed" + shim_context() + ": " + text;  // the shim first: AOTI's text is long
}

// how many constants the container has (*count), and whether a blob of `size` bytes holds
// them all; false with *error naming what failed
static bool blob_covers_constants(const Aoti& api, void* container, size_t size, size_t* count,
                                  std::string* error) {
  uint64_t need = 0;
  int32_t rc = api.num_constants(container, count);
  if (rc) return *error = container_error(api, rc, "reading the constant table"), false;
  if (!*count) return true;
  rc = api.blob_size(container, &need);
  if (rc) return *error = container_error(api, rc, "reading the constants' size"), false;
  if (size < need) {
    *error = "the weights blob has " + std::to_string(size) + " bytes, the model's " +
             std::to_string(*count) + " constants need " + std::to_string(need);
    return false;
  }
  return true;
}

bool Constants::load_blob(const Aoti& api, void* container,
                          std::unique_ptr<executorch::runtime::FreeableBuffer> blob,
                          std::string* error) {
  size_t count = 0;
  if (!blob_covers_constants(api, container, blob->size(), &count, error)) return false;
  if (!count) return true;
  const void* data = blob->data();
  if ((uintptr_t)data % kAlignment) {
    blob_copy_ = aligned_copy(data, blob->size());
    if (!blob_copy_) return *error = "out of memory copying the weights blob", false;
    data = blob_copy_;
  }
  blob_ = std::move(blob);  // kept until destroy, as etmetal's runtime keeps it
  // an mps container copies each constant out of the blob (aoti_torch_mps_memcpy): the
  // emulated device may read it for the length of this load
  etm_mps_lent_start = (uint64_t)(uintptr_t)data;
  etm_mps_lent_bytes = blob_->size();
  int32_t rc = api.from_blob(container, (const uint8_t*)data);
  etm_mps_lent_start = etm_mps_lent_bytes = 0;
  if (rc) return *error = container_error(api, rc, "loading constants from the weights blob"), false;
  return true;
}

bool Constants::lend_index(const Aoti& api, void* container,
                           const executorch::runtime::NamedDataMap* named,
                           const std::vector<IndexEntry>& entries, std::string* error) {
  std::map<std::string, const IndexEntry*> by_name;
  for (const IndexEntry& e : entries) by_name[e.name] = &e;
  size_t count = 0;
  int32_t rc = api.num_constants(container, &count);
  if (rc) return *error = container_error(api, rc, "reading the constant table"), false;
  size_t stored = 0;
  for (size_t i = 0; i < count; i++) {  // what the .so expects, against what is offered
    bool folded = false;
    const char* name = nullptr;
    int32_t dtype = -1;
    size_t size = 0;
    if ((rc = api.constant_folded(container, i, &folded)) ||
        (!folded && ((rc = api.constant_name(container, i, &name)) ||
                     (rc = api.constant_dtype(container, i, &dtype)) ||
                     (rc = api.constant_size(container, i, &size)))))
      return *error = container_error(api, rc, "reading the constant table"), false;
    if (folded) continue;
    stored++;
    auto it = by_name.find(name ? name : "");
    if (it == by_name.end())
      return *error = "no constant offered for '" + std::string(name ? name : "") + "'", false;
    const IndexEntry& e = *it->second;
    if (e.dtype != dtype) {
      *error = "constant '" + e.name + "' is dtype code " + std::to_string(dtype) +
               " in the .so, the index says " + std::to_string(e.dtype);
      return false;
    }
    if (!fits(e, error)) return false;
    // the .so reads data_size bytes from the tensor's data on (padded to 64)
    int64_t have = e.nbytes - e.offset * etm_itemsize[e.dtype];
    if (have < (int64_t)size - 63) {
      *error = "constant '" + e.name + "' needs " + std::to_string(size) + " bytes, its entry " +
               "holds " + std::to_string(have);
      return false;
    }
  }
  if (stored != entries.size()) {
    *error = "the index offers " + std::to_string(entries.size()) + " constants, the .so " +
             "stores " + std::to_string(stored);
    return false;
  }
  std::vector<ConstantPair> pairs;
  for (const IndexEntry& e : entries) {
    Shared* s = checked_entry(named, e, error);
    if (!s) return false;
    shared_.push_back(cache_key(named, e.key));
    s->refs++;
    const void* data = s->data;
    if (e.mutable_ && e.share) {  // one writable copy per program, under the buffer's name
      std::string id = cache_key(named, "mutable:" + e.fqn + ":" + e.key);
      Shared& m = shared_cache()[id];
      if (!m.copy && !(m.copy = aligned_copy(s->data, s->size))) {
        shared_cache().erase(id);
        return *error = "out of memory copying buffer '" + e.name + "'", false;
      }
      m.data = m.copy;
      m.refs++;
      shared_.push_back(id);
      data = m.data;
    } else if (e.mutable_) {  // this delegate's own buffer, as its method declares
      void* copy = aligned_copy(s->data, s->size);
      if (!copy) return *error = "out of memory copying buffer '" + e.name + "'", false;
      copies_.push_back(copy);
      data = copy;
    }
    void* record = etm_native_lend(const_cast<void*>(data), (int64_t)e.shape.size(),
                                   e.shape.data(), e.stride.data(), e.offset, (int32_t)e.dtype,
                                   e.nbytes);
    if (!record) return *error = "no native record is free for constant '" + e.name + "'", false;
    records_.push_back(record);
    pairs.push_back({e.name.c_str(), record});
    lent_.push_back({e.name, e.key, data, e.mutable_});
  }
  // the container keeps each user-managed constant under an alias of its own
  // (new_tensor_handle) and never deletes it: logged here, deleted after the container
  std::vector<void*> aliases(pairs.size() + 1);
  etm_alias_log = aliases.data();
  etm_alias_cap = (int64_t)pairs.size();
  etm_alias_len = 0;
  rc = api.lend_pairs(container, pairs.data(), pairs.size(), false, true);
  records_.insert(records_.end(), aliases.begin(), aliases.begin() + etm_alias_len);
  etm_alias_log = nullptr;
  etm_alias_cap = etm_alias_len = 0;
  if (rc) return *error = container_error(api, rc, "lending the shared constants"), false;
  return true;
}

bool Constants::share_device_blob(const Aoti& api, void* container,
                                  const executorch::runtime::NamedDataMap* named,
                                  const std::string& key,
                                  std::unique_ptr<executorch::runtime::FreeableBuffer>* held,
                                  bool share_buffers, std::string* error) {
  executorch::runtime::FreeableBuffer* blob = held->get();
  size_t count = 0;
  if (!blob_covers_constants(api, container, blob->size(), &count, error)) return false;
  if (!count) return true;
  auto& cache = shared_cache();
  std::string id = cache_key(named, "device-image:" + key);
  if (!cache.count(id)) {
    const void* data = blob->data();
    void* copy = nullptr;
    if ((uintptr_t)data % kAlignment && !(data = copy = aligned_copy(data, blob->size())))
      return *error = "out of memory copying the weights blob", false;
    Shared probed;
    bool ok = probe_layout(api, data, blob->size(), &probed, error);
    free(copy);
    if (!ok) {
      free(probed.copy);
      return false;
    }
    cache[id] = std::move(probed);
  }
  held->reset();  // the image holds the constants now
  Shared& image = cache[id];
  image.refs++;
  shared_.push_back(id);
  std::vector<ConstantPair> pairs;
  for (const DeviceConstant& c : image.layout) {
    char* base = (char*)image.data;
    int64_t offset = c.offset, storage = (int64_t)image.size, item = etm_itemsize[c.dtype];
    if (c.buffer && !share_buffers) {  // this delegate's own copy, as its method declares
      void* own = aligned_copy(base + c.slot, (size_t)padded(c.nbytes));
      if (!own) return *error = "out of memory copying buffer '" + c.name + "'", false;
      copies_.push_back(own);
      base = (char*)own;
      offset -= c.slot / item;
      storage = padded(c.nbytes);
    }
    void* record = nullptr;
    if (!etm_native_borrow(base, c.ndim, c.sizes, c.strides, offset, c.dtype, ETM_DEVICE_MPS, 0,
                           &record))
      return *error = "no native record is free for constant '" + c.name + "'", false;
    ((etm_rec*)record)->storage_bytes = storage;  // the whole storage: views may reach it
    records_.push_back(record);
    pairs.push_back({c.name.c_str(), record});
    lent_.push_back({c.name, key, (const void*)(intptr_t)((etm_rec*)record)->data_ptr, c.buffer});
  }
  std::vector<void*> aliases(pairs.size() + 1);
  etm_alias_log = aliases.data();
  etm_alias_cap = (int64_t)pairs.size();
  etm_alias_len = 0;
  int32_t rc = api.lend_pairs(container, pairs.data(), pairs.size(), false, true);
  records_.insert(records_.end(), aliases.begin(), aliases.begin() + etm_alias_len);
  etm_alias_log = nullptr;
  etm_alias_cap = etm_alias_len = 0;
  if (rc) return *error = container_error(api, rc, "lending the shared constants"), false;
  return true;
}

void Constants::release() {
  for (void* r : records_) etm_native_delete_handle(r);
  records_.clear();
  for (void* c : copies_) free(c);
  copies_.clear();
  auto& cache = shared_cache();
  for (const std::string& id : shared_) {
    auto it = cache.find(id);
    if (it == cache.end() || --it->second.refs > 0) continue;
    free(it->second.copy);
    cache.erase(it);  // frees the named-data buffer
  }
  shared_.clear();
  lent_.clear();
  blob_.reset();
  free(blob_copy_);
  blob_copy_ = nullptr;
}

}  // namespace etm_stock
