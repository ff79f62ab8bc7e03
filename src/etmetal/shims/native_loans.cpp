// The generated fallbacks and tensor utilities (fallback_codegen.py, native_generated.inc)
// and what they call to lend a call's tensors to libtorch: a loan per call, ended after
// it, and the conditions the generated shims check. Its own translation unit of the
// bridge, on native_fallbacks.cpp's lending and adoption (native_fallbacks.h).
#include <cstdint>

#include "native_fallbacks.h"

extern "C" {

#define ETM_LOAN_MAX 64
// the libtorch tensors one call lent, and the records they are over
struct etm_loan {
  int n;
  const etm_rec* recs[ETM_LOAN_MAX];
  void* lent[ETM_LOAN_MAX];
};

static bool etm_loan_tensor(etm_loan* loan, void* h, void** t) {
  const etm_rec* r = etm_host_rec(h);
  if (!r || loan->n >= ETM_LOAN_MAX || !etm_lend(&r, 1, t)) return false;
  loan->recs[loan->n] = r;
  loan->lent[loan->n++] = *t;
  return true;
}
// p: AtenTensorHandle* (NULL or a NULL handle: None); *arg: what libtorch is passed
static bool etm_loan_optional(etm_loan* loan, void* p, void** t, void** arg) {
  void* h = p ? *(void**)p : nullptr;
  *arg = nullptr;
  if (!h) return true;
  if (!etm_loan_tensor(loan, h, t)) return false;
  *arg = t;
  return true;
}
[[maybe_unused]] static bool etm_loan_list(etm_loan* loan, void* hs, int64_t n, void** ts) {
  if (n < 0 || n > ETM_LOAN_MAX || (n && !hs)) return false;
  for (int64_t i = 0; i < n; i++)
    if (!etm_loan_tensor(loan, ((void* const*)hs)[i], &ts[i])) return false;
  return true;
}
[[maybe_unused]] static bool etm_loan_optional_list(etm_loan* loan, void* ps, int64_t n, void** ts,
                                                    void** args) {
  if (n < 0 || n > ETM_LOAN_MAX || (n && !ps)) return false;
  for (int64_t i = 0; i < n; i++)
    if (!etm_loan_optional(loan, ((void* const*)ps)[i], &ts[i], &args[i])) return false;
  return true;
}
static void etm_loan_end(etm_loan* loan) {
  etm_unlend(loan->lent, loan->n);
  loan->n = 0;
}

// bytes from a record's first element to past its last one (any stride signs)
static bool etm_within(const etm_rec* r, const char* p) {
  int64_t lo = 0, hi = 0;
  for (int64_t d = 0; d < r->dim; d++) {
    int64_t span = (r->sizes[d] - 1) * r->strides[d];
    (span < 0 ? lo : hi) += span;
  }
  const char* base = (const char*)(intptr_t)r->data_ptr;
  int64_t item = etm_itemsize[r->dtype];
  return p >= base + lo * item && p < base + (hi + 1) * item;
}
// the results share no memory with a lent record (a view of an input cannot be
// adopted as a storage of its own); false with every result deleted
static bool etm_loan_fresh(const etm_loan* loan, void** made, int n) {
  bool fresh = true;
  for (int i = 0; i < n && fresh; i++) {
    void* data = nullptr;
    if (!made[i] || !(data = etm_lt_data(made[i]))) fresh = false;
    for (int j = 0; j < loan->n && fresh && data; j++)
      if (etm_within(loan->recs[j], (const char*)data)) fresh = false;
  }
  if (!fresh)
    for (int i = 0; i < n; i++)
      if (made[i]) etm_foreign_release(made[i]);
  return fresh;
}

// the generated shims' conditions (fallback_codegen.UTILITIES)
static bool etm_same_geometry(void* a, void* b) {
  const etm_rec *x = etm_host_rec(a), *y = etm_host_rec(b);
  if (!x || !y || x->dtype != y->dtype || x->dim != y->dim) return false;
  for (int64_t d = 0; d < x->dim; d++)
    if (x->sizes[d] != y->sizes[d]) return false;
  return true;
}
static bool etm_rec_contiguous(void* h) {
  const etm_rec* r = etm_host_rec(h);
  if (!r) return false;
  int64_t expected = 1;
  for (int64_t d = r->dim - 1; d >= 0; d--) {
    if (r->sizes[d] != 1 && r->strides[d] != expected) return false;
    expected *= r->sizes[d];
  }
  return true;
}
static bool etm_rec_dense(void* h) {
  const etm_rec* r = etm_host_rec(h);
  return r && etm_packed(r);
}
[[maybe_unused]] static bool etm_dtype_known(int32_t code) {
  return code >= 0 && code < ETM_NDTYPES && etm_itemsize[code];
}
static int32_t etm_rec_dtype(void* h) {
  const etm_rec* r = etm_host_rec(h);
  return r ? r->dtype : -1;
}

// every other host fallback and the tensor utilities, generated from torch's headers
#include "native_generated.inc"

}  // extern "C"
