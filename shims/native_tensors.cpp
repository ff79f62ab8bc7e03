// Native tensors of the shim trampoline (shims/native_tensors.py explains the design).
// Compiled as part of the generated bridge source, inside its extern "C" block, after
// the ETM_* constants native_tensors.py defines and the bridge's globals.

// per-handle records: a handle is its record's address. Python's tensors use the lower
// half (records.Records writes them); native tensors the upper half (shims/native_tensors.py)
typedef struct {
  int64_t live, data_ptr, dim, offset, numel;
  int32_t dtype, device_type;
  int64_t sizes[8];
  int64_t strides[8];
  int64_t native;         // 0: Python's tensor; 1: owns a native allocation; 2: borrows an input
  int64_t storage_bytes;  // native records: bytes of the allocation or the borrowed storage
} etm_rec;
static_assert(sizeof(etm_rec) == ETM_RECORD_SIZE, "native_tensors.RECORD_SIZE");
#define ETM_NREC ETM_TABLE_SLOTS
#define ETM_NPY (ETM_NREC / 2)
ETM_EXPORT int64_t etm_nrec = ETM_NREC;
ETM_EXPORT int64_t etm_npy = ETM_NPY;
ETM_EXPORT etm_rec etm_recs[ETM_NREC];
static inline etm_rec* etm_rec_of(void* h) {
  uintptr_t o = (uintptr_t)h - (uintptr_t)etm_recs;
  if (o >= sizeof(etm_recs) || o % sizeof(etm_rec)) return nullptr;
  etm_rec* r = (etm_rec*)h;
  return r->live ? r : nullptr;
}

