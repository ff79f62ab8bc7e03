// Building a FastRun from Python's arguments, its type and the extension module
// (fast_run.py builds the module from this file, fast_run.c and fast_run_tensors.c).
#include "fast_run.h"  // first: Python.h before any system header

#include <string.h>

// the tensors the inputs or outputs must be laid out as: None, or a tuple of n exact
// torch.Tensors (new reference in *dst)
static int read_expected(FastRun* self, PyObject* obj, Py_ssize_t n, PyObject** dst,
                         const char* what) {
  if (obj == Py_None) return 0;
  if (!PyTuple_CheckExact(obj) || PyTuple_GET_SIZE(obj) != n) {
    PyErr_Format(PyExc_ValueError, "FastRun: %s must be a tuple of %zd tensors", what, n);
    return -1;
  }
  for (Py_ssize_t i = 0; i < n; i++)
    if (Py_TYPE(PyTuple_GET_ITEM(obj, i)) != self->lib.tensor_type) {
      PyErr_Format(PyExc_TypeError, "FastRun: %s[%zd] is not a torch.Tensor", what, i);
      return -1;
    }
  *dst = Py_NewRef(obj);
  return 0;
}

static void fast_dealloc(FastRun* self) {
  Py_XDECREF(self->lib.tensor_type);
  Py_XDECREF(self->ctx);
  Py_XDECREF(self->acquire);
  Py_XDECREF(self->release);
  Py_XDECREF(self->model_ref);
  Py_XDECREF(self->fallback);
  Py_XDECREF(self->finish);
  Py_XDECREF(self->keepalive);
  Py_XDECREF(self->guard_acquire);
  Py_XDECREF(self->guard_release);
  Py_XDECREF(self->guard_owner);
  Py_XDECREF(self->expect_in);
  Py_XDECREF(self->expect_out);
  Py_XDECREF(self->unchecked);
  Py_TYPE(self)->tp_free((PyObject*)self);
}

static PyObject* fast_new(PyTypeObject* type, PyObject* args, PyObject* kwargs) {
  static char* names[] = {"call", "etm_run", "armed", "fns", "itemsize", "tensor_type",
                          "ctx", "lock", "model_ref", "fallback", "finish", "keepalive",
                          "copy_limit", "expect_in", "expect_out", "guard", "guard_owner",
                          "unchecked", "device_type", NULL};
  unsigned long long call, etm_run, armed;
  long long copy_limit;
  PyObject *fns, *tensor_type, *ctx, *lock, *model_ref, *fallback, *finish, *keepalive;
  PyObject *expect_in = Py_None, *expect_out = Py_None, *guard = Py_None, *owner = Py_None;
  PyObject* unchecked = Py_None;
  int device_type = 0;
  Py_buffer sizes;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "KKKO!y*O!OOOOOOL|OOOOOi", names, &call,
                                   &etm_run, &armed, &PyTuple_Type, &fns, &sizes, &PyType_Type,
                                   &tensor_type, &ctx, &lock, &model_ref, &fallback, &finish,
                                   &keepalive, &copy_limit, &expect_in, &expect_out, &guard,
                                   &owner, &unchecked, &device_type))
    return NULL;
  if (unchecked != Py_None && !PyTuple_CheckExact(unchecked)) {
    PyBuffer_Release(&sizes);
    PyErr_SetString(PyExc_TypeError, "FastRun: unchecked must be None or a tuple");
    return NULL;
  }
  if (sizes.len != ETM_NDTYPES || PyTuple_GET_SIZE(fns) != F_COUNT || !call || !etm_run ||
      !armed) {
    PyBuffer_Release(&sizes);
    PyErr_SetString(PyExc_ValueError, "FastRun: bad itemsize table, function table or address");
    return NULL;
  }
  FastRun* self = (FastRun*)type->tp_alloc(type, 0);
  if (!self) {
    PyBuffer_Release(&sizes);
    return NULL;
  }
  self->vectorcall = etm_fast_call;
  self->copy_limit = copy_limit;
  self->release_gil = RELEASE_RUNS;  // until runs show they are short
  memcpy(self->lib.itemsize, sizes.buf, ETM_NDTYPES);
  PyBuffer_Release(&sizes);
  for (int i = 0; i < F_COUNT; i++) {
    self->lib.fn[i] = PyLong_AsVoidPtr(PyTuple_GET_ITEM(fns, i));
    if (!self->lib.fn[i]) {
      if (!PyErr_Occurred()) PyErr_Format(PyExc_ValueError, "FastRun: function %d is null", i);
      Py_DECREF(self);
      return NULL;
    }
  }
  self->call = (etm_call*)(uintptr_t)call;
  self->etm_run = (etm_run_fn)(uintptr_t)etm_run;
  self->armed = (const int64_t*)(uintptr_t)armed;
  self->images = (etm_rec*)self->call->images;
  self->outs = self->call->outs;
  self->dsts = (int64_t*)self->call->dsts;
  self->out_handles = self->call->out_handles;
  self->n_in = (Py_ssize_t)self->call->n_in;
  self->n_out = (Py_ssize_t)self->call->n_out;
  self->lib.tensor_type = (PyTypeObject*)Py_NewRef(tensor_type);
  self->ctx = Py_NewRef(ctx);
  self->model_ref = Py_NewRef(model_ref);
  self->fallback = Py_NewRef(fallback);
  self->finish = Py_NewRef(finish);
  self->keepalive = Py_NewRef(keepalive);
  self->unchecked = unchecked == Py_None ? NULL : Py_NewRef(unchecked);
  self->device_type = (int32_t)device_type;
  self->acquire = PyObject_GetAttrString(lock, "acquire");
  self->release = PyObject_GetAttrString(lock, "release");
  if (!self->acquire || !self->release || !PyWeakref_Check(model_ref)) goto fail;
  if (read_expected(self, expect_in, self->n_in, &self->expect_in, "expect_in") < 0 ||
      read_expected(self, expect_out, self->n_out, &self->expect_out, "expect_out") < 0)
    goto fail;
  if (guard != Py_None) {
    self->guard_acquire = PyObject_GetAttrString(guard, "acquire");
    self->guard_release = PyObject_GetAttrString(guard, "release");
    self->guard_owner = Py_NewRef(owner);
    if (!self->guard_acquire || !self->guard_release || !PyWeakref_Check(owner)) goto fail;
  }
  return (PyObject*)self;
