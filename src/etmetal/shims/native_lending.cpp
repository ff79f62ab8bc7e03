// Native records over storage that is not an allocation of ours: constants and shared
// weights lent as borrowed records (never freed), and the storages libtorch makes (a
// fallback's new tensors, a proxy call's results), adopted with the libtorch handle that
// keeps them alive. Part of the native tensors (native_tensors.cpp, native_records.h).
#include <cstring>

#include "native_records.h"

extern "C" {

// ---- constants and shared weights lent as native borrowed records ----
// 1 while create_tensor_from_blob and new_tensor_handle may be served here (the "native"
// implementation; Python sets it)
ETM_EXPORT int64_t etm_native_borrows = 0;
// while Python lends a model its shared constants, the aliases the container makes of them
// (new_tensor_handle, which it never deletes) are written here, so the model can delete
// them after its container: Python points it at an array of etm_alias_cap handles
ETM_EXPORT void** etm_alias_log = nullptr;
ETM_EXPORT int64_t etm_alias_cap = 0, etm_alias_len = 0;

int etm_native_borrow(void* data, int64_t ndim, const int64_t* sizes, const int64_t* strides,
                      int64_t offset, int32_t dtype, int32_t device_type, int32_t device_index,
                      void** ret) {
  if (!etm_native_borrows || !ret || !data || ndim < 0 || ndim > ETM_MAX_DIMS ||
      (ndim && !sizes) || offset < 0 ||
      !(device_type == 0 || (device_type == ETM_DEVICE_MPS && etm_native_mps_limit > 0)) ||
      (device_index != 0 && device_index != -1) || dtype < 0 || dtype >= ETM_NDTYPES ||
      !etm_itemsize[dtype])
    return 0;
  int64_t st[ETM_MAX_DIMS], numel, extent, acc = 1, end;
  for (int64_t d = ndim - 1; d >= 0; d--) {  // contiguous strides when none are given
    if (sizes[d] < 0) return 0;
    st[d] = strides ? strides[d] : acc;
    if (__builtin_mul_overflow(acc, sizes[d] > 1 ? sizes[d] : 1, &acc)) return 0;
  }
  int64_t item = etm_itemsize[dtype];
  if (!etm_geometry(ndim, sizes, st, &numel, &extent) || !extent ||
      __builtin_add_overflow(offset, extent, &end) || __builtin_mul_overflow(end, item, &end))
    return 0;  // no elements, or out of range: Python's shim serves or reports it
  etm_rec* r = etm_slot_take();
  if (!r) return 0;
  etm_fill(r, (char*)data, item, ndim, sizes, st, offset, numel, dtype, device_type, 2, end);
  etm_borrow_count(r, 1);
  *ret = r;
  return 1;
}

// another handle of the same native tensor (new_tensor_handle): counts like a view
int etm_native_alias(void* self, void** ret) {
  if (!ret) return 0;
  etm_rec* base = etm_rec_of(self);
  if (!base || !base->native || (etm_alias_log && etm_alias_len >= etm_alias_cap)) return 0;
  // outside a constant load, while the native implementation serves views (an alias of
  // a borrowed record counts as one more borrowed storage until it is deleted)
  if (!etm_native_borrows && !etm_native_views) return 0;
  etm_rec* r = etm_slot_take();
  if (!r) return 0;
  std::memcpy(r, base, sizeof(etm_rec));
  etm_native_live++;
  if (r->native == 2) etm_borrow_count(r, 1);
  else etm_block_of(r)->refs++;
  if (etm_alias_log) etm_alias_log[etm_alias_len++] = r;
  *ret = r;
  return 1;
}

// a borrowed record over [data, data + storage_bytes) for Python (a lent constant); NULL
// when none is free or the geometry is not served natively
ETM_EXPORT void* etm_native_lend(void* data, int64_t ndim, const int64_t* sizes,
                                 const int64_t* strides, int64_t offset, int32_t dtype,
                                 int64_t storage_bytes) {
  void* h = nullptr;
  int64_t on = etm_native_borrows;
  etm_native_borrows = 1;
  int ok = etm_native_borrow(data, ndim, sizes, strides, offset, dtype, 0, 0, &h);
  etm_native_borrows = on;
  if (!ok) return nullptr;
  etm_rec* r = (etm_rec*)h;
  if (storage_bytes < r->storage_bytes) { etm_native_delete(r); return nullptr; }
  r->storage_bytes = storage_bytes;  // the whole storage: views may reach all of it
  return h;
}

int etm_native_adopt(void* owner, void* data, int64_t storage_bytes, int64_t ndim,
                     const int64_t* sizes, const int64_t* strides, int64_t offset, int32_t dtype,
                     void** ret) {
  return etm_native_adopt_on(owner, data, storage_bytes, ndim, sizes, strides, offset, dtype, 0,
                             ret);
}

int etm_native_adopt_on(void* owner, void* data, int64_t storage_bytes, int64_t ndim,
                        const int64_t* sizes, const int64_t* strides, int64_t offset,
                        int32_t dtype, int32_t device, void** ret) {
  if (!owner || !data || !ret || storage_bytes <= 0 || ndim < 0 || ndim > ETM_MAX_DIMS ||
      (ndim && (!sizes || !strides)) || offset < 0 || dtype < 0 || dtype >= ETM_NDTYPES ||
      !etm_itemsize[dtype])
    return 0;
  int64_t item = etm_itemsize[dtype], numel, extent, end = 0;
  if (!etm_geometry(ndim, sizes, strides, &numel, &extent) ||
      (extent && (__builtin_add_overflow(offset, extent, &end) ||
                  __builtin_mul_overflow(end, item, &end))) ||
      end > storage_bytes)
    return 0;
  etm_foreign* f = etm_foreign_at(data);
  if (f && (f->counts.nbytes != storage_bytes || f->counts.device != device))
    return 0;  // cannot be the same storage
  etm_rec* r = etm_slot_take();
  if (!r) return 0;
  // first: sizes and strides may be the owner's own arrays
  etm_fill(r, (char*)data, item, ndim, sizes, strides, offset, numel, dtype, device, 3,
           storage_bytes);
  if (f) {  // another tensor of a storage already here: that one's owner keeps it alive
    f->counts.refs++;
    if (etm_foreign_release) etm_foreign_release(owner);
  } else {
    etm_foreign_add(data, new etm_foreign{{1, 0, storage_bytes, device, {0, 0, 0, 0}}, owner});
  }
  *ret = r;
  return 1;
}

int etm_native_rebind(void* h, void* owner, void* data, int64_t storage_bytes, int64_t ndim,
                      const int64_t* sizes, const int64_t* strides, int64_t offset, int32_t dtype) {
  return etm_native_rebind_on(h, owner, data, storage_bytes, ndim, sizes, strides, offset, dtype,
                              0);
}

int etm_native_rebind_on(void* h, void* owner, void* data, int64_t storage_bytes, int64_t ndim,
                         const int64_t* sizes, const int64_t* strides, int64_t offset,
                         int32_t dtype, int32_t device) {
  etm_rec* r = etm_rec_of(h);
  if (!r || !r->native) return 0;
  void* made = nullptr;
  if (!etm_native_adopt_on(owner, data, storage_bytes, ndim, sizes, strides, offset, dtype,
                           device, &made))
    return 0;
  etm_rec old = *r;
  etm_rec* m = (etm_rec*)made;
  std::memcpy(r, m, sizeof(etm_rec));  // the handle keeps its address: the .so holds it
  etm_slot_give(m);
  // what the handle named before loses its reference (etm_native_delete without the slot)
  void* before = old.native == 2 ? nullptr : etm_block_data(&old);
  if (old.native == 1) etm_block_unref(before, nullptr);
  else if (old.native == 3) etm_block_unref(before, etm_foreign_at(before));
  else etm_borrow_count(&old, -1);
  etm_native_live--;
  return 1;
}

int etm_native_placeholder(void** ret) {
  if (!ret) return 0;
  etm_rec* r = etm_slot_take();
  if (!r) return 0;
  const int64_t size = 0, stride = 1;
  etm_fill(r, nullptr, 4, 1, &size, &stride, 0, 0, 6 /* float32 */, 0, 2, 0);
  etm_borrow_count(r, 1);
  *ret = r;
  return 1;
}

}  // extern "C"
