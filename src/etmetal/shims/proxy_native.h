// The native proxy executor: an extern-node table parsed once into calls, each run through
// libtorch's dispatcher (shims/proxy_native.py explains the design; shims/proxy_executor.py
// is the reference implementation). Built into its own library, libetmetal_proxy.so, the
// only etmetal code linked against libtorch's C++ API; the bridge and the stock backend
// reach it through these C functions and never link libtorch themselves.
#ifndef ETMETAL_PROXY_NATIVE_H
#define ETMETAL_PROXY_NATIVE_H

#include "native_tensors.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct etm_proxy etm_proxy;

// what the caller's tensor handles are, in the caller's own terms (the bridge and the
// stock backend answer from their record table, proxy_host.cpp)
typedef struct {
  // 1 with *out a copy of the live host record h names (an input the op may read and
  // write); 0 when h is not one this host serves natively
  int (*lend)(void* h, etm_rec* out);
  // 1 when h is an output handle this host can rebind in place (its placeholder)
  int (*placeholder)(void* h);
  // make h name the storage libtorch made: owner (a libtorch tensor, released with
  // aoti_torch_delete_tensor_object) keeps data alive; 1 on success, owner then the host's
  int (*rebind)(void* h, void* owner, void* data, int64_t storage_bytes, int64_t ndim,
                const int64_t* sizes, const int64_t* strides, int64_t offset, int32_t dtype);
} etm_proxy_host;

// The table's calls, every node resolved against the dispatcher and the allow-list
// (the rules of shims/extern_ops.py, generated into proxy_rules.h), or NULL with the
// reason (naming the node and field) in error. allowed: names allow_extern_operator gave
// ("ns::op" or "ns::op.overload"); custom: qualnames torch.library defined in the process.
ETM_EXPORT etm_proxy* etm_proxy_parse(const char* json, int64_t n, const char* const* allowed,
                                      int64_t n_allowed, const char* const* custom,
                                      int64_t n_custom, char* error, int64_t error_len);
ETM_EXPORT void etm_proxy_free(etm_proxy* p);
ETM_EXPORT int64_t etm_proxy_node_count(const etm_proxy* p);
// Why a table may not call target ("" when it may): the check etm_proxy_parse makes of
// each node's target, in the reference's words. Returns the length written to out.
ETM_EXPORT int64_t etm_proxy_refusal(const char* target, const char* const* allowed,
                                     int64_t n_allowed, const char* const* custom,
                                     int64_t n_custom, char* out, int64_t out_len);
// Run node index with the flattened arguments of aoti_torch_proxy_executor_call_function:
// 1 served; 0 not served (a handle the host does not serve natively; nothing ran); -1
// failed (etm_proxy_last_error says why; an operator that throws may have run in part).
ETM_EXPORT int32_t etm_proxy_call(etm_proxy* p, const etm_proxy_host* host, int64_t index,
                                  int64_t num_ints, const int64_t* ints, int64_t num_tensors,
                                  void* const* tensors);
// the message of this thread's last failed parse or call
ETM_EXPORT const char* etm_proxy_last_error(void);
// calls served since the library was loaded
ETM_EXPORT extern uint64_t etm_proxy_calls;

#ifdef __cplusplus
}  // extern "C"
#endif

#endif  // ETMETAL_PROXY_NATIVE_H
