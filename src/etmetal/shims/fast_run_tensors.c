// Reading and making torch tensors for a FastRun (fast_run_tensors.h).
#include "fast_run_tensors.h"  // first: Python.h before any system header

#include <string.h>

typedef int32_t (*get_ptr_fn)(void*, void**);
typedef int32_t (*get_i64p_fn)(void*, int64_t**);
typedef int32_t (*get_i64_fn)(void*, int64_t*);
typedef int32_t (*get_i32_fn)(void*, int32_t*);
typedef int32_t (*empty_fn)(int64_t, const int64_t*, const int64_t*, int32_t, int32_t, int32_t,
                            void**);
typedef int32_t (*delete_fn)(void*);
typedef PyObject* (*wrap_fn)(const void*);  // THPVariable_Wrap(const at::TensorBase&)

int etm_read_geometry(const etm_torch* lib, PyObject* t, etm_geometry* out) {
  if (Py_TYPE(t) != lib->tensor_type) return 0;
  void* h = etm_at_tensor(t);
  int64_t *sizes = NULL, *strides = NULL;
  if (((get_i32_fn)lib->fn[F_DTYPE])(h, &out->dtype) ||
      ((get_i64_fn)lib->fn[F_DIM])(h, &out->dim) || out->dim < 0 || out->dim > ETM_MAX_DIMS ||
      ((get_i64p_fn)lib->fn[F_SIZES])(h, &sizes) ||
      ((get_i64p_fn)lib->fn[F_STRIDES])(h, &strides))
    return 0;
  out->sizes = sizes;
  out->strides = strides;
  return 1;
}

// a planned tensor's layout is read as it is now, not as it was when the FastRun was
// built: a method with dynamic shapes resizes its planned tensors to each new shape
// (within their capacity), and the Python path compares with the resized tensor
static int same_as(const etm_torch* lib, PyObject* want, int32_t dtype, int64_t dim,
                   const int64_t* sizes, const int64_t* strides) {
  etm_geometry g;
  if (!etm_read_geometry(lib, want, &g)) return 0;
  return g.dtype == dtype && g.dim == dim &&
         !memcmp(g.sizes, sizes, sizeof(int64_t) * (size_t)dim) &&
         !memcmp(g.strides, strides, sizeof(int64_t) * (size_t)dim);
}

int etm_write_input(const etm_torch* lib, PyObject* t, PyObject* want, int32_t device_type,
                    etm_rec* r) {
  etm_geometry g;
  if (!etm_read_geometry(lib, t, &g)) return 0;
  void* h = etm_at_tensor(t);
  int32_t device = -1, layout = -1;
  int64_t offset = 0, storage = 0;
  void* data = NULL;
  if (((get_i32_fn)lib->fn[F_DEVICE])(h, &device) || device != 0) return 0;
  if (((get_i32_fn)lib->fn[F_LAYOUT])(h, &layout) || layout != 0) return 0;
  if (g.dtype < 0 || g.dtype >= ETM_NDTYPES || !lib->itemsize[g.dtype]) return 0;
  if (((get_i64_fn)lib->fn[F_OFFSET])(h, &offset) ||
      ((get_i64_fn)lib->fn[F_STORAGE])(h, &storage) || ((get_ptr_fn)lib->fn[F_DATA])(h, &data))
    return 0;
  if (want && !same_as(lib, want, g.dtype, g.dim, g.sizes, g.strides)) return 0;
  memset(r, 0, sizeof(*r));
  int64_t numel = 1;
  for (int64_t d = 0; d < g.dim; d++) numel *= g.sizes[d];
  r->data_ptr = (int64_t)(intptr_t)data;
  r->dim = g.dim;
  r->offset = offset;
  r->numel = numel;
  r->dtype = g.dtype;
  r->device_type = device_type;  // host memory either way: 13 lends it as an mps tensor
  memcpy(r->sizes, g.sizes, sizeof(int64_t) * (size_t)g.dim);
  memcpy(r->strides, g.strides, sizeof(int64_t) * (size_t)g.dim);
  r->native = 2;  // borrowed: etm_run lends it, nothing frees the caller's memory
  r->storage_bytes = storage;
  return 1;
}

int etm_output_served(const etm_torch* lib, const etm_out* o, PyObject* want,
                      int64_t copy_limit) {
  if (o->nbytes < 0 || o->nbytes > copy_limit || o->dim > ETM_MAX_DIMS) return 0;
  return !want || same_as(lib, want, o->dtype, o->dim, o->sizes, o->strides);
}

int etm_make_outputs(const etm_torch* lib, const etm_out* outs, Py_ssize_t n, void** made,
                     int64_t* dsts, Py_ssize_t* n_made) {
  for (*n_made = 0; *n_made < n; ++*n_made) {
    const etm_out* o = &outs[*n_made];
    void* data = NULL;
    void** slot = &made[*n_made];
    if (((empty_fn)lib->fn[F_EMPTY])(o->dim, o->sizes, o->strides, o->dtype, 0, 0, slot))
      return 0;
    if (((get_ptr_fn)lib->fn[F_DATA])(*slot, &data)) {
      ++*n_made;  // made (the caller deletes it), but not usable
      return 0;
    }
    dsts[*n_made] = (int64_t)(intptr_t)data;
  }
  return 1;
}

void etm_delete_outputs(const etm_torch* lib, void** made, Py_ssize_t n) {
  for (Py_ssize_t i = 0; i < n; i++) ((delete_fn)lib->fn[F_DELETE])(made[i]);
}

PyObject* etm_wrap(const etm_torch* lib, void* t) { return ((wrap_fn)lib->fn[F_WRAP])(t); }
