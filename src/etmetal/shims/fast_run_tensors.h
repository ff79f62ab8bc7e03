// Torch tensors as a FastRun (fast_run.c) sees them: read and made through libtorch's
// exported C shims (aoti_torch/c/shim.h), whose addresses fast_run.py takes from the
// libtorch torch has loaded. Nothing here is compiled against libtorch.
#ifndef ETMETAL_FAST_RUN_TENSORS_H
#define ETMETAL_FAST_RUN_TENSORS_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#include "native_tensors.h"

// the function table, in fast_run.py's order (_LIBTORCH_CPU, then THPVariable_Wrap)
enum { F_DATA, F_SIZES, F_STRIDES, F_DTYPE, F_DIM, F_OFFSET, F_STORAGE, F_DEVICE, F_LAYOUT,
       F_EMPTY, F_DELETE, F_WRAP, F_COUNT };

typedef struct {
  void* fn[F_COUNT];
  int8_t itemsize[ETM_NDTYPES];  // 0: a dtype the records do not know
  PyTypeObject* tensor_type;     // torch.Tensor: only exact instances are served
} etm_torch;

// dtype, dim, sizes and strides of a tensor as it is now (sizes/strides point into it)
typedef struct {
  int32_t dtype;
  int64_t dim;
  const int64_t* sizes;
  const int64_t* strides;
} etm_geometry;

// the at::Tensor a THPVariable holds, right after the object header (python_variable.h;
// fast_run.py checks it on probe tensors before it builds anything on it)
static inline void* etm_at_tensor(PyObject* t) { return (char*)t + sizeof(PyObject); }

// the geometry of torch tensor t; 0 when it is not an exact torch.Tensor or not readable
int etm_read_geometry(const etm_torch* lib, PyObject* t, etm_geometry* out);

// the record image of t (a dense CPU tensor of a known dtype, laid out as `want` is now
// when `want` is given) written to r as a borrowed record of c10 device `device_type` (0,
// or 13: the emulated Metal device, whose memory is host memory); 0: not this path's
int etm_write_input(const etm_torch* lib, PyObject* t, PyObject* want, int32_t device_type,
                    etm_rec* r);

// 1 when output o may be served as predicted: predicted, at most `copy_limit` bytes and
// (when `want` is given) laid out as `want` is now
int etm_output_served(const etm_torch* lib, const etm_out* o, PyObject* want,
                      int64_t copy_limit);

// libtorch tensors of the predicted geometries outs[0..n): made[i], their data pointers in
// dsts[i]; 1 when all n were made. *n_made says how many exist, each the caller's to
// delete whatever the result
int etm_make_outputs(const etm_torch* lib, const etm_out* outs, Py_ssize_t n, void** made,
                     int64_t* dsts, Py_ssize_t* n_made);

// delete made[0..n) (libtorch tensors from etm_make_outputs)
void etm_delete_outputs(const etm_torch* lib, void** made, Py_ssize_t n);

// a new torch.Tensor object over libtorch tensor t (THPVariable_Wrap)
PyObject* etm_wrap(const etm_torch* lib, void* t);

#endif
