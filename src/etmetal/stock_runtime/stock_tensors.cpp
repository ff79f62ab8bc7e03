// The stock runtime's tensors as native records, and back: an input lent as a borrowed
// record (ET sizes and strides as int64; ET's ScalarType codes are c10's), an output copied
// from the record the container returned into its planned tensor, resized when dynamic.
#include "stock_tensors.h"

#include <executorch/runtime/core/exec_aten/util/tensor_util.h>

#include <climits>
#include <cstdio>
#include <cstring>

namespace et = executorch::runtime;
using executorch::aten::Tensor;

namespace etm_stock {

// copy_strided is the elementwise loop place_output ends with
static void copy_strided(const etm_rec* r, Tensor t);

std::string handle_hex(const void* p) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%p", p);
  return buf;
}

// value i as a record image (an input) or as the geometry etm_run copies into (an output)
bool describe_value(et::EValue* v, size_t i, etm_rec* image, etm_out* out, int64_t* dst,
                     std::string* error) {
  std::string what = std::string(image ? "input" : "output") + " (value " + std::to_string(i) + ")";
  if (!v || !v->isTensor()) return *error = what + " is not a tensor; the .so takes tensors only", false;
  Tensor t = v->toTensor();
  int32_t dtype = (int32_t)t.scalar_type();
  if (t.dim() > ETM_MAX_DIMS || dtype < 0 || dtype >= ETM_NDTYPES || !etm_itemsize[dtype])
    return *error = what + " has " + std::to_string(t.dim()) + " dimensions of dtype code " +
                    std::to_string(dtype) + ", which a native record cannot hold", false;
  int64_t* sizes = image ? image->sizes : out->sizes;
  int64_t* strides = image ? image->strides : out->strides;
  for (ssize_t d = 0; d < t.dim(); d++) {
    sizes[d] = t.size(d);
    strides[d] = t.strides()[d];
  }
  if (image) {
    image->live = 0;  // etm_run makes it a live borrowed record
    image->data_ptr = (int64_t)(intptr_t)t.const_data_ptr();
    image->dim = t.dim();
    image->offset = 0;
    image->numel = t.numel();
    image->dtype = dtype;
    image->device_type = 0;
    image->native = 2;
    image->storage_bytes = (int64_t)t.nbytes();
  } else {
    out->nbytes = (int64_t)t.nbytes();
    out->dim = t.dim();
    out->dtype = dtype;
    out->pad = 0;
    *dst = (int64_t)(intptr_t)t.mutable_data_ptr();
  }
  return true;
}

// copy output j's record into its planned tensor, resizing a dynamic output
bool place_output(size_t j, void* h, Tensor t, int32_t device, std::string* error) {
  const etm_rec* r = etm_rec_of(h);
  std::string what = "output " + std::to_string(j) + " (handle " + handle_hex(h) + ")";
  if (!r) return *error = what + " is not a live tensor", false;
  if (r->dtype != (int32_t)t.scalar_type() || r->device_type != device)
    return *error = what + " is dtype code " + std::to_string(r->dtype) + " on device type " +
                    std::to_string(r->device_type) + ", the program planned " +
                    std::to_string((int)t.scalar_type()) + " on " + std::to_string(device), false;
  bool same = r->dim == t.dim();
  for (int64_t d = 0; same && d < r->dim; d++) same = r->sizes[d] == t.size(d);
  if (!same) {
    executorch::aten::SizesType sizes[ETM_MAX_DIMS];
    bool fits = r->dim == t.dim();
    for (int64_t d = 0; fits && d < r->dim; d++) {
      fits = r->sizes[d] <= INT32_MAX;
      sizes[d] = (executorch::aten::SizesType)r->sizes[d];
    }
    if (!fits || et::resize_tensor(t, {sizes, (size_t)r->dim}) != et::Error::Ok) {
      std::string got;
      for (int64_t d = 0; d < r->dim; d++) got += (d ? ", " : "") + std::to_string(r->sizes[d]);
      return *error = what + " has sizes [" + got + "], which its planned tensor cannot take", false;
    }
  }
  copy_strided(r, t);
  return true;
}

static void copy_strided(const etm_rec* r, Tensor t) {
  int64_t item = etm_itemsize[r->dtype], n = r->numel, dim = r->dim;
  char* dst = (char*)t.mutable_data_ptr();
  const char* src = (const char*)(intptr_t)r->data_ptr;
  if (n <= 0) return;
  int64_t index[ETM_MAX_DIMS] = {0}, src_off = 0, dst_off = 0;
  for (int64_t k = 0; k < n; k++) {
    std::memcpy(dst + dst_off * item, src + src_off * item, (size_t)item);
    for (int64_t d = dim - 1; d >= 0; d--) {  // the next index, last dimension fastest
      src_off += r->strides[d];
      dst_off += t.strides()[d];
      if (++index[d] < r->sizes[d]) break;
      src_off -= r->strides[d] * r->sizes[d];
      dst_off -= (int64_t)t.strides()[d] * r->sizes[d];
      index[d] = 0;
    }
  }
}
}  // namespace etm_stock
