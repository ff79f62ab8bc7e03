// The proxy executor's native path in the bridge and the stock backend: which proxy
// handles a native executor serves, and the record table answering its questions
// (proxy_native.h's etm_proxy_host). The executor itself lives in libetmetal_proxy.so,
// reached through one function pointer, so this unit never links libtorch.
#ifndef ETMETAL_PROXY_HOST_H
#define ETMETAL_PROXY_HOST_H

#include "proxy_native.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef int32_t (*etm_proxy_call_fn)(etm_proxy*, const etm_proxy_host*, int64_t, int64_t,
                                     const int64_t*, int64_t, void* const*);
// etm_proxy_call of the loaded proxy library (NULL: every proxy call goes elsewhere)
ETM_EXPORT extern etm_proxy_call_fn etm_proxy_entry;
// serve the proxy handle handle with executor p (NULL: stop serving it); 0 on success
ETM_EXPORT int32_t etm_proxy_bind(void* handle, etm_proxy* p);
// the same for a model of c10 device type device (0, or 13: the emulated Metal device,
// whose records and results are host memory too); 1 for another device
ETM_EXPORT int32_t etm_proxy_bind_on(void* handle, etm_proxy* p, int32_t device);
// aoti_torch_proxy_executor_call_function's native path: 1 served, 0 not served here
// (nothing ran), -1 failed (etm_proxy_last_error of the library says why)
int etm_proxy_native(void* handle, int64_t index, int64_t num_ints, const int64_t* ints,
                     int64_t num_tensors, void* const* tensors);

#ifdef __cplusplus
}  // extern "C"
#endif

#endif  // ETMETAL_PROXY_HOST_H
