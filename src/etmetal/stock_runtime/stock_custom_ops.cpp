// The custom operators' shims served in C for the stock runtime, where no Python shim can
// serve them: torchao's int4 linear and upstream's metal::gather_qmv and
// metal::gated_delta_rule, with the numerics of their references (shims/custom_op_shims.py:
// dequantize q * s + z by group, shims/int4_linear.c computes the products; the
// recurrence of ExecuTorch's gated_delta_rule, in float32). float32 operands only: any
// other dtype is left to the (unbound) Python half, which fails with the shim's name.
// Each returns 0 (served), 1 (bad arguments: the message is in etm_check_message) or -1
// (not served here).
#include "stock_custom_ops.h"

#include <cstdio>
#include <cstring>
#include <vector>

// shims/int4_linear.c is compiled once, into the bridge (inside shims/native_custom_ops.cpp,
// the custom operators' native unit); its functions, as it defines them
#define ETM_INT4_MAX_GROUP 256 /* int4_linear.c's: torchao's largest group size */
extern "C" {
int etm_int4_max_group(void);
int etm_int4_linear_f32(const float* a, const uint8_t* packed, const float* s, const float* z,
                        int64_t m, int64_t k, int64_t n, int64_t group_size, int64_t ld_sz,
                        float* out);
int etm_int4_dequantize_rows(const uint8_t* packed, const float* s, const float* z, int64_t row0,
                             int64_t rows, int64_t k, int64_t group_size, int64_t ld_sz,
                             float* out);
}

namespace {

const int32_t kFloat = 6, kByte = 0;  // c10 codes of float32, uint8
// the device the operator's tensors are on: 0, or 13 while an emulated-Metal delegate calls
// the aoti_torch_mps_ form (its memory is host memory, the computation the same)
int32_t op_device = 0;

int bad(const char* op, const char* message) {
  std::snprintf(etm_check_message, sizeof(etm_check_message), "%s: %s", op, message);
  return 1;
}

const etm_rec* host(void* h, int32_t dtype, int64_t dim) {
  const etm_rec* r = etm_rec_of(h);
  return r && r->device_type == op_device && r->dtype == dtype && r->dim == dim ? r : nullptr;
}

// the float32 elements of r in row-major order of its sizes (any strides)
std::vector<float> packed_floats(const etm_rec* r) {
  std::vector<float> out((size_t)(r->numel > 0 ? r->numel : 0));
  const float* base = (const float*)(intptr_t)r->data_ptr;
  int64_t index[ETM_MAX_DIMS] = {0}, off = 0;
  for (size_t k = 0; k < out.size(); k++) {
    out[k] = base[off];
    for (int64_t d = r->dim - 1; d >= 0; d--) {
      off += r->strides[d];
      if (++index[d] < r->sizes[d]) break;
      off -= r->strides[d] * r->sizes[d];
      index[d] = 0;
    }
  }
  return out;
}

bool dense(const etm_rec* r) {
  int64_t expected = 1;
  for (int64_t d = r->dim - 1; d >= 0; d--) {
    if (r->sizes[d] != 1 && r->strides[d] != expected) return false;
    expected *= r->sizes[d];
  }
  return true;
}

bool group_ok(int64_t g) { return g == 32 || g == 64 || g == 128 || g == 256; }

// a new contiguous float32 tensor of sizes (a native record)
bool new_floats(int64_t dim, const int64_t* sizes, void** ret) {
  return etm_native_empty(dim, sizes, nullptr, kFloat, op_device, 0, ret) != 0;
}

}  // namespace

