// The proxy executor's native path (proxy_host.h): a native executor per proxy handle,
// and the record table lent to it. Inputs may be any live host record (Python's or
// native); outputs must be native records (new_uninitialized_tensor's placeholders),
// which the result rebinds in place, so the call never needs Python.
#include "proxy_host.h"

#include <unordered_map>

#include "native_fallbacks.h"

extern "C" {

ETM_EXPORT etm_proxy_call_fn etm_proxy_entry = nullptr;

// never destroyed: a model may be closed by a finalizer while the process exits
static std::unordered_map<void*, etm_proxy*>& etm_proxies = *new std::unordered_map<void*, etm_proxy*>();

int32_t etm_proxy_bind(void* handle, etm_proxy* p) {
  if (!handle) return 1;
  if (p) etm_proxies[handle] = p;
  else etm_proxies.erase(handle);
  return 0;
}

static int etm_proxy_lend(void* h, etm_rec* out) {
  const etm_rec* r = etm_rec_of(h);
  if (!r || r->device_type != 0 || r->dtype < 0 || r->dtype >= ETM_NDTYPES ||
      !etm_itemsize[r->dtype] || r->dim < 0 || r->dim > ETM_MAX_DIMS || (r->numel && !r->data_ptr))
    return 0;
  *out = *r;
  return 1;
}

static int etm_proxy_placeholder(void* h) {
  const etm_rec* r = etm_rec_of(h);
  return r && r->native != 0;
}

static const etm_proxy_host etm_proxy_records = {etm_proxy_lend, etm_proxy_placeholder,
                                                 etm_native_rebind};

int etm_proxy_native(void* handle, int64_t index, int64_t num_ints, const int64_t* ints,
                     int64_t num_tensors, void* const* tensors) {
  if (!etm_native_fallbacks || !etm_proxy_entry || etm_proxies.empty()) return 0;
  auto it = etm_proxies.find(handle);
  if (it == etm_proxies.end()) return 0;
  return etm_proxy_entry(it->second, &etm_proxy_records, index, num_ints, ints, num_tensors, tensors);
}

}  // extern "C"
