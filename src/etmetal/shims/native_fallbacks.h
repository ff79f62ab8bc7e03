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

// one row of a libtorch table, and a table of a unit (exported: native_fallbacks.bind
// reads each by name; declared extern first, as a const at namespace scope would
// otherwise be internal)
#define ETM_LT(NAME, SIG, SLOT) {NAME, SIG, (void**)(void*)&SLOT}
#define ETM_LT_TABLE(TABLE, COUNT, ...)                                   \
  ETM_EXPORT extern const etm_lt_entry TABLE[];                           \
  ETM_EXPORT extern const int64_t COUNT;                                  \
  const etm_lt_entry TABLE[] = {__VA_ARGS__};                             \
  const int64_t COUNT = sizeof(TABLE) / sizeof(TABLE[0])

ETM_EXPORT extern const etm_lt_entry etm_lt_table[];
ETM_EXPORT extern const int64_t etm_lt_count;
// 1 while the fallbacks may be served here (set by Python: the "native" implementation)
ETM_EXPORT extern int64_t etm_native_fallbacks;

// each: 1 when served here, 0 when Python must serve (or report) the call
int etm_fb_mm_out(void* out, void* self, void* mat2);
int etm_fb_bmm_out(void* out, void* self, void* mat2);
int etm_fb_addmm_out(void* out, void* self, void* mat1, void* mat2, double beta, double alpha);
int etm_fb_baddbmm_out(void* out, void* self, void* b1, void* b2, double beta, double alpha);

// ops returning new tensors: libtorch's results become native records of kind 3
int etm_fb_sdpa_flash(void* q, void* k, void* v, double dropout_p, int32_t is_causal, void* mask,
                      void* scale, void* ret0, void* ret1);
int etm_fb_convolution(void* input, void* weight, void* bias, const int64_t* stride,
                       int64_t stride_len, const int64_t* padding, int64_t padding_len,
                       const int64_t* dilation, int64_t dilation_len, int32_t transposed,
                       const int64_t* output_padding, int64_t output_padding_len, int64_t groups,
                       void* ret0);
int etm_fb_topk(void* self, int64_t k, int64_t dim, int32_t largest, int32_t sorted, void* ret0,
                void* ret1);

// the fallbacks of a device whose memory is host memory (the emulated Metal device, 13)
// reuse these paths: etm_fb_enter(device) makes the records of the call report device and
// the results it adopts report it too; -1 when that device (0 or 13) is not served
// natively now (else the previous device, for etm_fb_leave)
int32_t etm_fb_enter(int32_t device);
void etm_fb_leave(int32_t previous);
// the data of libtorch's tensor t (a result the caller still owns), or NULL
void* etm_lt_data(void* t);

// the custom operators on device (0 host, 13 the emulated Metal device), in
// native_custom_ops.cpp (linked into etmetal's bridge, not into every build of this header):
// 1 served, 0 for the Python shim to serve or report
int etm_cop_int4_linear(int32_t device, void* a, void* b, int64_t group_size, void* s, void* z,
                        void* ret);
int etm_cop_gather_qmv(int32_t device, void* x, void* w, void* s, void* z, void* idx,
                       int64_t group_size, void* ret);
int etm_cop_gated_delta_rule(int32_t device, void* q, void* k, void* v, void* g, void* beta,
                             void* state, void* ret);
// the building blocks a device's own fallbacks use (on the device etm_fb_enter set)
const etm_rec* etm_host_rec(void* h);
bool etm_lend(const etm_rec* const* recs, int n, void** out);
void etm_unlend(void** ts, int n);
bool etm_adopt_all(void** rets, int n, void** outs);
bool etm_can_adopt(void);
bool etm_optional(void* p, const etm_rec** rec);
// an attention's q, k, v and optional mask lent to libtorch into t: 3 or 4 lent, 0 none
int etm_lend_attention(void* q, void* k, void* v, void* mask, void** t);
// r's elements are a dense block (some permutation of contiguous strides)
bool etm_packed(const etm_rec* r);

ETM_EXPORT extern const etm_lt_entry etm_lt_gen_table[];
ETM_EXPORT extern const int64_t etm_lt_gen_count;

#ifdef __cplusplus
}  // extern "C"

// the device scope of one fallback call on device (0 host, 13 the emulated Metal device):
// on() is false while that device is not served natively
struct etm_fb_scope {
  int32_t previous;
  explicit etm_fb_scope(int32_t device) : previous(etm_fb_enter(device)) {}
  ~etm_fb_scope() {
    if (previous >= 0) etm_fb_leave(previous);
  }
  etm_fb_scope(const etm_fb_scope&) = delete;
  etm_fb_scope& operator=(const etm_fb_scope&) = delete;
  bool on() const { return previous >= 0; }
};
#endif

// etm_gen_<shim>: the fallbacks and utilities generated from torch's headers
#include "native_generated.h"

#endif  // ETMETAL_NATIVE_FALLBACKS_H