extern "C" int etm_stock_int4_linear(void* a, void* b, int64_t group_size, void* s, void* z,
                                     void** ret) {
  const char* op = "_linear_fp_act_4bit_weight";
  const etm_rec *ra = host(a, kFloat, 2), *rb = host(b, kByte, 2);
  const etm_rec *rs = host(s, kFloat, 2), *rz = host(z, kFloat, 2);
  if (!ra || !rb || !rs || !rz || !ret || !dense(rb)) return -1;
  int64_t m = ra->sizes[0], k = ra->sizes[1], n = rb->sizes[0], groups;
  if (k % 8 || rb->sizes[1] != k / 2) return bad(op, "B's row bytes do not pack K (a multiple of 8)");
  if (!group_ok(group_size)) return bad(op, "group_size must be one of 32, 64, 128, 256");
  if (n % 4 && m != 1) return bad(op, "N must be a multiple of 4 when M is not 1");
  groups = (k + group_size - 1) / group_size;
  for (const etm_rec* t : {rs, rz})
    if (t->sizes[0] != n || t->sizes[1] < groups)
      return bad(op, "S and Z must be [N, ceil(K / group_size)]");
  std::vector<float> av = packed_floats(ra), sv = packed_floats(rs), zv = packed_floats(rz);
  int64_t sizes[2] = {m, n};
  if (!new_floats(2, sizes, ret)) return -1;
  etm_rec* out = (etm_rec*)*ret;
  if (etm_int4_linear_f32(av.data(), (const uint8_t*)(intptr_t)rb->data_ptr, sv.data(),
                          zv.data(), m, k, n, group_size, rs->sizes[1],
                          (float*)(intptr_t)out->data_ptr) != 0) {
    etm_native_delete(out);
    *ret = nullptr;
    return bad(op, "the kernel rejected the shapes or could not allocate");
  }
  return 0;
}

extern "C" int etm_stock_gather_qmv(void* x, void* w, void* s, void* z, void* idx,
                                    int64_t group_size, void** ret) {
  const char* op = "metal::gather_qmv";
  const etm_rec *rx = host(x, kFloat, 2), *rw = host(w, kByte, 3);
  const etm_rec *rs = host(s, kFloat, 3), *rz = host(z, kFloat, 3), *ri = etm_rec_of(idx);
  if (!rx || !rw || !rs || !rz || !ri || !ret || !dense(rw) || ri->dim != 1 ||
      (ri->dtype != 3 && ri->dtype != 4))  // int32 or int64 indices
    return -1;
  int64_t p = rx->sizes[0], k = rx->sizes[1], e = rw->sizes[0], n = rw->sizes[1];
  if (rw->sizes[2] * 2 != k || k % 8) return bad(op, "W does not pack X's K (a multiple of 8)");
  if (group_size <= 0 || group_size % 8 || k % group_size || group_size > ETM_INT4_MAX_GROUP)
    return bad(op, "group_size must divide K");
  int64_t groups = k / group_size;
  for (const etm_rec* t : {rs, rz})
    if (t->sizes[0] != e || t->sizes[1] != n || t->sizes[2] != groups)
      return bad(op, "S and Z must be [E, N, K / group_size]");
  if (ri->sizes[0] != p) return bad(op, "ExpertIndices must have one index per row of X");
  std::vector<float> xv = packed_floats(rx), sv = packed_floats(rs), zv = packed_floats(rz);
  std::vector<int64_t> experts((size_t)p);
  for (int64_t i = 0; i < p; i++) {
    const char* at = (const char*)(intptr_t)ri->data_ptr + i * ri->strides[0] * etm_itemsize[ri->dtype];
    experts[i] = ri->dtype == 3 ? *(const int32_t*)at : *(const int64_t*)at;
    if (experts[i] < 0 || experts[i] >= e) return bad(op, "expert index out of range");
  }
  int64_t sizes[2] = {p, n};
  if (!new_floats(2, sizes, ret)) return -1;
  etm_rec* out = (etm_rec*)*ret;
  const uint8_t* wbase = (const uint8_t*)(intptr_t)rw->data_ptr;
  for (int64_t i = 0; i < p; i++) {
    int64_t ex = experts[i];
    if (etm_int4_linear_f32(xv.data() + i * k, wbase + ex * n * (k / 2), sv.data() + ex * n * groups,
                            zv.data() + ex * n * groups, 1, k, n, group_size, groups,
                            (float*)(intptr_t)out->data_ptr + i * n) != 0) {
      etm_native_delete(out);
      *ret = nullptr;
      return bad(op, "the kernel rejected the shapes or could not allocate");
    }
  }
  return 0;
}

