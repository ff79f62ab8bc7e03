// The custom operators' shims (shims/custom_op_shims.py) served in C on the host and on
// the emulated Metal device: torchao's int4 linear, upstream's metal::gather_qmv and
// metal::gated_delta_rule. Its own translation unit of the bridge (native_custom_ops.py
// explains the design); each entry takes the c10 device type it serves (0 or 13).
//
// The Python shims are the reference and these are bit for bit theirs, so each follows
// its reference op by op: every product and every sum is rounded where the reference's
// separate ATen kernels round it (the bridge builds for the baseline instruction set, so
// no fused multiply-add merges them), a matrix-vector product is libtorch's own
// (aoti_torch_cpu_addmv, what Tensor.mv runs), and a sum over the last dimension is
// ATen's cascade sum for float32, replayed in etm_cop_row_sum. Only float32 operands in
// the layouts the reference's kernels would see are served; anything else (and every
// argument the shim would refuse) goes on to Python, which computes it or names what is
// wrong.
#include <cstdint>
#include <cstring>
#include <vector>

#include "native_fallbacks.h"

extern "C" {
#include "int4_linear.c"
}

extern "C" {

// libtorch's aoti_torch_cpu_addmv (self, mat, vec, beta, alpha, ret0): Python checks the
// signature against torch's headers and fills the slot (native_fallbacks.bind)
typedef int32_t (*etm_lt_addmv_fn)(void*, void*, void*, double, double, void**);
static etm_lt_addmv_fn etm_lt_addmv = nullptr;
ETM_LT_TABLE(etm_lt_cop_table, etm_lt_cop_count,
             ETM_LT("aoti_torch_cpu_addmv", "int32_t(void*, void*, void*, double, double, void*)",
                    etm_lt_addmv));

// Python writes these when the bridge loads (native_custom_ops.configure); 0: not served.
// The int4 linear: up to etm_int4_dot_rows rows of A the dot-product kernel, above it a
// float32 matmul over tiles of etm_int4_tile_bytes (int4_kernel.DOT_ROWS, TILE_BYTES).
// etm_sum_lanes: the float32 lanes of the Vectorized<float> ATen's sum kernel runs with
// on this CPU (the kernel it dispatches to, which is not always the widest)
ETM_EXPORT int64_t etm_int4_dot_rows = 0, etm_int4_tile_bytes = 0, etm_sum_lanes = 0;

}  // extern "C"

namespace {

const int32_t kF32 = 6, kU8 = 0, kI32 = 3, kI64 = 4;  // c10 dtype codes
const int kMaxLanes = 16;

float etm_f32_at(const etm_rec* r, const int64_t* index) {
  int64_t at = 0;
  for (int64_t d = 0; d < r->dim; d++) at += index[d] * r->strides[d];
  return ((const float*)(intptr_t)r->data_ptr)[at];
}

bool etm_dense(const etm_rec* r) {
  int64_t expected = 1;
  for (int64_t d = r->dim - 1; d >= 0; d--) {
    if (r->sizes[d] != 1 && r->strides[d] != expected) return false;
    expected *= r->sizes[d];
  }
  return true;
}

const etm_rec* etm_f32(void* h, int64_t dim) {
  const etm_rec* r = etm_host_rec(h);
  return r && r->dtype == kF32 && r->dim == dim ? r : nullptr;
}

}  // namespace

