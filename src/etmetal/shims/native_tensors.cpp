// Native tensors of the shim trampoline (shims/native_tensors.py explains the design): the
// record table, its slots, the allocations and their counts, and the tensors made here
// (empty_strided, views, deletes). Its own translation unit, linked into the bridge with
// the generated trampoline, which reaches it through native_tensors.h; the storage that is
// lent or libtorch's is native_lending.cpp's, the one-call run native_run.cpp's, and the
// three share native_records.h. The layout table Python checks its mirrors against is here.
#include "native_records.h"

#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <unordered_map>
#include <vector>

extern "C" {

ETM_EXPORT int64_t etm_nrec = ETM_NREC;
ETM_EXPORT int64_t etm_npy = ETM_NPY;
ETM_EXPORT etm_rec etm_recs[ETM_NREC];

// ---- native tensors (shims/native_tensors.py) ----
static int32_t etm_ring[ETM_NNAT];  // FIFO of free native slots: a stale handle stays dead long
static uint64_t etm_ring_get = 0, etm_ring_put = 0;
static bool etm_ring_fill() {
  for (int32_t i = 0; i < ETM_NNAT; i++) etm_ring[etm_ring_put++] = ETM_NPY + i;
  return true;
}
static bool etm_ring_ready = etm_ring_fill();
ETM_EXPORT int8_t etm_itemsize[ETM_NDTYPES] = {0};
ETM_EXPORT int64_t etm_native_limit = 0;  // set by Python (ShimContext.sync_native_policy)
// the same for the emulated Metal device (c10 device type 13), whose buffers are host
// memory; 0 (the default, and the stock runtime's) keeps every mps tensor Python's
ETM_EXPORT int64_t etm_native_mps_limit = 0;
// native mps allocations no Python storage holds (live_mps_storages counts them)
ETM_EXPORT int64_t etm_native_mps_stores = 0, etm_native_mps_bytes = 0;
ETM_EXPORT int64_t etm_native_cache_limit = 0;  // CACHE_LIMIT while models are open
ETM_EXPORT int64_t etm_native_live = 0, etm_native_borrowed = 0;
ETM_EXPORT int64_t etm_native_bytes = 0, etm_native_cached = 0, etm_native_stores = 0;
// 1 while _reinterpret_tensor may be served here (the context's materialize policy is "view")
ETM_EXPORT int64_t etm_native_views = 0;
// never destroyed: Python finalizers may free into it while the process exits
static std::unordered_map<int64_t, std::vector<void*>>& etm_cache =
    *new std::unordered_map<int64_t, std::vector<void*>>();

etm_rec* etm_slot_take() {
  if (!etm_ring_ready || etm_ring_get == etm_ring_put) return nullptr;
  return &etm_recs[etm_ring[etm_ring_get++ % ETM_NNAT]];
}
void etm_slot_give(etm_rec* r) {
  r->live = 0;
  r->native = 0;
  etm_ring[etm_ring_put++ % ETM_NNAT] = (int32_t)(r - etm_recs);
}
// a borrowing record starts (+1) or stops (-1) counting as a borrowed storage (an mps one
// in etm_native_mps_borrowed as well: live_mps_storages counts it, as Python's)
ETM_EXPORT int64_t etm_native_mps_borrowed = 0;
void etm_borrow_count(const etm_rec* r, int64_t sign) {
  etm_native_borrowed += sign;
  if (r->device_type == ETM_DEVICE_MPS) etm_native_mps_borrowed += sign;
}
// a block starts (+1) or stops (-1) counting as a native storage
void etm_store_count(const etm_block* b, int64_t sign) {
  etm_native_stores += sign;
  etm_native_bytes += sign * b->nbytes;
  if (b->device == ETM_DEVICE_MPS) {
    etm_native_mps_stores += sign;
    etm_native_mps_bytes += sign * b->nbytes;
  }
}

// mps memory is never cached (as MpsAllocator): live mps memory is what the model holds
static void* etm_mem_alloc(int64_t nbytes, int32_t device) {
  auto it = device == ETM_DEVICE_MPS ? etm_cache.end() : etm_cache.find(nbytes);
  if (it != etm_cache.end() && !it->second.empty()) {
    void* p = it->second.back();
    it->second.pop_back();
    etm_native_cached -= nbytes;
    return p;
  }
  size_t n = ((size_t)nbytes + 63) & ~(size_t)63;
  etm_block* b = (etm_block*)aligned_alloc(64, sizeof(etm_block) + n);
  return b ? b + 1 : nullptr;
}
static void etm_mem_free(void* p, int64_t nbytes) {
  if (!p) return;
  if (etm_block_at(p)->device != ETM_DEVICE_MPS &&
      etm_native_cached + nbytes <= etm_native_cache_limit) {
    etm_cache[nbytes].push_back(p);
    etm_native_cached += nbytes;
  } else {
    free(etm_block_at(p));
  }
}
ETM_EXPORT void etm_mem_empty_cache() {
  for (auto& kv : etm_cache)
    for (void* p : kv.second) free(etm_block_at(p));
  etm_cache.clear();
  etm_native_cached = 0;
}
static std::unordered_map<intptr_t, etm_foreign*>& etm_foreign_blocks =
    *new std::unordered_map<intptr_t, etm_foreign*>();
ETM_EXPORT etm_release_fn etm_foreign_release = nullptr;  // libtorch's delete (native_fallbacks)
ETM_EXPORT int64_t etm_foreign_live = 0;
etm_foreign* etm_foreign_at(void* data) {
  if (etm_foreign_blocks.empty()) return nullptr;
  auto it = etm_foreign_blocks.find((intptr_t)data);
  return it == etm_foreign_blocks.end() ? nullptr : it->second;
}
void etm_foreign_add(void* data, etm_foreign* f) {
  etm_foreign_blocks[(intptr_t)data] = f;
  etm_foreign_live++;
  etm_store_count(&f->counts, 1);
}
// the counts of the storage a record of kind 1 or 3 views
etm_block* etm_block_of(const etm_rec* r) {
  void* data = etm_block_data(r);
  return r->native == 3 ? &etm_foreign_at(data)->counts : etm_block_at(data);
}
void etm_block_unref(void* data, etm_foreign* f) {
  etm_block* b = f ? &f->counts : etm_block_at(data);
  if (--b->refs) return;
  etm_store_count(b, -1);
  if (!f) {
    etm_mem_free(data, b->nbytes);
    return;
  }
  etm_foreign_blocks.erase((intptr_t)data);
  if (etm_foreign_release) etm_foreign_release(f->owner);
  etm_foreign_live--;
  delete f;
}
// a Python Storage over the allocation at data (etm_native_disown gave it its reference)
// is gone; the allocation is freed when no native record views it either
ETM_EXPORT void etm_block_unref_python(void* data) {
  etm_foreign* f = etm_foreign_at(data);
  etm_block* b = f ? &f->counts : etm_block_at(data);
  if (--b->py_refs == 0) etm_store_count(b, 1);  // C's again: a native storage until freed
  etm_block_unref(data, f);
}
// native records other than Python's storages that view the allocation at data
ETM_EXPORT int64_t etm_block_native_refs(void* data) {
  etm_foreign* f = etm_foreign_at(data);
  etm_block* b = f ? &f->counts : etm_block_at(data);
  return b->refs - b->py_refs;
}
void etm_native_delete(etm_rec* r) {
  if (r->native == 1) etm_block_unref(etm_block_data(r), nullptr);
  else if (r->native == 3) etm_block_unref(etm_block_data(r), etm_foreign_at(etm_block_data(r)));
  else etm_borrow_count(r, -1);
  etm_native_live--;
  etm_slot_give(r);
}
// Python adopted a native record (ShimContext.lookup): the record's reference to its
// allocation becomes the reference of a Python Storage (etm_block_unref_python drops it)
ETM_EXPORT int32_t etm_native_disown(void* h) {
  etm_rec* r = etm_rec_of(h);
  if (!r || !r->native) return 1;
  if (r->native != 2) {
    etm_block* b = etm_block_of(r);
    if (b->py_refs++ == 0) etm_store_count(b, -1);  // Python's storage now: it counts it
  } else {
    etm_borrow_count(r, -1);
  }
  etm_native_live--;
  r->native = 0;
  return 0;
}
// 1 if a live native record's storage (an allocation, libtorch's storage or borrowed
// memory) holds [p, p + n): the emulated Metal device's copy checks in Python accept a
// source only a native tensor knows (a scan of the native half: a rare, checked path)
ETM_EXPORT int32_t etm_native_holds(uint64_t p, uint64_t n) {
  if (p + n < p) return 0;
  for (int64_t i = ETM_NPY; i < ETM_NREC; i++) {
    const etm_rec* r = &etm_recs[i];
    if (!r->live || r->native < 1 || r->native > 3 || r->dtype < 0 || r->dtype >= ETM_NDTYPES)
      continue;
    uint64_t base = (uint64_t)(intptr_t)etm_block_data(r);
    if (p >= base && p + n <= base + (uint64_t)r->storage_bytes) return 1;
  }
  return 0;
}
// delete a native handle from Python (cleanup after a failed run); 1 if it is not native
ETM_EXPORT int32_t etm_native_delete_handle(void* h) {
  etm_rec* r = etm_rec_of(h);
  if (!r || !r->native) return 1;
  etm_native_delete(r);
  return 0;
}
// an adopted handle of the native half was deleted by Python: its slot goes back here
ETM_EXPORT int32_t etm_slot_release(void* h) {
  uintptr_t o = (uintptr_t)h - (uintptr_t)&etm_recs[ETM_NPY];
  if (o >= ETM_NNAT * sizeof(etm_rec) || o % sizeof(etm_rec)) return 1;
  etm_slot_give((etm_rec*)h);
  return 0;
}

bool etm_slots_free(int64_t n) { return etm_ring_get + (uint64_t)n <= etm_ring_put; }

bool etm_geometry(int64_t ndim, const int64_t* sizes, const int64_t* strides,
                         int64_t* numel, int64_t* extent) {
  *numel = 1;
  *extent = 1;
  for (int64_t d = 0; d < ndim; d++) {
    int64_t span;
    if (sizes[d] < 0 || strides[d] < 0 || __builtin_mul_overflow(*numel, sizes[d], numel))
      return false;
    if (sizes[d] == 0) continue;
    if (__builtin_mul_overflow(sizes[d] - 1, strides[d], &span) ||
        __builtin_add_overflow(*extent, span, extent))
      return false;
  }
  if (*numel == 0) *extent = 0;
  return true;
}

void etm_fill(etm_rec* r, char* data, int64_t item, int64_t ndim, const int64_t* sizes,
                     const int64_t* strides, int64_t offset, int64_t numel, int32_t dtype,
                     int32_t device, int64_t kind, int64_t storage_bytes) {
  r->data_ptr = (int64_t)(intptr_t)(data + offset * item);
  r->dim = ndim;
  r->offset = offset;
  r->numel = numel;
  r->dtype = dtype;
  r->device_type = device;
  for (int64_t d = 0; d < ndim; d++) { r->sizes[d] = sizes[d]; r->strides[d] = strides[d]; }
  r->native = kind;
  r->storage_bytes = storage_bytes;
  r->live = 1;
  etm_native_live++;
}

int etm_native_empty(int64_t ndim, const int64_t* sizes, const int64_t* strides, int32_t dtype,
                     int32_t device_type, int32_t device_index, void** ret) {
  int64_t limit = device_type == 0 ? etm_native_limit
                  : device_type == ETM_DEVICE_MPS ? etm_native_mps_limit
                                                  : 0;
  if (limit <= 0 || !ret || ndim < 0 || ndim > ETM_MAX_DIMS ||
      (device_index != 0 && device_index != -1) || dtype < 0 || dtype >= ETM_NDTYPES ||
      !etm_itemsize[dtype] || (ndim && !sizes))
    return 0;
  int64_t st[ETM_MAX_DIMS], numel, extent, acc = 1;
  for (int64_t d = ndim - 1; d >= 0; d--) {  // packed strides when none are given
    if (sizes[d] < 0) return 0;
    st[d] = strides ? strides[d] : acc;
    if (__builtin_mul_overflow(acc, sizes[d] > 1 ? sizes[d] : 1, &acc)) return 0;
  }
  if (!etm_geometry(ndim, sizes, st, &numel, &extent)) return 0;
  int64_t nbytes;
  if (__builtin_mul_overflow(extent, (int64_t)etm_itemsize[dtype], &nbytes) ||
      nbytes > limit)
    return 0;
  etm_rec* r = etm_slot_take();
  if (!r) return 0;
  void* p = etm_mem_alloc(nbytes, device_type);
  if (!p) { etm_slot_give(r); return 0; }
  etm_block* b = etm_block_at(p);
  b->refs = 1;
  b->py_refs = 0;
  b->nbytes = nbytes;
  b->device = device_type;
  etm_fill(r, (char*)p, etm_itemsize[dtype], ndim, sizes, st, 0, numel, dtype, device_type, 1,
           nbytes);
  etm_store_count(b, 1);
  *ret = r;
  return 1;
}

int etm_native_view(void* self, int64_t ndim, const int64_t* sizes, const int64_t* strides,
                    int64_t offset_increment, void** ret) {
  if (!etm_native_views || !ret || ndim < 0 || ndim > ETM_MAX_DIMS || (ndim && (!sizes || !strides)))
    return 0;
  etm_rec* base = etm_rec_of(self);
  if (!base || !base->native) return 0;
  int64_t item = etm_itemsize[base->dtype], offset, numel, extent, end = 0;
  if (!item || __builtin_add_overflow(base->offset, offset_increment, &offset) || offset < 0 ||
      !etm_geometry(ndim, sizes, strides, &numel, &extent))
    return 0;
  if (extent && (__builtin_add_overflow(offset, extent, &end) ||
                 __builtin_mul_overflow(end, item, &end)))
    return 0;
  if (end > base->storage_bytes) return 0;  // out of its storage: Python reports it
  etm_rec* r = etm_slot_take();
  if (!r) return 0;
  // the same allocation (kind 1) or borrowed storage (kind 2), another geometry
  char* data = (char*)(intptr_t)(base->data_ptr - base->offset * item);
  etm_fill(r, data, item, ndim, sizes, strides, offset, numel, base->dtype, base->device_type,
           base->native, base->storage_bytes);
  if (r->native == 2) etm_borrow_count(r, 1);
  else etm_block_of(r)->refs++;
  *ret = r;
  return 1;
}

// sizes and offsets of the shared structs, checked by native_tensors.check_layout at load
#define ETM_STRUCT(S) {#S, (int64_t)sizeof(S), 0}
#define ETM_FIELD(S, F) {#S "." #F, (int64_t)sizeof(((S*)0)->F), (int64_t)offsetof(S, F)}
#define ETM_CONSTANT(C) {#C, (int64_t)(C), 0}
const etm_layout_entry etm_layout[] = {
    ETM_CONSTANT(ETM_MAX_DIMS),
    ETM_CONSTANT(ETM_TABLE_SLOTS),
    ETM_CONSTANT(ETM_NO_SLOT),
    ETM_CONSTANT(ETM_NDTYPES),
    ETM_STRUCT(etm_rec),
    ETM_FIELD(etm_rec, live),
    ETM_FIELD(etm_rec, data_ptr),
    ETM_FIELD(etm_rec, dim),
    ETM_FIELD(etm_rec, offset),
    ETM_FIELD(etm_rec, numel),
    ETM_FIELD(etm_rec, dtype),
    ETM_FIELD(etm_rec, device_type),
    ETM_FIELD(etm_rec, sizes),
    ETM_FIELD(etm_rec, strides),
    ETM_FIELD(etm_rec, native),
    ETM_FIELD(etm_rec, storage_bytes),
    ETM_STRUCT(etm_out),
    ETM_FIELD(etm_out, nbytes),
    ETM_FIELD(etm_out, dim),
    ETM_FIELD(etm_out, dtype),
    ETM_FIELD(etm_out, pad),
    ETM_FIELD(etm_out, sizes),
    ETM_FIELD(etm_out, strides),
    ETM_STRUCT(etm_call),
    ETM_FIELD(etm_call, run),
    ETM_FIELD(etm_call, container),
    ETM_FIELD(etm_call, images),
    ETM_FIELD(etm_call, n_in),
    ETM_FIELD(etm_call, in_handles),
    ETM_FIELD(etm_call, out_handles),
    ETM_FIELD(etm_call, n_out),
    ETM_FIELD(etm_call, outs),
    ETM_FIELD(etm_call, dsts),
    ETM_FIELD(etm_call, leftover),
    ETM_FIELD(etm_call, pending),
    ETM_FIELD(etm_call, proxy),
};
const int64_t etm_layout_count = sizeof(etm_layout) / sizeof(etm_layout[0]);

}  // extern "C"
