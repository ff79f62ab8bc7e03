// The common CPU fallbacks (mm_out, addmm_out, bmm_out, baddbmm_out) served in C by
// libtorch's own exported C shims (shims/native_fallbacks.py explains the design).
#ifndef ETMETAL_NATIVE_FALLBACKS_H
#define ETMETAL_NATIVE_FALLBACKS_H

#include "native_tensors.h"

#ifdef __cplusplus
extern "C" {
#endif

// one libtorch function the fallbacks call: its C name, the signature this unit calls it
// with (pointers spelled void*, as shims/abi.py reduces torch's headers) and the slot
// Python fills with its address (dlsym in the libtorch_cpu torch has loaded)
typedef struct {
  const char* name;
  const char* signature;
  void** slot;
} etm_lt_entry;

ETM_EXPORT extern const etm_lt_entry etm_lt_table[];
ETM_EXPORT extern const int64_t etm_lt_count;
// 1 while the fallbacks may be served here (set by Python: the "native" implementation)
ETM_EXPORT extern int64_t etm_native_fallbacks;

// each: 1 when served here, 0 when Python must serve (or report) the call
int etm_fb_mm_out(void* out, void* self, void* mat2);
int etm_fb_bmm_out(void* out, void* self, void* mat2);
int etm_fb_addmm_out(void* out, void* self, void* mat1, void* mat2, double beta, double alpha);
int etm_fb_baddbmm_out(void* out, void* self, void* b1, void* b2, double beta, double alpha);

#ifdef __cplusplus
}  // extern "C"
#endif

#endif  // ETMETAL_NATIVE_FALLBACKS_H
