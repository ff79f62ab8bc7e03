// Fallback ops served in C (shims/native_fallbacks.py explains the design): the libtorch
// functions they call, lending records to libtorch and adopting its results, and the
// fallbacks whose checks are written by hand. Its own translation unit, linked into the
// bridge next to native_tensors.cpp; the generated fallbacks are native_loans.cpp's.
#include "native_fallbacks.h"

#include <cstdint>

extern "C" {

ETM_EXPORT int64_t etm_native_fallbacks = 0;
extern int64_t etm_native_mps_limit;  // native_tensors.cpp

// the c10 device type the records of the call in progress must report, and its results
// report: 0 (host) unless a device's fallback entered its own (etm_fb_enter)
static thread_local int32_t etm_fb_device = 0;

int32_t etm_fb_enter(int32_t device) {
  if (!etm_native_fallbacks) return -1;
  if (device != 0 && (device != ETM_DEVICE_MPS || etm_native_mps_limit <= 0)) return -1;
  int32_t previous = etm_fb_device;
  etm_fb_device = device;
  return previous;
}
void etm_fb_leave(int32_t previous) { etm_fb_device = previous; }

// libtorch's functions, as the bridge calls them; Python checks each signature against
// torch's installed headers before it fills the slot (native_fallbacks.bind)
typedef int32_t (*etm_lt_from_blob_fn)(void*, int64_t, const int64_t*, const int64_t*, int64_t,
                                        int32_t, int32_t, int32_t, void**);
typedef int32_t (*etm_lt_get_ptr_fn)(void*, void**);
typedef int32_t (*etm_lt_get_i64_fn)(void*, int64_t*);
typedef int32_t (*etm_lt_get_i32_fn)(void*, int32_t*);
typedef int32_t (*etm_lt_sdpa_fn)(void*, void*, void*, double, int32_t, void*, void*, void*,
                                  void*);
typedef int32_t (*etm_lt_conv_fn)(void*, void*, void*, const int64_t*, int64_t, const int64_t*,
                                  int64_t, const int64_t*, int64_t, int32_t, const int64_t*,
                                  int64_t, int64_t, void*);
typedef int32_t (*etm_lt_mm_fn)(void*, void*, void*);
typedef int32_t (*etm_lt_addmm_fn)(void*, void*, void*, void*, double, double);
static etm_lt_from_blob_fn etm_lt_from_blob = nullptr;
// libtorch's aoti_torch_delete_tensor_object is etm_foreign_release (native_tensors.h)
#define etm_lt_delete etm_foreign_release
static etm_lt_get_ptr_fn etm_lt_data_ptr = nullptr;
static etm_lt_get_ptr_fn etm_lt_sizes = nullptr, etm_lt_strides = nullptr;
static etm_lt_get_i64_fn etm_lt_dim = nullptr, etm_lt_offset = nullptr;
static etm_lt_get_i64_fn etm_lt_storage_size = nullptr;
static etm_lt_get_i32_fn etm_lt_dtype = nullptr, etm_lt_device_type = nullptr;
static etm_lt_sdpa_fn etm_lt_sdpa_flash = nullptr;
static etm_lt_conv_fn etm_lt_convolution = nullptr;
typedef int32_t (*etm_lt_topk_fn)(void*, int64_t, int64_t, int32_t, int32_t, void*, void*);
static etm_lt_topk_fn etm_lt_topk = nullptr;
static etm_lt_mm_fn etm_lt_mm_out = nullptr, etm_lt_bmm_out = nullptr;
static etm_lt_addmm_fn etm_lt_addmm_out = nullptr, etm_lt_baddbmm_out = nullptr;

const etm_lt_entry etm_lt_table[] = {
    ETM_LT("aoti_torch_create_tensor_from_blob",
           "int32_t(void*, int64_t, void*, void*, int64_t, int32_t, int32_t, int32_t, void*)",
           etm_lt_from_blob),
    ETM_LT("aoti_torch_delete_tensor_object", "int32_t(void*)", etm_lt_delete),
    ETM_LT("aoti_torch_get_data_ptr", "int32_t(void*, void*)", etm_lt_data_ptr),
    ETM_LT("aoti_torch_get_sizes", "int32_t(void*, void*)", etm_lt_sizes),
    ETM_LT("aoti_torch_get_strides", "int32_t(void*, void*)", etm_lt_strides),
    ETM_LT("aoti_torch_get_dim", "int32_t(void*, void*)", etm_lt_dim),
    ETM_LT("aoti_torch_get_storage_offset", "int32_t(void*, void*)", etm_lt_offset),
    ETM_LT("aoti_torch_get_storage_size", "int32_t(void*, void*)", etm_lt_storage_size),
    ETM_LT("aoti_torch_get_dtype", "int32_t(void*, void*)", etm_lt_dtype),
    ETM_LT("aoti_torch_get_device_type", "int32_t(void*, void*)", etm_lt_device_type),
    ETM_LT("aoti_torch_cpu__scaled_dot_product_flash_attention_for_cpu",
           "int32_t(void*, void*, void*, double, int32_t, void*, void*, void*, void*)",
           etm_lt_sdpa_flash),
    ETM_LT("aoti_torch_cpu_convolution",
           "int32_t(void*, void*, void*, void*, int64_t, void*, int64_t, void*, int64_t, int32_t, "
           "void*, int64_t, int64_t, void*)",
           etm_lt_convolution),
    ETM_LT("aoti_torch_cpu_topk", "int32_t(void*, int64_t, int64_t, int32_t, int32_t, void*, void*)",
           etm_lt_topk),
    ETM_LT("aoti_torch_cpu_mm_out", "int32_t(void*, void*, void*)", etm_lt_mm_out),
    ETM_LT("aoti_torch_cpu_bmm_out", "int32_t(void*, void*, void*)", etm_lt_bmm_out),
    ETM_LT("aoti_torch_cpu_addmm_out", "int32_t(void*, void*, void*, void*, double, double)",
           etm_lt_addmm_out),
    ETM_LT("aoti_torch_cpu_baddbmm_out", "int32_t(void*, void*, void*, void*, double, double)",
           etm_lt_baddbmm_out),
};
const int64_t etm_lt_count = sizeof(etm_lt_table) / sizeof(etm_lt_table[0]);

// a record of the call's device (host unless etm_fb_enter said otherwise: both are host
// memory) with elements that libtorch can wrap; NULL otherwise (Python serves it)
const etm_rec* etm_host_rec(void* h) {
  const etm_rec* r = etm_rec_of(h);
  if (!r || r->device_type != etm_fb_device || r->dtype < 0 || r->dtype >= ETM_NDTYPES ||
      !etm_itemsize[r->dtype] || r->numel <= 0 || !r->data_ptr || r->dim < 0 ||
      r->dim > ETM_MAX_DIMS)
    return nullptr;
  return r;
}

// a dense block (some permutation of contiguous strides): ATen writes it in place
bool etm_packed(const etm_rec* r) {
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
bool etm_lend(const etm_rec* const* recs, int n, void** out) {
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
void etm_unlend(void** ts, int n) {
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

// ---- ops that return new tensors: libtorch's results adopted as native records ----

// the record of libtorch's new tensor t (no copy), which then owns t; false with t
// deleted when it cannot be described (the caller then undoes the whole call)
static bool etm_adopt(void* t, void** ret) {
  void* data = nullptr;
  int64_t *sizes = nullptr, *strides = nullptr, dim = 0, offset = 0, nbytes = 0;
  int32_t dtype = -1, device = -1;
  bool ok = etm_lt_data_ptr(t, &data) == 0 && etm_lt_sizes(t, (void**)&sizes) == 0 &&
            etm_lt_strides(t, (void**)&strides) == 0 && etm_lt_dim(t, &dim) == 0 &&
            etm_lt_offset(t, &offset) == 0 && etm_lt_storage_size(t, &nbytes) == 0 &&
            etm_lt_dtype(t, &dtype) == 0 && etm_lt_device_type(t, &device) == 0 &&
            device == 0 && dtype >= 0 && dtype < ETM_NDTYPES && etm_itemsize[dtype];
  // the storage's own data: the tensor's minus its offset
  char* base = ok ? (char*)data - offset * etm_itemsize[dtype] : nullptr;
  if (ok && etm_native_adopt_on(t, base, nbytes, dim, sizes, strides, offset, dtype,
                                etm_fb_device, ret))
    return true;
  etm_lt_delete(t);
  return false;
}

// adopt every result in rets (n of them, each libtorch's) into outs; all or nothing
bool etm_adopt_all(void** rets, int n, void** outs) {
  for (int i = 0; i < n; i++) {
    if (etm_adopt(rets[i], &outs[i])) continue;
    for (int j = 0; j < i; j++) etm_native_delete((etm_rec*)outs[j]);
    for (int j = i + 1; j < n; j++) etm_lt_delete(rets[j]);
    return false;
  }
  return true;
}

void* etm_lt_data(void* t) {
  void* data = nullptr;
  return t && etm_lt_data_ptr && etm_lt_data_ptr(t, &data) == 0 ? data : nullptr;
}

bool etm_can_adopt() {
  return etm_lt_delete && etm_lt_data_ptr && etm_lt_sizes && etm_lt_strides && etm_lt_dim &&
         etm_lt_offset && etm_lt_storage_size && etm_lt_dtype && etm_lt_device_type;
}

// an optional tensor argument (AtenTensorHandle*): absent, or a host record to lend
bool etm_optional(void* p, const etm_rec** rec) {
  void* h = p ? *(void**)p : nullptr;
  *rec = h ? etm_host_rec(h) : nullptr;
  return !h || *rec;
}

// an attention's operands lent to libtorch: q, k, v ([B, H, S, D] records of the call's
// device whose head and sequence sizes fit) and the optional mask in t; the count lent (3
// or 4), or 0 with nothing lent (Python's shim then names what is wrong)
int etm_lend_attention(void* q, void* k, void* v, void* mask, void** t) {
  const etm_rec* recs[4] = {etm_host_rec(q), etm_host_rec(k), etm_host_rec(v), nullptr};
  if (!recs[0] || !recs[1] || !recs[2] || !etm_optional(mask, &recs[3])) return 0;
  const etm_rec *rq = recs[0], *rk = recs[1], *rv = recs[2];
  if (rq->dim != 4 || rk->dim != 4 || rv->dim != 4 || rq->sizes[3] != rk->sizes[3] ||
      rk->sizes[2] != rv->sizes[2])
    return 0;
  int n = recs[3] ? 4 : 3;
  return etm_lend(recs, n, t) ? n : 0;
}

int etm_fb_sdpa_flash(void* q, void* k, void* v, double dropout_p, int32_t is_causal, void* mask,
                      void* scale, void* ret0, void* ret1) {
  if (!etm_native_fallbacks || !etm_lt_sdpa_flash || !etm_can_adopt() || !ret0 || !ret1 ||
      dropout_p != 0.0)
    return 0;
  void* t[4] = {nullptr, nullptr, nullptr, nullptr};
  int n = etm_lend_attention(q, k, v, mask, t);
  if (!n) return 0;
  void* outs[2] = {nullptr, nullptr};
  int32_t rc = etm_lt_sdpa_flash(t[0], t[1], t[2], 0.0, is_causal, n == 4 ? &t[3] : nullptr,
                                 scale, &outs[0], &outs[1]);
  etm_unlend(t, n);
  void* recs_out[2];
  if (rc != 0 || !etm_adopt_all(outs, 2, recs_out)) return 0;
  *(void**)ret0 = recs_out[0];
  *(void**)ret1 = recs_out[1];
  return 1;
}

int etm_fb_convolution(void* input, void* weight, void* bias, const int64_t* stride,
                       int64_t stride_len, const int64_t* padding, int64_t padding_len,
                       const int64_t* dilation, int64_t dilation_len, int32_t transposed,
                       const int64_t* output_padding, int64_t output_padding_len, int64_t groups,
                       void* ret0) {
  if (!etm_native_fallbacks || !etm_lt_convolution || !etm_can_adopt() || !ret0) return 0;
  const etm_rec* recs[3] = {etm_host_rec(input), etm_host_rec(weight), nullptr};
  if (!recs[0] || !recs[1] || !etm_optional(bias, &recs[2])) return 0;
  int n = recs[2] ? 3 : 2;
  void* t[3] = {nullptr, nullptr, nullptr};
  if (!etm_lend(recs, n, t)) return 0;
  void* out = nullptr;
  int32_t rc = etm_lt_convolution(t[0], t[1], n == 3 ? &t[2] : nullptr, stride, stride_len,
                                  padding, padding_len, dilation, dilation_len, transposed,
                                  output_padding, output_padding_len, groups, &out);
  etm_unlend(t, n);
  void* rec = nullptr;
  if (rc != 0 || !etm_adopt_all(&out, 1, &rec)) return 0;
  *(void**)ret0 = rec;
  return 1;
}

int etm_fb_topk(void* self, int64_t k, int64_t dim, int32_t largest, int32_t sorted, void* ret0,
                void* ret1) {
  if (!etm_native_fallbacks || !etm_lt_topk || !etm_can_adopt() || !ret0 || !ret1) return 0;
  const etm_rec* recs[1] = {etm_host_rec(self)};
  const etm_rec* r = recs[0];
  if (!r) return 0;
  int64_t size = 1;
  if (r->dim) {
    if (dim < -r->dim || dim >= r->dim) return 0;  // Python's shim names the bad dim
    size = r->sizes[dim < 0 ? dim + r->dim : dim];
  }
  if (k < 0 || k > size) return 0;
  void* t[1];
  if (!etm_lend(recs, 1, t)) return 0;
  void* outs[2] = {nullptr, nullptr};
  int32_t rc = etm_lt_topk(t[0], k, dim, largest, sorted, &outs[0], &outs[1]);
  etm_unlend(t, 1);
  void* made[2];
  if (rc != 0 || !etm_adopt_all(outs, 2, made)) return 0;
  *(void**)ret0 = made[0];
  *(void**)ret1 = made[1];
  return 1;
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
