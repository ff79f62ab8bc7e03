// Fallback ops served in C (shims/native_fallbacks.py explains the design). Its own
// translation unit, linked into the bridge next to native_tensors.cpp.
#include "native_fallbacks.h"

#include <cstdint>

extern "C" {

ETM_EXPORT int64_t etm_native_fallbacks = 0;

// libtorch's functions, as the bridge calls them; Python checks each signature against
// torch's installed headers before it fills the slot (native_fallbacks.bind)
typedef int32_t (*etm_lt_from_blob_fn)(void*, int64_t, const int64_t*, const int64_t*, int64_t,
                                        int32_t, int32_t, int32_t, void**);
typedef int32_t (*etm_lt_delete_fn)(void*);
typedef int32_t (*etm_lt_mm_fn)(void*, void*, void*);
typedef int32_t (*etm_lt_addmm_fn)(void*, void*, void*, void*, double, double);
static etm_lt_from_blob_fn etm_lt_from_blob = nullptr;
static etm_lt_delete_fn etm_lt_delete = nullptr;
static etm_lt_mm_fn etm_lt_mm_out = nullptr, etm_lt_bmm_out = nullptr;
static etm_lt_addmm_fn etm_lt_addmm_out = nullptr, etm_lt_baddbmm_out = nullptr;

#define ETM_LT(NAME, SIG, SLOT) {NAME, SIG, (void**)(void*)&SLOT}
const etm_lt_entry etm_lt_table[] = {
    ETM_LT("aoti_torch_create_tensor_from_blob",
           "int32_t(void*, int64_t, void*, void*, int64_t, int32_t, int32_t, int32_t, void*)",
           etm_lt_from_blob),
    ETM_LT("aoti_torch_delete_tensor_object", "int32_t(void*)", etm_lt_delete),
    ETM_LT("aoti_torch_cpu_mm_out", "int32_t(void*, void*, void*)", etm_lt_mm_out),
    ETM_LT("aoti_torch_cpu_bmm_out", "int32_t(void*, void*, void*)", etm_lt_bmm_out),
    ETM_LT("aoti_torch_cpu_addmm_out", "int32_t(void*, void*, void*, void*, double, double)",
           etm_lt_addmm_out),
    ETM_LT("aoti_torch_cpu_baddbmm_out", "int32_t(void*, void*, void*, void*, double, double)",
           etm_lt_baddbmm_out),
};
const int64_t etm_lt_count = sizeof(etm_lt_table) / sizeof(etm_lt_table[0]);

// a host record with elements that libtorch can wrap; NULL otherwise (Python serves it)
static const etm_rec* etm_host_rec(void* h) {
  const etm_rec* r = etm_rec_of(h);
  if (!r || r->device_type != 0 || r->dtype < 0 || r->dtype >= ETM_NDTYPES ||
      !etm_itemsize[r->dtype] || r->numel <= 0 || !r->data_ptr || r->dim < 0 ||
      r->dim > ETM_MAX_DIMS)
    return nullptr;
  return r;
}

// a dense block (some permutation of contiguous strides): ATen writes it in place
static bool etm_packed(const etm_rec* r) {
  int64_t expected = 1;
  bool used[ETM_MAX_DIMS] = {false};
  for (int64_t n = 0; n < r->dim; n++) {  // the dimension with the smallest stride next
    int64_t best = -1;
    for (int64_t d = 0; d < r->dim; d++)
      if (!used[d] && r->sizes[d] != 1 && (best < 0 || r->strides[d] < r->strides[best])) best = d;
    if (best < 0) break;
    used[best] = true;
    if (r->strides[best] != expected) return false;
    expected *= r->sizes[best];
  }
  return true;
}

// libtorch tensors over the records' memory (no copy), or false with none left behind
static bool etm_lend(const etm_rec* const* recs, int n, void** out) {
  if (!etm_lt_from_blob || !etm_lt_delete) return false;
  for (int i = 0; i < n; i++) {
    const etm_rec* r = recs[i];
    out[i] = nullptr;
    if (etm_lt_from_blob((void*)(intptr_t)r->data_ptr, r->dim, r->sizes, r->strides, 0,
                         r->dtype, 0, 0, &out[i]) != 0) {
      for (int j = 0; j < i; j++) etm_lt_delete(out[j]);
      return false;
    }
  }
  return true;
}
static void etm_unlend(void** ts, int n) {
  for (int i = 0; i < n; i++) etm_lt_delete(ts[i]);
}

// self (dims - 2 leading batch dims, then n x k) times mat (then k x m) into out (n x m),
// all of one dtype; bias (when given) broadcasts to out
static bool etm_product_ok(const etm_rec* out, const etm_rec* a, const etm_rec* b,
                           const etm_rec* bias, int64_t dims) {
  if (a->dim != dims || b->dim != dims || out->dim != dims || a->dtype != b->dtype ||
      out->dtype != a->dtype || !etm_packed(out))
    return false;
  if (dims == 3 && (a->sizes[0] != b->sizes[0] || out->sizes[0] != a->sizes[0])) return false;
  int64_t n = a->sizes[dims - 2], k = a->sizes[dims - 1], m = b->sizes[dims - 1];
  if (b->sizes[dims - 2] != k || out->sizes[dims - 2] != n || out->sizes[dims - 1] != m)
    return false;
  if (!bias) return true;
  if (bias->dtype != a->dtype || bias->dim > dims) return false;
  for (int64_t d = 0; d < bias->dim; d++) {
    int64_t s = bias->sizes[bias->dim - 1 - d], want = out->sizes[dims - 1 - d];
    if (s != 1 && s != want) return false;
  }
  return true;
}

static int etm_product(etm_lt_mm_fn fn, void* out, void* self, void* mat2, int64_t dims) {
  if (!etm_native_fallbacks || !fn) return 0;
  const etm_rec* recs[3] = {etm_host_rec(out), etm_host_rec(self), etm_host_rec(mat2)};
  if (!recs[0] || !recs[1] || !recs[2] || !etm_product_ok(recs[0], recs[1], recs[2], nullptr, dims))
    return 0;
  void* t[3];
  if (!etm_lend(recs, 3, t)) return 0;
  int32_t rc = fn(t[0], t[1], t[2]);
  etm_unlend(t, 3);
  return rc == 0;  // a failure: Python runs the op again and reports why
}

static int etm_scaled_product(etm_lt_addmm_fn fn, void* out, void* self, void* m1, void* m2,
                              double beta, double alpha, int64_t dims) {
  if (!etm_native_fallbacks || !fn) return 0;
  const etm_rec* recs[4] = {etm_host_rec(out), etm_host_rec(self), etm_host_rec(m1),
                            etm_host_rec(m2)};
  if (!recs[0] || !recs[1] || !recs[2] || !recs[3] ||
      !etm_product_ok(recs[0], recs[2], recs[3], recs[1], dims))
    return 0;
  void* t[4];
  if (!etm_lend(recs, 4, t)) return 0;
  int32_t rc = fn(t[0], t[1], t[2], t[3], beta, alpha);
  etm_unlend(t, 4);
  return rc == 0;
}

int etm_fb_mm_out(void* out, void* self, void* mat2) {
  return etm_product(etm_lt_mm_out, out, self, mat2, 2);
}
int etm_fb_bmm_out(void* out, void* self, void* mat2) {
  return etm_product(etm_lt_bmm_out, out, self, mat2, 3);
}
int etm_fb_addmm_out(void* out, void* self, void* mat1, void* mat2, double beta, double alpha) {
  return etm_scaled_product(etm_lt_addmm_out, out, self, mat1, mat2, beta, alpha, 2);
}
int etm_fb_baddbmm_out(void* out, void* self, void* b1, void* b2, double beta, double alpha) {
  return etm_scaled_product(etm_lt_baddbmm_out, out, self, b1, b2, beta, alpha, 3);
}

}  // extern "C"