// ATen's sum of n contiguous floats (cascade_sum's contiguous inner reduction with
// `lanes`-wide vectors, n >= lanes): vectors of lanes floats summed four at a time with
// the cascade of multi_row_sum, the leftover floats, then the lanes, onto the output's 0.
// Exported: Python finds the lanes by comparing it with torch.sum (configure)
extern "C" ETM_EXPORT float etm_cop_row_sum(const float* x, int64_t n, int lanes) {
  const int64_t vecs = n / lanes, rows = vecs / 4;
  int64_t power = 4, bits = 0;
  if (rows > 2)
    for (uint64_t v = (uint64_t)(rows - 1); v; v >>= 1) bits++;  // CeilLog2(rows)
  else
    bits = 1;
  if (bits / 4 > power) power = bits / 4;
  const int64_t step = (int64_t)1 << power, mask = step - 1;
  float acc[4][4][kMaxLanes] = {};  // levels x the 4 interleaved rows x lanes
  auto add_row = [&](int64_t i) {
    for (int k = 0; k < 4; k++)
      for (int l = 0; l < lanes; l++) acc[0][k][l] += x[(i * 4 + k) * lanes + l];
  };
  int64_t i = 0;
  while (i + step <= rows) {
    for (int64_t j = 0; j < step; j++, i++) add_row(i);
    for (int j = 1; j < 4; j++) {
      for (int k = 0; k < 4; k++)
        for (int l = 0; l < lanes; l++) {
          acc[j][k][l] += acc[j - 1][k][l];
          acc[j - 1][k][l] = 0.0f;
        }
      if ((i & (mask << (j * power))) != 0) break;
    }
  }
  for (; i < rows; i++) add_row(i);
  for (int j = 1; j < 4; j++)
    for (int k = 0; k < 4; k++)
      for (int l = 0; l < lanes; l++) acc[0][k][l] += acc[j][k][l];
  float* part = acc[0][0];  // row_sum: the vectors past the interleaved rows, then the rows
  for (int64_t v = rows * 4; v < vecs; v++)
    for (int l = 0; l < lanes; l++) part[l] += x[v * lanes + l];
  for (int k = 1; k < 4; k++)
    for (int l = 0; l < lanes; l++) part[l] += acc[0][k][l];
  float total = 0.0f;
  for (int64_t t = vecs * lanes; t < n; t++) total += x[t];
  for (int l = 0; l < lanes; l++) total += part[l];
  float out = 0.0f;  // the output was filled with 0 and the sum is added to it
  out += total;
  return out;
}

namespace {

// a new contiguous float32 tensor on the call's device, or NULL
etm_rec* etm_new_f32(int32_t device, int64_t dim, const int64_t* sizes) {
  void* h = nullptr;
  return etm_native_empty(dim, sizes, nullptr, kF32, device, 0, &h) ? (etm_rec*)h : nullptr;
}

// many rows: what int4_kernel.linear_4bit does, tile by tile: dequantize `rows` weight
// rows, multiply A by their transpose with libtorch's mm (etm_fb_mm_out, as torch.mm) and
// copy the tile into its columns of out. false with nothing left behind on any failure
bool etm_int4_tiles(int32_t device, void* a, const etm_rec* ra, const etm_rec* rb,
                    const etm_rec* rs, const etm_rec* rz, int64_t group_size, int64_t ld_sz,
                    etm_rec* out) {
  int64_t m = ra->sizes[0], k = ra->sizes[1], n = rb->sizes[0];
  int64_t per_row = 4 * k > 1 ? 4 * k : 1, rows = etm_int4_tile_bytes / per_row;
  rows = rows > n ? n : rows;  // as Python: max(1, min(n, TILE_BYTES // (4 K)))
  rows = rows < 1 ? 1 : rows;
  int64_t wsizes[2] = {rows, k};
  etm_rec* w = etm_new_f32(device, 2, wsizes);
  if (!w) return false;
  bool ok = true;
  float* dst = (float*)(intptr_t)out->data_ptr;
  for (int64_t row0 = 0; row0 < n && ok; row0 += rows) {
    int64_t count = n - row0 < rows ? n - row0 : rows;
    int64_t tsizes[2] = {k, count}, tstrides[2] = {1, k}, osizes[2] = {m, count};
    void *wt = nullptr, *tile = nullptr;
    ok = etm_int4_dequantize_rows((const uint8_t*)(intptr_t)rb->data_ptr,
                                  (const float*)(intptr_t)rs->data_ptr,
                                  (const float*)(intptr_t)rz->data_ptr, row0, count, k,
                                  group_size, ld_sz, (float*)(intptr_t)w->data_ptr) == 0 &&
         etm_native_view(w, 2, tsizes, tstrides, 0, &wt) &&
         (tile = etm_new_f32(device, 2, osizes)) != nullptr && etm_fb_mm_out(tile, a, wt);
    if (ok) {
      const float* src = (const float*)(intptr_t)etm_rec_of(tile)->data_ptr;
      for (int64_t i = 0; i < m; i++)
        std::memcpy(dst + i * n + row0, src + i * count, (size_t)count * sizeof(float));
    }
    if (wt) etm_native_delete((etm_rec*)wt);
    if (tile) etm_native_delete((etm_rec*)tile);
  }
  etm_native_delete(w);
  return ok;
}

// a record of dtype code and dim 2, dense row-major (its rows may be longer than used)
const etm_rec* etm_rows(void* h, int32_t dtype, int64_t* row_stride) {
  const etm_rec* r = etm_host_rec(h);
  if (!r || r->dtype != dtype || r->dim != 2 || r->strides[1] != 1 ||
      r->strides[0] < r->sizes[1])
    return nullptr;
  *row_stride = r->strides[0];
  return r;
}

}  // namespace

