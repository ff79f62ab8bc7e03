// The emulated Metal device's fallbacks (aoti_torch_mps_*) served in C. Compiled into the
// bridge source, inside its extern "C" block, after mps_encoder.cpp and mps_buffers.cpp.
//
// mps memory is host memory, so an mps fallback is the host fallback on records that
// report device 13: each entry enters that device (etm_fb_enter, native_fallbacks.h) for
// the length of the call, runs the host path (libtorch's own aoti_torch_cpu_* over the
// records' memory) and the results it adopts report device 13 too. What the host has no
// path for is here: the math attention of macOS torch (through libtorch's dispatcher) and
// the layout check of the mps convolution (the custom operators are native_custom_ops.cpp's,
// for both devices). Anything not served goes on to Python's shim, which serves it or
// names what is wrong.

// libtorch's aoti_torch_call_dispatcher (c/shim.h): Python checks the signature against
// torch's headers and fills the slot (native_fallbacks.bind reads this table too)
typedef int32_t (*etm_lt_dispatch_fn)(const char*, const char*, uint64_t*);
static etm_lt_dispatch_fn etm_lt_call_dispatcher = nullptr;
ETM_LT_TABLE(etm_lt_mps_table, etm_lt_mps_count,
             ETM_LT("aoti_torch_call_dispatcher", "int32_t(void*, void*, void*)",
                    etm_lt_call_dispatcher));

// the layout class of a convolution operand: 0 contiguous, 1 channels-last (4-d, every
// stride exactly NHWC's), -1 anything else; contiguous or channels-last with one channel
// (size 1 along dim 1) is -1 too, since c10 could read it either way
static int etm_mps_layout(const etm_rec* r) {
  int64_t expected = 1;
  bool contiguous = true;
  for (int64_t d = r->dim - 1; d >= 0 && contiguous; d--) {
    if (r->sizes[d] != 1 && r->strides[d] != expected) contiguous = false;
    expected *= r->sizes[d];
  }
  if (r->dim < 4) return contiguous ? 0 : -1;
  if (r->dim != 4 || r->sizes[1] < 2) return -1;
  if (contiguous) return 0;
  const int64_t *n = r->sizes, *st = r->strides;
  bool nhwc = st[1] == 1 && st[3] == n[1] && st[2] == n[1] * n[3] && st[0] == n[1] * n[2] * n[3];
  return nhwc ? 1 : -1;
}

// the layout macOS torch's convolution rule gives an mps result, by the layout class of
// input (row) and weight (column): 0 contiguous, 1 channels-last, -1 unknown (Python's).
// Python fills it when the bridge loads, from the rule torch itself applies
// (bridge_source.attach), so both implementations agree
ETM_EXPORT int64_t etm_mps_conv_rule[4] = {-1, -1, -1, -1};

// one row of a strided copy: n items of type T from src (stride `step` items) to dst, packed
// (a macro, not a template: this file is compiled inside an extern "C" block)
#define ETM_MPS_COPY_ROW(NAME, T)                                                  \
  static void NAME(char* dst, const char* src, int64_t n, int64_t step) {          \
    T* out = (T*)dst;                                                              \
    const T* in = (const T*)src;                                                   \
    for (int64_t i = 0; i < n; i++) std::memcpy(out + i, in + i * step, sizeof(T)); \
  }
ETM_MPS_COPY_ROW(etm_mps_copy_row1, uint8_t)
ETM_MPS_COPY_ROW(etm_mps_copy_row2, uint16_t)
ETM_MPS_COPY_ROW(etm_mps_copy_row4, uint32_t)
ETM_MPS_COPY_ROW(etm_mps_copy_row8, uint64_t)
#undef ETM_MPS_COPY_ROW

// a packed contiguous copy of y on the emulated device (what Tensor.contiguous() gives, bit
// for bit); NULL when no native tensor can hold it. Row by row along the last dimension,
// the source offset carried from row to row: a per-element index walk cost the
// patch-embedding demo's conv result (6,144 floats) about 30 us, a quarter of its execute
static etm_rec* etm_mps_packed_copy(const etm_rec* y) {
  void* h = nullptr;
  if (!etm_native_empty(y->dim, y->sizes, nullptr, y->dtype, ETM_DEVICE_MPS, 0, &h)) return nullptr;
  etm_rec* out = (etm_rec*)h;
  int64_t item = etm_itemsize[y->dtype], index[ETM_MAX_DIMS] = {0};
  const char* src = (const char*)(intptr_t)y->data_ptr;
  char* dst = (char*)(intptr_t)out->data_ptr;
  if (y->numel == 0) return out;
  if (y->dim == 0) {
    std::memcpy(dst, src, (size_t)item);
    return out;
  }
  int64_t last = y->dim - 1, row = y->sizes[last], step = y->strides[last], at = 0;
  for (int64_t done = 0; done < y->numel; done += row, dst += row * item) {
    const char* from = src + at * item;
    switch (item) {
      case 1: etm_mps_copy_row1(dst, from, row, step); break;
      case 2: etm_mps_copy_row2(dst, from, row, step); break;
      case 4: etm_mps_copy_row4(dst, from, row, step); break;
      case 8: etm_mps_copy_row8(dst, from, row, step); break;
      default:
        for (int64_t i = 0; i < row; i++)
          std::memcpy(dst + i * item, from + i * step * item, (size_t)item);
    }
    // the next row: advance the outer index like an odometer, the offset with it
    for (int64_t d = last - 1; d >= 0; d--) {
      at += y->strides[d];
      if (++index[d] < y->sizes[d]) break;
      at -= index[d] * y->strides[d];
      index[d] = 0;
    }
  }
  return out;
}