// ---- native tensors (shims/native_tensors.py) ----
#define ETM_NNAT (ETM_NREC - ETM_NPY)
static int32_t etm_ring[ETM_NNAT];  // FIFO of free native slots: a stale handle stays dead long
static uint64_t etm_ring_get = 0, etm_ring_put = 0;
static bool etm_ring_fill() {
  for (int32_t i = 0; i < ETM_NNAT; i++) etm_ring[etm_ring_put++] = ETM_NPY + i;
  return true;
}
static bool etm_ring_ready = etm_ring_fill();
static const int8_t etm_itemsize[64] = {ETM_ITEMSIZES};
ETM_EXPORT int64_t etm_native_limit = ETM_NATIVE_LIMIT;
ETM_EXPORT int64_t etm_native_cache_limit = 0;  // CACHE_LIMIT while models are open
ETM_EXPORT int64_t etm_native_live = 0, etm_native_borrowed = 0;
ETM_EXPORT int64_t etm_native_bytes = 0, etm_native_cached = 0;
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
ETM_EXPORT void* etm_mem_alloc(int64_t nbytes) {
  auto it = etm_cache.find(nbytes);
  if (it != etm_cache.end() && !it->second.empty()) {
    void* p = it->second.back();
    it->second.pop_back();
    etm_native_cached -= nbytes;
    return p;
  }
  size_t n = ((size_t)nbytes + 63) & ~(size_t)63;
  return aligned_alloc(64, n ? n : 64);
}
ETM_EXPORT void etm_mem_free(void* p, int64_t nbytes) {
  if (!p) return;
  if (etm_native_cached + nbytes <= etm_native_cache_limit) {
    etm_cache[nbytes].push_back(p);
    etm_native_cached += nbytes;
  } else {
    free(p);
  }
}
ETM_EXPORT void etm_mem_empty_cache() {
  for (auto& kv : etm_cache)
    for (void* p : kv.second) free(p);
  etm_cache.clear();
  etm_native_cached = 0;
}
static void etm_native_delete(etm_rec* r) {
  if (r->native == 1) {
    etm_mem_free((void*)(intptr_t)r->data_ptr, r->storage_bytes);
    etm_native_bytes -= r->storage_bytes;
  } else {
    etm_native_borrowed--;
  }
  etm_native_live--;
  etm_slot_give(r);
}
// Python adopted a native record (ShimContext.lookup): the allocation now belongs to a Storage
ETM_EXPORT int32_t etm_native_disown(void* h) {
  etm_rec* r = etm_rec_of(h);
  if (!r || !r->native) return 1;
  if (r->native == 1) etm_native_bytes -= r->storage_bytes; else etm_native_borrowed--;
  etm_native_live--;
  r->native = 0;
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
// empty_strided for host memory within the limit; 0: not served here (Python decides/reports)
static int etm_native_empty(int64_t ndim, const int64_t* sizes, const int64_t* strides,
                            int32_t dtype, int32_t device_type, int32_t device_index,
                            void** ret) {
  if (etm_native_limit <= 0 || !ret || ndim < 0 || ndim > 8 || device_type != 0 ||
      (device_index != 0 && device_index != -1) || dtype < 0 || dtype >= 64 ||
      !etm_itemsize[dtype] || (ndim && !sizes))
    return 0;
  int64_t st[8], numel = 1, extent = 1, acc = 1;
  for (int64_t d = ndim - 1; d >= 0; d--) {
    if (sizes[d] < 0) return 0;
    st[d] = strides ? strides[d] : acc;
    if (st[d] < 0 || __builtin_mul_overflow(acc, sizes[d] > 1 ? sizes[d] : 1, &acc)) return 0;
  }
  for (int64_t d = 0; d < ndim; d++) {
    int64_t span;
    if (__builtin_mul_overflow(numel, sizes[d], &numel)) return 0;
    if (sizes[d] == 0) continue;
    if (__builtin_mul_overflow(sizes[d] - 1, st[d], &span) ||
        __builtin_add_overflow(extent, span, &extent))
      return 0;
  }
  if (numel == 0) extent = 0;
  int64_t nbytes;
  if (__builtin_mul_overflow(extent, (int64_t)etm_itemsize[dtype], &nbytes) ||
      nbytes > etm_native_limit)
    return 0;
  etm_rec* r = etm_slot_take();
  if (!r) return 0;
  void* p = etm_mem_alloc(nbytes);
  if (!p) { etm_slot_give(r); return 0; }
  r->data_ptr = (int64_t)(intptr_t)p;
  r->dim = ndim;
  r->offset = 0;
  r->numel = numel;
  r->dtype = dtype;
  r->device_type = 0;
  for (int64_t d = 0; d < ndim; d++) { r->sizes[d] = sizes[d]; r->strides[d] = st[d]; }
  r->native = 1;
  r->storage_bytes = nbytes;
  r->live = 1;
  etm_native_live++;
  etm_native_bytes += nbytes;
  *ret = r;
  return 1;
}

// one steady-state run (native_tensors.RunCall): inputs from images, outputs copied out
typedef int32_t (*etm_container_run)(void*, void**, size_t, void**, size_t, void*, void*);
typedef struct {
  int64_t nbytes, dim;
  int32_t dtype, pad;
  int64_t sizes[8], strides[8];
} etm_out;
typedef struct {
  etm_container_run run;
  void* container;
  const etm_rec* images;
  int64_t n_in;
  void** in_handles;
  void** out_handles;
  int64_t n_out;
  const etm_out* outs;
  const int64_t* dsts;  // where output i goes (0: nowhere, Python takes it)
  int64_t leftover;     // out: inputs Python adopted that the container left behind
  int64_t pending;      // out: outputs left for Python to take
} etm_call;
ETM_EXPORT int32_t etm_run(etm_call* c) {
  if (etm_ring_get + (uint64_t)c->n_in > etm_ring_put) return ETM_NO_SLOT;
  for (int64_t i = 0; i < c->n_in; i++) {
    etm_rec* r = etm_slot_take();
    std::memcpy(r, &c->images[i], sizeof(etm_rec));
    r->native = 2;
    r->live = 1;
    etm_native_live++;
    etm_native_borrowed++;
    c->in_handles[i] = r;
  }
  for (int64_t i = 0; i < c->n_out; i++) c->out_handles[i] = nullptr;
  int32_t rc = c->run(c->container, c->in_handles, (size_t)c->n_in, c->out_handles,
                      (size_t)c->n_out, nullptr, nullptr);
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
    if (r && rc != 0 && r->native == 1) { etm_native_delete(r); c->out_handles[i] = nullptr; }
    if (!c->out_handles[i]) continue;
    c->pending++;
    if (!r || r->native != 1 || rc != 0) continue;
    const etm_out* o = &c->outs[i];
    int64_t dst = c->dsts[i];
    if (!dst || r->dtype != o->dtype || r->dim != o->dim || r->storage_bytes != o->nbytes ||
        std::memcmp(r->sizes, o->sizes, 8 * o->dim) || std::memcmp(r->strides, o->strides, 8 * o->dim))
      continue;
    std::memcpy((void*)(intptr_t)dst, (void*)(intptr_t)r->data_ptr, (size_t)o->nbytes);
    etm_native_delete(r);
    c->out_handles[i] = nullptr;
    c->pending--;
  }
  return rc;
}
