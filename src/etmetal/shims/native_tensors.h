// The shared records of the shim bridge: what the generated trampoline (shims/bridge.py),
// native_tensors.cpp and Python (native_tensors.py, records.py, steady_run.py) agree on.
//
// The layouts are written once, here. Python describes the same structs with ctypes and
// checks every field's size and offset against etm_layout (exported by native_tensors.cpp)
// when the bridge loads, so neither side can drift alone.
#ifndef ETMETAL_NATIVE_TENSORS_H
#define ETMETAL_NATIVE_TENSORS_H

#include <stddef.h>
#include <stdint.h>

#define ETM_EXPORT __attribute__((visibility("default")))

#define ETM_MAX_DIMS 8         // native_tensors.MAX_DIMS
#define ETM_TABLE_SLOTS 32768  // native_tensors.TABLE_SLOTS: lower half Python's, upper native
#define ETM_NO_SLOT (-0x7E7)   // native_tensors.NO_SLOT: etm_run found no free record
#define ETM_NDTYPES 64         // c10 dtype codes etm_itemsize covers
#define ETM_DEVICE_MPS 13      // c10 DeviceType::MPS: the emulated Metal device (host memory)

#ifdef __cplusplus
extern "C" {
#endif

// per-handle records: a handle is its record's address. Python's tensors use the lower
// half (records.Records writes them); native tensors the upper half
typedef struct {
  int64_t live, data_ptr, dim, offset, numel;
  int32_t dtype, device_type;
  int64_t sizes[ETM_MAX_DIMS];
  int64_t strides[ETM_MAX_DIMS];
  // 0: Python's tensor; 1: views a native allocation; 2: borrows (an input, a constant);
  // 3: views a storage libtorch made (a fallback's result)
  int64_t native;
  int64_t storage_bytes;  // native records: bytes of the allocation or the borrowed storage
} etm_rec;

// the geometry output i of a steady-state run is predicted to come back with
typedef struct {
  int64_t nbytes, dim;
  int32_t dtype, pad;
  int64_t sizes[ETM_MAX_DIMS], strides[ETM_MAX_DIMS];
} etm_out;

// one steady-state run (native_tensors.RunCall): inputs from images, outputs copied out
typedef int32_t (*etm_container_run)(void*, void**, size_t, void**, size_t, void*, void*);
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
  void* proxy;          // the AOTIProxyExecutorHandle the run passes (NULL: none)
} etm_call;

// one row of etm_layout: a struct ("etm_rec", offset 0) or a field ("etm_rec.sizes"),
// or a constant ("ETM_MAX_DIMS", value in size)
typedef struct {
  const char* name;
  int64_t size, offset;
} etm_layout_entry;

ETM_EXPORT extern const etm_layout_entry etm_layout[];
ETM_EXPORT extern const int64_t etm_layout_count;

ETM_EXPORT extern etm_rec etm_recs[ETM_TABLE_SLOTS];
// bytes per element of each dtype code (0: not served natively); Python fills it at load
ETM_EXPORT extern int8_t etm_itemsize[ETM_NDTYPES];

// the live record at handle h, or NULL (not a record of the table, or dead)
static inline etm_rec* etm_rec_of(void* h) {
  uintptr_t o = (uintptr_t)h - (uintptr_t)etm_recs;
  if (o >= sizeof(etm_recs) || o % sizeof(etm_rec)) return NULL;
  etm_rec* r = (etm_rec*)h;
  return r->live ? r : NULL;
}

// empty_strided for host memory (device 0, or 13 while the mps limit is set) within the
// device's limit; 0: not served here (Python decides/reports)
int etm_native_empty(int64_t ndim, const int64_t* sizes, const int64_t* strides, int32_t dtype,
                     int32_t device_type, int32_t device_index, void** ret);
// _reinterpret_tensor of a native tensor: a native view of the same allocation or borrowed
// storage; 0: not served here (the policy says materialize, an error for Python to report)
int etm_native_view(void* self, int64_t ndim, const int64_t* sizes, const int64_t* strides,
                    int64_t offset_increment, void** ret);
// create_tensor_from_blob of host memory (device 0, or 13 as etm_native_empty): a borrowed
// record (never frees the memory);
// 0: not served here
int etm_native_borrow(void* data, int64_t ndim, const int64_t* sizes, const int64_t* strides,
                      int64_t offset, int32_t dtype, int32_t device_type, int32_t device_index,
                      void** ret);
// new_tensor_handle of a native tensor: another record of the same tensor; 0: not served here
int etm_native_alias(void* self, void** ret);
// a storage libtorch made, adopted as a native record of kind 3 (no copy): data and
// storage_bytes are the storage's; owner, the libtorch handle that keeps it alive, is
// released through etm_foreign_release once no record or Python storage uses it (at
// once when the storage is here already). 0: not adopted (owner is still the caller's)
typedef int32_t (*etm_release_fn)(void*);
ETM_EXPORT extern etm_release_fn etm_foreign_release;
int etm_native_adopt(void* owner, void* data, int64_t storage_bytes, int64_t ndim,
                     const int64_t* sizes, const int64_t* strides, int64_t offset, int32_t dtype,
                     void** ret);
// the same, for a record that reports c10 device type device (an mps fallback's result)
int etm_native_adopt_on(void* owner, void* data, int64_t storage_bytes, int64_t ndim,
                        const int64_t* sizes, const int64_t* strides, int64_t offset,
                        int32_t dtype, int32_t device, void** ret);
// make the live native record h name a storage libtorch made (the proxy executor's
// result: libtorch's `*handle = t`), dropping what it named before; 1 on success (owner
// is then the record's, as in etm_native_adopt), 0 with nothing changed
int etm_native_rebind(void* h, void* owner, void* data, int64_t storage_bytes, int64_t ndim,
                      const int64_t* sizes, const int64_t* strides, int64_t offset, int32_t dtype);
// the same, for a result that reports c10 device type device (an mps model's proxy call)
int etm_native_rebind_on(void* h, void* owner, void* data, int64_t storage_bytes, int64_t ndim,
                         const int64_t* sizes, const int64_t* strides, int64_t offset,
                         int32_t dtype, int32_t device);
// new_uninitialized_tensor: a native placeholder record (an empty float32 tensor, no
// memory) for etm_native_rebind to fill; 0: not served here
int etm_native_placeholder(void** ret);
// free a native record (owned allocation or borrowed input) and give its slot back
void etm_native_delete(etm_rec* r);

#ifdef __cplusplus
}  // extern "C"
#endif

#endif  // ETMETAL_NATIVE_TENSORS_H