// aoti_torch_mps_convolution: the result must have the layout Inductor compiled against,
// the one torch's mps rule picks (fallback_shims.convolution): the host kernel's result,
// made contiguous when the rule says so; a case the table does not know is Python's
int etm_mps_convolution(void* input, void* weight, void* bias, const int64_t* stride,
                        int64_t stride_len, const int64_t* padding, int64_t padding_len,
                        const int64_t* dilation, int64_t dilation_len, int32_t transposed,
                        const int64_t* output_padding, int64_t output_padding_len,
                        int64_t groups, void* ret0) {
  etm_fb_scope scope(ETM_DEVICE_MPS);
  if (!scope.on() || !ret0) return 0;
  const etm_rec *x = etm_host_rec(input), *w = etm_host_rec(weight);
  if (!x || !w || x->dim < 3 || x->dim > 4) return 0;
  int64_t target = 0;  // the rule for fewer than 4 dimensions: contiguous
  if (x->dim == 4) {
    int xl = etm_mps_layout(x), wl = etm_mps_layout(w);
    if (xl < 0 || wl < 0) return 0;
    target = etm_mps_conv_rule[xl * 2 + wl];
  }
  if (target < 0) return 0;
  if (!etm_fb_convolution(input, weight, bias, stride, stride_len, padding, padding_len, dilation,
                          dilation_len, transposed, output_padding, output_padding_len, groups,
                          ret0))
    return 0;
  etm_rec* y = etm_rec_of(*(void**)ret0);
  if (y && y->dim == x->dim && etm_mps_layout(y) == target) return 1;
  etm_rec* packed = y && target == 0 ? etm_mps_packed_copy(y) : nullptr;
  if (y) etm_native_delete(y);
  *(void**)ret0 = packed;
  // nothing made: Python's shim runs it (the op is pure, running it again is safe)
  return packed != nullptr;
}

static uint64_t etm_siv_double(double v) {
  uint64_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  return bits;
}

// aoti_torch_mps__scaled_dot_product_attention_math_for_mps(_v2): what macOS torch runs,
// aten::_scaled_dot_product_attention_math, called through libtorch's dispatcher with a
// stack of StableIValues (a tensor: a handle the call takes over; an optional: NULL or a
// new StableIValue the call deletes)
int etm_mps_sdpa_math(void* q, void* k, void* v, void* mask, double dropout_p, int32_t is_causal,
                      void* dropout_mask, void* scale, int32_t enable_gqa, void* ret0,
                      void* ret1) {
  etm_fb_scope scope(ETM_DEVICE_MPS);
  if (!scope.on() || !etm_lt_call_dispatcher || !etm_can_adopt() || !ret0 || !ret1 ||
      dropout_p != 0.0 || (dropout_mask && *(void**)dropout_mask))
    return 0;  // dropout is Python's to refuse
  void* t[4] = {nullptr, nullptr, nullptr, nullptr};
  int n = etm_lend_attention(q, k, v, mask, t);
  if (!n) return 0;
  const etm_rec *rq = etm_rec_of(q), *rk = etm_rec_of(k);
  // as Python's shim: the group factor also follows from the shapes
  bool gqa = enable_gqa || rq->sizes[1] != rk->sizes[1];
  uint64_t* mask_iv = n == 4 ? new uint64_t((uint64_t)(uintptr_t)t[3]) : nullptr;
  uint64_t* scale_iv = scale ? new uint64_t(etm_siv_double(*(const double*)scale)) : nullptr;
  uint64_t stack[9] = {
      (uint64_t)(uintptr_t)t[0], (uint64_t)(uintptr_t)t[1], (uint64_t)(uintptr_t)t[2],
      (uint64_t)(uintptr_t)mask_iv, etm_siv_double(0.0), (uint64_t)(is_causal != 0),
      0,  // dropout_mask: None
      (uint64_t)(uintptr_t)scale_iv, (uint64_t)gqa,
  };
  // the lent handles belong to the call now, even when it fails (a failure before they
  // were taken leaves a few wrapper objects, never the memory they wrap)
  if (etm_lt_call_dispatcher("aten::_scaled_dot_product_attention_math", "", stack) != 0)
    return 0;
  void* rets[2] = {(void*)(uintptr_t)stack[0], (void*)(uintptr_t)stack[1]};
  void* made[2];
  if (!etm_adopt_all(rets, 2, made)) return 0;
  *(void**)ret0 = made[0];
  *(void**)ret1 = made[1];
  return 1;
}