fail:
  if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "FastRun: model_ref must be a weakref");
  Py_DECREF(self);
  return NULL;
}

static PyObject* fast_stats(FastRun* self, PyObject* Py_UNUSED(ignored)) {
  return Py_BuildValue("{sLsL}", "fast", self->fast_runs, "fallback", self->fallbacks);
}

// the probe fast_run.py checks the THPVariable layout with: the data pointer libtorch
// reports for the at::Tensor right after the object header
static PyObject* probe_data_ptr(PyObject* Py_UNUSED(module), PyObject* args) {
  PyObject* t;
  unsigned long long fn;
  if (!PyArg_ParseTuple(args, "OK", &t, &fn)) return NULL;
  void* data = NULL;
  if (((int32_t(*)(void*, void**))(uintptr_t)fn)(etm_at_tensor(t), &data)) Py_RETURN_NONE;
  return PyLong_FromVoidPtr(data);
}

static PyMethodDef fast_methods[] = {
    {"stats", (PyCFunction)fast_stats, METH_NOARGS, "{'fast': runs served here, 'fallback': ...}"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject FastRunType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "etmetal_fast_run.FastRun",
    .tp_basicsize = sizeof(FastRun),
    .tp_dealloc = (destructor)fast_dealloc,
    .tp_vectorcall_offset = offsetof(FastRun, vectorcall),
    .tp_call = PyVectorcall_Call,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "One model's steady-state run in one call (etmetal.shims.fast_run).",
    .tp_methods = fast_methods,
    .tp_new = fast_new,
};

static PyMethodDef module_methods[] = {
    {"probe_data_ptr", probe_data_ptr, METH_VARARGS, "data pointer of a tensor's at::Tensor"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef fast_module = {
    PyModuleDef_HEAD_INIT, "etmetal_fast_run", NULL, -1, module_methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit_etmetal_fast_run(void) {
  if (etm_fast_call_init() < 0 || PyType_Ready(&FastRunType) < 0) return NULL;
  PyObject* m = PyModule_Create(&fast_module);
  if (!m) return NULL;
  if (PyModule_AddObjectRef(m, "FastRun", (PyObject*)&FastRunType) < 0) {
    Py_DECREF(m);
    return NULL;
  }
  return m;
}
