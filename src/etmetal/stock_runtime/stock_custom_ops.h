// The custom operators' shims served in C by the stock backend (stock_custom_ops.cpp),
// reached from the trampoline's native paths (build.py). Each returns 0 (served), 1 (bad
// arguments, message in etm_check_message) or -1 (not served here).
#ifndef ETMETAL_STOCK_CUSTOM_OPS_H
#define ETMETAL_STOCK_CUSTOM_OPS_H

#include "native_tensors.h"

#ifdef __cplusplus
extern "C" {
#endif

extern char etm_check_message[1024];
int etm_stock_int4_linear(void* a, void* b, int64_t group_size, void* s, void* z, void** ret);
int etm_stock_gather_qmv(void* x, void* w, void* s, void* z, void* idx, int64_t group_size,
                         void** ret);
int etm_stock_gated_delta_rule(void* q, void* k, void* v, void* g, void* beta, void* state,
                               void** ret);
// the same on the emulated Metal device's tensors (device 13)
int etm_stock_mps_gather_qmv(void* x, void* w, void* s, void* z, void* idx, int64_t group_size,
                             void** ret);
int etm_stock_mps_gated_delta_rule(void* q, void* k, void* v, void* g, void* beta, void* state,
                                   void** ret);

#ifdef __cplusplus
}  // extern "C"
#endif

#endif  // ETMETAL_STOCK_CUSTOM_OPS_H
