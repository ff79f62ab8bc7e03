// Native tensors of the shim trampoline (shims/native_tensors.py explains the design).
// Its own translation unit, linked into the bridge with the generated trampoline, which
// reaches it through native_tensors.h.
#include "native_tensors.h"

#include <cstdlib>
#include <cstring>
#include <unordered_map>
#include <vector>

extern "C" {

#define ETM_NREC ETM_TABLE_SLOTS
#define ETM_NPY (ETM_NREC / 2)
ETM_EXPORT int64_t etm_nrec = ETM_NREC;
ETM_EXPORT int64_t etm_npy = ETM_NPY;
ETM_EXPORT etm_rec etm_recs[ETM_NREC];

// ---- native tensors (shims/native_tensors.py) ----
#define ETM_NNAT (ETM_NREC - ETM_NPY)
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

static etm_rec* etm_slot_take() {
  if (!etm_ring_ready || etm_ring_get == etm_ring_put) return nullptr;
  return &etm_recs[etm_ring[etm_ring_get++ % ETM_NNAT]];
}
static void etm_slot_give(etm_rec* r) {
  r->live = 0;
  r->native = 0;
  etm_ring[etm_ring_put++ % ETM_NNAT] = (int32_t)(r - etm_recs);
}
// Each native allocation starts with a header (64 bytes, so the data stays 64-byte aligned)
// counting the references to it: one per native record that views it (etm_native_empty
// and etm_native_view) plus one per Python Storage that adopted it (py_refs). A block
// counts in etm_native_stores/etm_native_bytes while no Python Storage holds it (Python's
// memory statistics count it as one of its own storages then); an mps block counts in
// etm_native_mps_stores/bytes as well. device: the c10 device type its tensors report.
typedef struct {
  int64_t refs, py_refs, nbytes, device, pad[4];
} etm_block;
static_assert(sizeof(etm_block) == 64, "the header keeps the data 64-byte aligned");
static etm_block* etm_block_at(void* data) { return (etm_block*)data - 1; }
// a borrowing record starts (+1) or stops (-1) counting as a borrowed storage (an mps one
// in etm_native_mps_borrowed as well: live_mps_storages counts it, as Python's)
ETM_EXPORT int64_t etm_native_mps_borrowed = 0;
static void etm_borrow_count(const etm_rec* r, int64_t sign) {
  etm_native_borrowed += sign;
  if (r->device_type == ETM_DEVICE_MPS) etm_native_mps_borrowed += sign;
}
// a block starts (+1) or stops (-1) counting as a native storage
static void etm_store_count(const etm_block* b, int64_t sign) {
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
// the data of the allocation a native record of kind 1 or 3 views
static void* etm_block_data(const etm_rec* r) {
  return (void*)(intptr_t)(r->data_ptr - r->offset * etm_itemsize[r->dtype]);
}
// Storages libtorch made (the new tensors of a fallback served in C, kind 3) cannot carry
// a header: their counts live here, keyed by the storage's data, with the libtorch handle
// that keeps the storage alive until the last native record and Python storage are gone
typedef struct {
  etm_block counts;
  void* owner;
} etm_foreign;
static std::unordered_map<intptr_t, etm_foreign*>& etm_foreign_blocks =
    *new std::unordered_map<intptr_t, etm_foreign*>();
ETM_EXPORT etm_release_fn etm_foreign_release = nullptr;  // libtorch's delete (native_fallbacks)
ETM_EXPORT int64_t etm_foreign_live = 0;
static etm_foreign* etm_foreign_at(void* data) {
  if (etm_foreign_blocks.empty()) return nullptr;
  auto it = etm_foreign_blocks.find((intptr_t)data);
  return it == etm_foreign_blocks.end() ? nullptr : it->second;
}
// the counts of the storage a record of kind 1 or 3 views
static etm_block* etm_block_of(const etm_rec* r) {
  void* data = etm_block_data(r);
  return r->native == 3 ? &etm_foreign_at(data)->counts : etm_block_at(data);
}
static void etm_block_unref(void* data, etm_foreign* f) {
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

// elements a view spans (0 when it has none) in *extent, and its numel; false on a negative
// size or stride or an overflow (Python then reports or serves the call)
static bool etm_geometry(int64_t ndim, const int64_t* sizes, const int64_t* strides,
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

// a live native record of kind 1 (viewing the allocation at data) or 2 (borrowing)
static void etm_fill(etm_rec* r, char* data, int64_t item, int64_t ndim, const int64_t* sizes,
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
    f = new etm_foreign{{1, 0, storage_bytes, device, {0, 0, 0, 0}}, owner};
    etm_foreign_blocks[(intptr_t)data] = f;
    etm_foreign_live++;
    etm_store_count(&f->counts, 1);
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

ETM_EXPORT int32_t etm_run(etm_call* c) {
  if (etm_ring_get + (uint64_t)c->n_in > etm_ring_put) return ETM_NO_SLOT;
  for (int64_t i = 0; i < c->n_in; i++) {
    etm_rec* r = etm_slot_take();
    if (!r) {  // cannot happen (capacity checked above): undo, never write through null
      for (int64_t j = 0; j < i; j++) etm_native_delete((etm_rec*)c->in_handles[j]);
      return ETM_NO_SLOT;
    }
    std::memcpy(r, &c->images[i], sizeof(etm_rec));
    r->native = 2;
    r->live = 1;
    etm_native_live++;
    etm_borrow_count(r, 1);
    c->in_handles[i] = r;
  }
  for (int64_t i = 0; i < c->n_out; i++) c->out_handles[i] = nullptr;
  int32_t rc = c->run(c->container, c->in_handles, (size_t)c->n_in, c->out_handles,
                      (size_t)c->n_out, nullptr, c->proxy);
  c->leftover = c->pending = 0;
  for (int64_t i = 0; i < c->n_in; i++) {  // inputs the container did not delete...
    etm_rec* r = etm_rec_of(c->in_handles[i]);
    if (!r) continue;
    bool returned = false;  // ...unless it handed one back as an output
    for (int64_t j = 0; j < c->n_out && !returned; j++) returned = c->out_handles[j] == r;
    if (returned) continue;
    if (r->native) etm_native_delete(r); else c->leftover++;  // Python adopted it
  }
  for (int64_t i = 0; i < c->n_out; i++) {
    etm_rec* r = etm_rec_of(c->out_handles[i]);
    bool made = r && (r->native == 1 || r->native == 3);  // a buffer, not a borrowed input
    if (made && rc != 0) { etm_native_delete(r); c->out_handles[i] = nullptr; }
    if (!c->out_handles[i]) continue;
    c->pending++;
    if (!made || rc != 0) continue;
    const etm_out* o = &c->outs[i];
    int64_t dst = c->dsts[i];
    if (!dst || r->offset || r->dtype != o->dtype || r->dim != o->dim || r->storage_bytes != o->nbytes ||
        std::memcmp(r->sizes, o->sizes, sizeof(int64_t) * o->dim) ||
        std::memcmp(r->strides, o->strides, sizeof(int64_t) * o->dim))
      continue;
    std::memcpy((void*)(intptr_t)dst, (void*)(intptr_t)r->data_ptr, (size_t)o->nbytes);
    etm_native_delete(r);
    c->out_handles[i] = nullptr;
    c->pending--;
  }
  return rc;
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