extern "C" {

// _linear_fp_act_4bit_weight for float32 A: the kernels the Python shim calls
// (int4_kernel.linear_4bit) on the records' memory, into a new tensor of the device. Only
// calls torchao's kernel accepts (lowbit.check_linear_args) are served
int etm_cop_int4_linear(int32_t device, void* a, void* b, int64_t group_size, void* s, void* z,
                        void* ret) {
  etm_fb_scope scope(device);
  int64_t lda = 0, ldb = 0, lds = 0, ldz = 0;
  if (!scope.on() || !ret || !etm_int4_dot_rows) return 0;
  const etm_rec *ra = etm_rows(a, kF32, &lda), *rb = etm_rows(b, kU8, &ldb);
  const etm_rec *rs = etm_rows(s, kF32, &lds), *rz = etm_rows(z, kF32, &ldz);
  if (!ra || !rb || !rs || !rz || lda != ra->sizes[1] || ldb != rb->sizes[1]) return 0;
  int64_t m = ra->sizes[0], k = ra->sizes[1], n = rb->sizes[0];
  if (k % 8 || rb->sizes[1] != k / 2) return 0;
  if (group_size != 32 && group_size != 64 && group_size != 128 && group_size != 256) return 0;
  if (n % 4 && m != 1) return 0;
  int64_t groups = (k + group_size - 1) / group_size;
  if (rs->sizes[0] != n || rz->sizes[0] != n || rs->sizes[1] < groups || rz->sizes[1] < groups ||
      lds != ldz)
    return 0;
  int64_t sizes[2] = {m, n};
  etm_rec* out = etm_new_f32(device, 2, sizes);
  if (!out) return 0;
  bool ok = m > etm_int4_dot_rows
                ? etm_int4_tiles(device, a, ra, rb, rs, rz, group_size, lds, out)
                : etm_int4_linear_f32((const float*)(intptr_t)ra->data_ptr,
                                      (const uint8_t*)(intptr_t)rb->data_ptr,
                                      (const float*)(intptr_t)rs->data_ptr,
                                      (const float*)(intptr_t)rz->data_ptr, m, k, n, group_size,
                                      lds, (float*)(intptr_t)out->data_ptr) == 0;
  if (!ok) {
    etm_native_delete(out);
    return 0;
  }
  *(void**)ret = out;
  return 1;
}

// metal::gather_qmv: y[i] = dequantize(W[e_i]) @ x[i] as ExecuTorch's reference computes
// it: the expert's [N, K] weights as q * s + b in float32, then libtorch's mv of them and
// row i of x (lent with x's strides)
int etm_cop_gather_qmv(int32_t device, void* x, void* w, void* s, void* z, void* idx,
                       int64_t group_size, void* ret) {
  etm_fb_scope scope(device);
  if (!scope.on() || !ret || !etm_lt_addmv || !etm_can_adopt()) return 0;
  const etm_rec *rx = etm_f32(x, 2), *rs = etm_f32(s, 3), *rz = etm_f32(z, 3);
  const etm_rec *rw = etm_host_rec(w), *ri = etm_host_rec(idx);
  if (!rx || !rs || !rz || !rw || !ri || rw->dtype != kU8 || rw->dim != 3 || !etm_dense(rw) ||
      ri->dim != 1 || (ri->dtype != kI32 && ri->dtype != kI64))
    return 0;
  int64_t p = rx->sizes[0], k = rx->sizes[1], e = rw->sizes[0], n = rw->sizes[1];
  if (rw->sizes[2] * 2 != k || group_size <= 0 || k % group_size || ri->sizes[0] != p)
    return 0;
  for (const etm_rec* t : {rs, rz})
    if (t->sizes[0] != e || t->sizes[1] != n || t->sizes[2] != k / group_size) return 0;
  std::vector<int64_t> experts((size_t)p);
  for (int64_t i = 0; i < p; i++) {
    const char* at =
        (const char*)(intptr_t)ri->data_ptr + i * ri->strides[0] * etm_itemsize[ri->dtype];
    experts[i] = ri->dtype == kI32 ? *(const int32_t*)at : *(const int64_t*)at;
    if (experts[i] < 0 || experts[i] >= e) return 0;  // Python names the bad index
  }
  int64_t ysizes[2] = {p, n}, wsizes[2] = {n, k};
  etm_rec* y = etm_new_f32(device, 2, ysizes);
  etm_rec* wt = y ? etm_new_f32(device, 2, wsizes) : nullptr;
  bool ok = wt != nullptr;
  float* wd = ok ? (float*)(intptr_t)wt->data_ptr : nullptr;
  const uint8_t* packed = (const uint8_t*)(intptr_t)rw->data_ptr;
  for (int64_t i = 0, have = -1; i < p && ok; i++) {
    if (experts[i] != have) {  // dequantize this row's expert (the reference, every row)
      have = experts[i];
      for (int64_t r = 0; r < n; r++)
        for (int64_t c = 0; c < k; c++) {
          uint8_t byte = packed[(have * n + r) * (k / 2) + c / 2];
          int64_t at[3] = {have, r, c / group_size};
          float q = (float)(c % 2 ? (byte >> 4) & 0x0F : byte & 0x0F);
          float scaled = q * etm_f32_at(rs, at);
          wd[r * k + c] = scaled + etm_f32_at(rz, at);
        }
    }
    etm_rec row = *rx;  // x[i]: a 1-d view of x's row
    row.dim = 1;
    row.data_ptr = rx->data_ptr + i * rx->strides[0] * 4;
    row.sizes[0] = k;
    row.strides[0] = rx->strides[1];
    etm_rec yrow = *y;
    yrow.dim = 1;
    yrow.data_ptr = y->data_ptr + i * n * 4;
    yrow.sizes[0] = n;
    yrow.strides[0] = 1;
    const etm_rec* recs[3] = {&yrow, wt, &row};
    void* t[3];
    void* mv = nullptr;
    ok = etm_lend(recs, 3, t);
    if (!ok) break;
    // beta 0: self (y's row) only gives the shape, as mv's own addmv call
    ok = etm_lt_addmv(t[0], t[1], t[2], 0.0, 1.0, &mv) == 0;
    etm_unlend(t, 3);
    void* data = ok ? etm_lt_data(mv) : nullptr;
    ok = data != nullptr;
    if (ok) std::memcpy((void*)(intptr_t)yrow.data_ptr, data, (size_t)n * sizeof(float));
    if (mv) etm_foreign_release(mv);
  }
  if (wt) etm_native_delete(wt);
  if (!ok) {
    if (y) etm_native_delete(y);
    return 0;
  }
  *(void**)ret = y;
  return 1;
}

// metal::gated_delta_rule: ExecuTorch's recurrence over T steps, each step as its
// reference computes it (decay, what the state recalls for k, the delta update, the read
// for q), the sums over Dk with ATen's cascade; the final state goes back into StateIn
int etm_cop_gated_delta_rule(int32_t device, void* q, void* k, void* v, void* g, void* beta,
                             void* state, void* ret) {
  etm_fb_scope scope(device);
  const int lanes = (int)etm_sum_lanes;
  if (!scope.on() || !ret || lanes < 1 || lanes > kMaxLanes) return 0;
  const etm_rec *rq = etm_f32(q, 4), *rk = etm_f32(k, 4), *rv = etm_f32(v, 4);
  const etm_rec *rg = etm_f32(g, 3), *rb = etm_f32(beta, 3), *rst = etm_f32(state, 4);
  // a contiguous state keeps every product the reference sums contiguous along Dk
  if (!rq || !rk || !rv || !rg || !rb || !rst || !etm_dense(rst)) return 0;
  int64_t bsz = rq->sizes[0], steps = rq->sizes[1], hk = rq->sizes[2], dk = rq->sizes[3];
  int64_t hv = rv->sizes[2], dv = rv->sizes[3];
  if (std::memcmp(rk->sizes, rq->sizes, 4 * sizeof(int64_t)) || rv->sizes[0] != bsz ||
      rv->sizes[1] != steps || hk <= 0 || hv % hk || dk < lanes)
    return 0;
  for (const etm_rec* t : {rg, rb})
    if (t->sizes[0] != bsz || t->sizes[1] != steps || t->sizes[2] != hv) return 0;
  if (rst->sizes[0] != bsz || rst->sizes[1] != hv || rst->sizes[2] != dv || rst->sizes[3] != dk)
    return 0;
  int64_t ysizes[4] = {bsz, steps, hv, dv};
  etm_rec* y = etm_new_f32(device, 4, ysizes);
  if (!y) return 0;
  float* yd = (float*)(intptr_t)y->data_ptr;
  float* sd = (float*)(intptr_t)rst->data_ptr;
  std::vector<float> s(sd, sd + bsz * hv * dv * dk), tmp((size_t)dk), qt((size_t)dk),
      kt((size_t)dk), delta((size_t)dv);
  const int64_t rep = hv / hk;
  for (int64_t t = 0; t < steps; t++)
    for (int64_t b = 0; b < bsz; b++)
      for (int64_t h = 0; h < hv; h++) {
        for (int64_t j = 0; j < dk; j++) {  // q_t, k_t of this value head's key head
          int64_t at[4] = {b, t, h / rep, j};
          qt[j] = etm_f32_at(rq, at);
          kt[j] = etm_f32_at(rk, at);
        }
        int64_t gate_at[3] = {b, t, h};
        float gate = etm_f32_at(rg, gate_at), upd = etm_f32_at(rb, gate_at);
        float* st = &s[(size_t)((b * hv + h) * dv * dk)];
        for (int64_t i = 0; i < dv * dk; i++) st[i] = st[i] * gate;
        for (int64_t i = 0; i < dv; i++) {
          for (int64_t j = 0; j < dk; j++) tmp[j] = st[i * dk + j] * kt[j];
          float mem = etm_cop_row_sum(tmp.data(), dk, lanes);
          int64_t vat[4] = {b, t, h, i};
          float diff = etm_f32_at(rv, vat) - mem;
          delta[i] = diff * upd;
        }
        for (int64_t i = 0; i < dv; i++)
          for (int64_t j = 0; j < dk; j++) {
            float prod = kt[j] * delta[i];
            st[i * dk + j] = st[i * dk + j] + prod;
          }
        for (int64_t i = 0; i < dv; i++) {
          for (int64_t j = 0; j < dk; j++) tmp[j] = st[i * dk + j] * qt[j];
          yd[((b * steps + t) * hv + h) * dv + i] = etm_cop_row_sum(tmp.data(), dk, lanes);
        }
      }
  std::memcpy(sd, s.data(), s.size() * sizeof(float));
  *(void**)ret = y;
  return 1;
}

}  // extern "C"