extern "C" int etm_stock_gated_delta_rule(void* q, void* k, void* v, void* g, void* beta,
                                          void* state, void** ret) {
  const char* op = "metal::gated_delta_rule";
  const etm_rec *rq = host(q, kFloat, 4), *rk = host(k, kFloat, 4), *rv = host(v, kFloat, 4);
  const etm_rec *rg = host(g, kFloat, 3), *rb = host(beta, kFloat, 3);
  const etm_rec* rst = host(state, kFloat, 4);
  if (!rq || !rk || !rv || !rg || !rb || !rst || !ret) return -1;
  int64_t bsz = rq->sizes[0], steps = rq->sizes[1], hk = rq->sizes[2], dk = rq->sizes[3];
  int64_t hv = rv->sizes[2], dv = rv->sizes[3];
  if (std::memcmp(rk->sizes, rq->sizes, 4 * sizeof(int64_t)))
    return bad(op, "Q and K must be [B, T, Hk, Dk]");
  if (rv->sizes[0] != bsz || rv->sizes[1] != steps) return bad(op, "V must be [B, T, Hv, Dv]");
  if (hk <= 0 || hv % hk) return bad(op, "value heads must be a multiple of key heads");
  for (const etm_rec* t : {rg, rb})
    if (t->sizes[0] != bsz || t->sizes[1] != steps || t->sizes[2] != hv)
      return bad(op, "G and Beta must be [B, T, Hv]");
  if (rst->sizes[0] != bsz || rst->sizes[1] != hv || rst->sizes[2] != dv || rst->sizes[3] != dk)
    return bad(op, "StateIn must be [B, Hv, Dv, Dk]");
  std::vector<float> qv = packed_floats(rq), kv = packed_floats(rk), vv = packed_floats(rv);
  std::vector<float> gv = packed_floats(rg), bv = packed_floats(rb), sv = packed_floats(rst);
  int64_t sizes[4] = {bsz, steps, hv, dv};
  if (!new_floats(4, sizes, ret)) return -1;
  float* y = (float*)(intptr_t)((etm_rec*)*ret)->data_ptr;
  int64_t rep = hv / hk;
  std::vector<float> delta((size_t)dv);
  for (int64_t b = 0; b < bsz; b++)
    for (int64_t t = 0; t < steps; t++)
      for (int64_t h = 0; h < hv; h++) {
        const float* qt = &qv[((b * steps + t) * hk + h / rep) * dk];
        const float* kt = &kv[((b * steps + t) * hk + h / rep) * dk];
        const float* vt = &vv[((b * steps + t) * hv + h) * dv];
        float gate = gv[(b * steps + t) * hv + h], upd = bv[(b * steps + t) * hv + h];
        float* st = &sv[(b * hv + h) * dv * dk];
        for (int64_t i = 0; i < dv; i++) {  // decay, then what the state recalls for k
          float mem = 0.0f;
          for (int64_t j = 0; j < dk; j++) mem += (st[i * dk + j] *= gate) * kt[j];
          delta[i] = (vt[i] - mem) * upd;
        }
        for (int64_t i = 0; i < dv; i++) {  // write k's delta, then read q
          float out = 0.0f;
          for (int64_t j = 0; j < dk; j++) out += (st[i * dk + j] += kt[j] * delta[i]) * qt[j];
          y[((b * steps + t) * hv + h) * dv + i] = out;
        }
      }
  // the new state goes back through StateIn's own strides
  float* base = (float*)(intptr_t)rst->data_ptr;
  int64_t index[4] = {0}, off = 0;
  for (size_t e = 0; e < sv.size(); e++) {
    base[off] = sv[e];
    for (int64_t d = 3; d >= 0; d--) {
      off += rst->strides[d];
      if (++index[d] < rst->sizes[d]) break;
      off -= rst->strides[d] * rst->sizes[d];
      index[d] = 0;
    }
  }
  return 0;
}

// the emulated Metal device's forms of the same operators (aoti_torch_mps_gather_qmv, ...)
struct OnMps {
  OnMps() { op_device = ETM_DEVICE_MPS; }
  ~OnMps() { op_device = 0; }
};

extern "C" int etm_stock_mps_gather_qmv(void* x, void* w, void* s, void* z, void* idx,
                                        int64_t group_size, void** ret) {
  OnMps on;
  return etm_stock_gather_qmv(x, w, s, z, idx, group_size, ret);
}

extern "C" int etm_stock_mps_gated_delta_rule(void* q, void* k, void* v, void* g, void* beta,
                                              void* state, void** ret) {
  OnMps on;
  return etm_stock_gated_delta_rule(q, k, v, g, beta, state, ret);
}
