// The proxy executor's native path (proxy_host.h): a native executor per proxy handle,
// and the record table lent to it. Inputs may be any live record over host memory (the
// host's or the emulated Metal device's), Python's or native; outputs must be native
// records (new_uninitialized_tensor's placeholders), which the result rebinds in place,
// reporting the model's device, so the call never needs Python.
#include "proxy_host.h"

#include <unordered_map>

#include "native_fallbacks.h"

extern "C" {

ETM_EXPORT etm_proxy_call_fn etm_proxy_entry = nullptr;

extern int64_t etm_native_mps_limit;  // native_tensors.cpp

namespace {

// the executor of a proxy handle and the c10 device type of its model
struct etm_proxy_served {
  etm_proxy* executor;
  int32_t device;
};

// never destroyed: a model may be closed by a finalizer while the process exits
std::unordered_map<void*, etm_proxy_served>& etm_proxies =
    *new std::unordered_map<void*, etm_proxy_served>();

// the device of the call in progress: its results report it
thread_local int32_t etm_proxy_device = 0;

// any record over host memory: the host's, or the emulated Metal device's (an mps
// model's inputs may be host tensors, as the reference executor takes them)
int etm_proxy_lend(void* h, etm_rec* out) {
  const etm_rec* r = etm_rec_of(h);
  if (!r || (r->device_type != 0 && r->device_type != ETM_DEVICE_MPS) || r->dtype < 0 || r->dtype >= ETM_NDTYPES ||
      !etm_itemsize[r->dtype] || r->dim < 0 || r->dim > ETM_MAX_DIMS || (r->numel && !r->data_ptr))
    return 0;
  *out = *r;
  return 1;
}

int etm_proxy_placeholder(void* h) {
  const etm_rec* r = etm_rec_of(h);
  return r && r->native != 0;
}

int etm_proxy_rebind(void* h, void* owner, void* data, int64_t storage_bytes, int64_t ndim,
                     const int64_t* sizes, const int64_t* strides, int64_t offset, int32_t dtype) {
  return etm_native_rebind_on(h, owner, data, storage_bytes, ndim, sizes, strides, offset, dtype,
                              etm_proxy_device);
}

const etm_proxy_host etm_proxy_records = {etm_proxy_lend, etm_proxy_placeholder,
                                          etm_proxy_rebind};

}  // namespace

int32_t etm_proxy_bind_on(void* handle, etm_proxy* p, int32_t device) {
  if (!handle || (device != 0 && device != ETM_DEVICE_MPS)) return 1;
  if (p) etm_proxies[handle] = {p, device};
  else etm_proxies.erase(handle);
  return 0;
}

int32_t etm_proxy_bind(void* handle, etm_proxy* p) { return etm_proxy_bind_on(handle, p, 0); }

int etm_proxy_native(void* handle, int64_t index, int64_t num_ints, const int64_t* ints,
                     int64_t num_tensors, void* const* tensors) {
  if (!etm_native_fallbacks || !etm_proxy_entry || etm_proxies.empty()) return 0;
  auto it = etm_proxies.find(handle);
  if (it == etm_proxies.end()) return 0;
  // while mps tensors are Python's (the Metal checker, a Python-shim model), so is the call
  if (it->second.device == ETM_DEVICE_MPS && etm_native_mps_limit <= 0) return 0;
  int32_t previous = etm_proxy_device;
  etm_proxy_device = it->second.device;
  int r = etm_proxy_entry(it->second.executor, &etm_proxy_records, index, num_ints, ints,
                          num_tensors, tensors);
  etm_proxy_device = previous;
  return r;
}

}  // extern "C"
