// What the units of the native tensors share beyond native_tensors.h: the record table's
// slots, the headers and counts of the allocations, and libtorch's storages
// (native_tensors.cpp defines them; native_lending.cpp and native_run.cpp use them). Not
// exported: the bridge and Python know only native_tensors.h.
#ifndef ETMETAL_NATIVE_RECORDS_H
#define ETMETAL_NATIVE_RECORDS_H

#include "native_tensors.h"

#define ETM_NREC ETM_TABLE_SLOTS
#define ETM_NPY (ETM_NREC / 2)
#define ETM_NNAT (ETM_NREC - ETM_NPY)

#ifdef __cplusplus
extern "C" {
#endif

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
static inline etm_block* etm_block_at(void* data) { return (etm_block*)data - 1; }
// Storages libtorch made (the new tensors of a fallback served in C, kind 3) cannot carry
// a header: their counts live here, keyed by the storage's data, with the libtorch handle
// that keeps the storage alive until the last native record and Python storage are gone
typedef struct {
  etm_block counts;
  void* owner;
} etm_foreign;

// the data of the allocation a native record of kind 1 or 3 views
static inline void* etm_block_data(const etm_rec* r) {
  return (void*)(intptr_t)(r->data_ptr - r->offset * etm_itemsize[r->dtype]);
}

extern int64_t etm_native_live, etm_native_mps_limit, etm_foreign_live, etm_native_views;

// a free slot of the native half (NULL: none), and giving one back
etm_rec* etm_slot_take(void);
void etm_slot_give(etm_rec* r);
// true while n slots are free
bool etm_slots_free(int64_t n);
// a borrowing record starts (+1) or stops (-1) counting as a borrowed storage
void etm_borrow_count(const etm_rec* r, int64_t sign);
// a block starts (+1) or stops (-1) counting as a native storage
void etm_store_count(const etm_block* b, int64_t sign);
// libtorch's storage at data (NULL: not one), and a new one's counts (it counts as a
// native storage from now on)
etm_foreign* etm_foreign_at(void* data);
void etm_foreign_add(void* data, etm_foreign* f);
// the counts of the storage a record of kind 1 or 3 views, and dropping one reference
// to the storage at data (f: libtorch's, else an allocation of ours)
etm_block* etm_block_of(const etm_rec* r);
void etm_block_unref(void* data, etm_foreign* f);
// elements a view spans (0 when it has none) in *extent, and its numel; false on a
// negative size or stride or an overflow (Python then reports or serves the call)
bool etm_geometry(int64_t ndim, const int64_t* sizes, const int64_t* strides, int64_t* numel,
                  int64_t* extent);
// make r a live native record of kind 1 (viewing the allocation at data) or 2 (borrowing)
// or 3 (libtorch's storage at data)
void etm_fill(etm_rec* r, char* data, int64_t item, int64_t ndim, const int64_t* sizes,
              const int64_t* strides, int64_t offset, int64_t numel, int32_t dtype,
              int32_t device, int64_t kind, int64_t storage_bytes);

#ifdef __cplusplus
}  // extern "C"
#endif

#endif  // ETMETAL_NATIVE_RECORDS_H
