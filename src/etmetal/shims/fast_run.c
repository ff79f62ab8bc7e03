// The steady-state run of an AotiModel as one CPython call (shims/fast_run.py).
//
// steady_run.py prepares an etm_call once and calls etm_run through ctypes; around that
// call each run still spends microseconds of Python reading tensor attributes, making the
// output tensors and taking the locks. For a small model that is most of the run. This
// object does the same steps in C: it reads each input torch tensor through libtorch's
// exported aoti_torch_get_* (a THPVariable holds its at::Tensor right after the object
// header: python_variable.h; fast_run.py checks that on a probe tensor before it builds
// one), writes the record images, makes each output with libtorch's exported
// aoti_torch_empty_strided, runs etm_run and hands the outputs back with THPVariable_Wrap.
//
// It serves only the ordinary case and declines everything else before anything runs, by
// calling the Python path it stands in front of (the fallback) with the same arguments:
// another number of arguments, a value that is not exactly a torch.Tensor, a tensor that
// is not a dense CPU tensor of a dtype the records know, an output whose geometry is not
// predicted or is too large to copy, a nested run, a closed model. The locks are taken as
// the Python path takes them (blocking, the GIL released while waiting). A run that did
// start but came back unusual (an error code, an output Python must take, an input Python
// adopted) is finished by Python (`finish`), under the same locks.
//
// Nothing is compiled against libtorch: the libtorch functions are addresses fast_run.py
// takes from the libtorch torch has loaded, called with the C signatures of torch's
// shim header (aoti_torch/c/shim.h).
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#include "native_tensors.h"

typedef int32_t (*get_ptr_fn)(void*, void**);
typedef int32_t (*get_i64p_fn)(void*, int64_t**);
typedef int32_t (*get_i64_fn)(void*, int64_t*);
typedef int32_t (*get_i32_fn)(void*, int32_t*);
typedef int32_t (*empty_fn)(int64_t, const int64_t*, const int64_t*, int32_t, int32_t, int32_t,
                            void**);
typedef int32_t (*delete_fn)(void*);
typedef PyObject* (*wrap_fn)(const void*);  // THPVariable_Wrap(const at::TensorBase&)
typedef int32_t (*etm_run_fn)(etm_call*);

enum { F_DATA, F_SIZES, F_STRIDES, F_DTYPE, F_DIM, F_OFFSET, F_STORAGE, F_DEVICE, F_LAYOUT,
       F_EMPTY, F_DELETE, F_WRAP, F_COUNT };

#define COPY_LIMIT (64 << 10)  // steady_run.COPY_LIMIT: larger outputs take the Python path

typedef struct {
  PyObject_HEAD
  vectorcallfunc vectorcall;
  etm_call* call;
  etm_run_fn etm_run;
  etm_rec* images;
  const etm_out* outs;  // the predicted output geometry (SteadyRun.learn_output writes it)
  int64_t* dsts;
  void** out_handles;
  const int64_t* armed;  // SteadyRun.armed: 1 once the first run is done, 0 after close
  Py_ssize_t n_in, n_out;
  void* fn[F_COUNT];
  int8_t itemsize[ETM_NDTYPES];
  PyTypeObject* tensor_type;
  PyObject* ctx;         // the ShimContext: `running` is read and set around the run
  PyObject* acquire;     // ctx.run_lock.acquire / .release
  PyObject* release;
  PyObject* model_ref;   // weakref to the model, the context's `running` during the run
  PyObject* fallback;    // the Python path: called with the caller's arguments
  PyObject* finish;      // finish(inputs, rc, results): a run that came back unusual
  PyObject* keepalive;   // the SteadyRun that owns the buffers above
  // optional: the layouts the caller's inputs and the outputs must have (a .pte method's
  // planned tensors); anything else is the fallback's to copy or report
  etm_out* expect_in;
  etm_out* expect_out;
  // optional: a Method's lock and the object whose `_owner` is the running thread
  PyObject* guard_acquire;
  PyObject* guard_release;
  PyObject* guard_owner;  // weakref: the owner holds this object
  long long fast_runs, fallbacks;
  int release_gil;  // > 0: release the GIL around the next runs (see run_locked)
} FastRun;

#define RELEASE_RUNS 64

static PyObject* s_running;
static PyObject* s_owner;

static int same_geometry(const etm_out* a, int32_t dtype, int64_t dim, const int64_t* sizes,
                         const int64_t* strides) {
  return a->dtype == dtype && a->dim == dim &&
         !memcmp(a->sizes, sizes, sizeof(int64_t) * (size_t)dim) &&
         !memcmp(a->strides, strides, sizeof(int64_t) * (size_t)dim);
}

// the record image of input i from tensor t; 0: not this path's to serve
static int write_input(FastRun* self, Py_ssize_t i, PyObject* t) {
  if (Py_TYPE(t) != self->tensor_type) return 0;
  void* h = (char*)t + sizeof(PyObject);  // THPVariable.cdata, an at::Tensor
  int32_t device = -1, layout = -1, dtype = -1;
  int64_t dim = -1, offset = 0, storage = 0;
  int64_t *sizes = NULL, *strides = NULL;
  void* data = NULL;
  if (((get_i32_fn)self->fn[F_DEVICE])(h, &device) || device != 0) return 0;
  if (((get_i32_fn)self->fn[F_LAYOUT])(h, &layout) || layout != 0) return 0;
  if (((get_i32_fn)self->fn[F_DTYPE])(h, &dtype) || dtype < 0 || dtype >= ETM_NDTYPES ||
      !self->itemsize[dtype])
    return 0;
  if (((get_i64_fn)self->fn[F_DIM])(h, &dim) || dim < 0 || dim > ETM_MAX_DIMS) return 0;
  if (((get_i64p_fn)self->fn[F_SIZES])(h, &sizes) ||
      ((get_i64p_fn)self->fn[F_STRIDES])(h, &strides) ||
      ((get_i64_fn)self->fn[F_OFFSET])(h, &offset) ||
      ((get_i64_fn)self->fn[F_STORAGE])(h, &storage) ||
      ((get_ptr_fn)self->fn[F_DATA])(h, &data))
    return 0;
  if (self->expect_in && !same_geometry(&self->expect_in[i], dtype, dim, sizes, strides))
    return 0;
  etm_rec* r = &self->images[i];
  memset(r, 0, sizeof(*r));
  int64_t numel = 1;
  for (int64_t d = 0; d < dim; d++) numel *= sizes[d];
  r->data_ptr = (int64_t)(intptr_t)data;
  r->dim = dim;
  r->offset = offset;
  r->numel = numel;
  r->dtype = dtype;
  r->device_type = 0;
  memcpy(r->sizes, sizes, sizeof(int64_t) * (size_t)dim);
  memcpy(r->strides, strides, sizeof(int64_t) * (size_t)dim);
  r->native = 2;  // borrowed: etm_run lends it, nothing frees the caller's memory
  r->storage_bytes = storage;
  return 1;
}

static PyObject* call_fallback(FastRun* self, PyObject* const* args, size_t nargsf,
                               PyObject* kwnames) {
  self->fallbacks++;
  return PyObject_Vectorcall(self->fallback, args, nargsf, kwnames);
}

// a blocking acquire, as the Python path's `with lock:` (a lock's acquire waits with the
// GIL released); 1 once held, -1: an error is set. Without arguments: parsing a `blocking`
// argument costs more than the rest of the acquire
static int acquire_lock(PyObject* acquire) {
  PyObject* got = PyObject_CallNoArgs(acquire);
  if (!got) return -1;
  Py_DECREF(got);
  return 1;
}

// run with the pending exception (the run's, if it failed) put aside and restored: a call
// made while one is set would raise SystemError. -1: the call itself failed (its error set)
static int release_lock(PyObject* release) {
  PyObject *type, *value, *tb;
  PyErr_Fetch(&type, &value, &tb);
  PyObject* r = PyObject_CallNoArgs(release);
  if (!r) {
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(tb);
    return -1;
  }
  Py_DECREF(r);
  PyErr_Restore(type, value, tb);
  return 0;
}

static int set_attr(PyObject* obj, PyObject* name, PyObject* value) {
  PyObject *type, *val, *tb;
  PyErr_Fetch(&type, &val, &tb);
  if (PyObject_SetAttr(obj, name, value) < 0) {
    Py_XDECREF(type);
    Py_XDECREF(val);
    Py_XDECREF(tb);
    return -1;
  }
  PyErr_Restore(type, val, tb);
  return 0;
}

// inputs and outputs set up, locks held: run, then build the result (new reference)
static PyObject* run_locked(FastRun* self, PyObject* inputs, void** made) {
  etm_call* c = self->call;
  int32_t rc;
  // The GIL is released around runs only while recent runs were long: a run that fits
  // between two ticks of the coarse clock (a few ms; CPython itself hands the GIL to a
  // waiting thread only every 5 ms) keeps it, since dropping and retaking it costs a small
  // model's run several percent. A run that crossed a tick makes the next RELEASE_RUNS
  // release it again; shims that call Python meanwhile run on this thread either way
  struct timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC_COARSE, &t0);
  if (self->release_gil > 0) {
    Py_BEGIN_ALLOW_THREADS
    rc = self->etm_run(c);
    Py_END_ALLOW_THREADS
  } else {
    rc = self->etm_run(c);
  }
  clock_gettime(CLOCK_MONOTONIC_COARSE, &t1);
  if (t1.tv_nsec != t0.tv_nsec || t1.tv_sec != t0.tv_sec)
    self->release_gil = RELEASE_RUNS;
  else if (self->release_gil > 0)
    self->release_gil--;
  Py_ssize_t n_out = self->n_out;
  if (rc == ETM_NO_SLOT) return Py_NewRef(Py_NotImplemented);  // nothing ran
  PyObject* results = PyList_New(n_out);
  if (!results) return NULL;
  int unusual = rc != 0 || c->pending || c->leftover;
  for (Py_ssize_t i = 0; i < n_out; i++) {
    PyObject* item;
    if (unusual && self->out_handles[i])  // Python takes this handle
      item = PyLong_FromVoidPtr(self->out_handles[i]);
    else
      item = ((wrap_fn)self->fn[F_WRAP])(made[i]);
    if (!item) {
      Py_DECREF(results);
      return NULL;
    }
    PyList_SET_ITEM(results, i, item);
  }
  if (!unusual) {
    self->fast_runs++;
    return results;
  }
  PyObject* out = PyObject_CallFunction(self->finish, "OiO", inputs, (int)rc, results);
  Py_DECREF(results);
  return out;
}

// the model's part: run lock, `running`, outputs made, etm_run (NotImplemented: declined)
// 1 when this run can go this way: every output predicted, small, laid out as expected
// (read under the run lock: the Python path's first run writes the predictions)
static int outputs_served(FastRun* self) {
  for (Py_ssize_t i = 0; i < self->n_out; i++) {
    const etm_out* o = &self->outs[i];
    if (o->nbytes < 0 || o->nbytes > COPY_LIMIT || o->dim > ETM_MAX_DIMS) return 0;
    if (self->expect_out &&
        !same_geometry(&self->expect_out[i], o->dtype, o->dim, o->sizes, o->strides))
      return 0;
  }
  return 1;
}

static PyObject* run_model(FastRun* self, PyObject* inputs) {
  Py_ssize_t n_out = self->n_out;
  void* made[ETM_TABLE_SLOTS / 1024];
  if (n_out > (Py_ssize_t)(sizeof(made) / sizeof(made[0]))) return Py_NewRef(Py_NotImplemented);
  if (acquire_lock(self->acquire) < 0) return NULL;
  PyObject *result = NULL, *held = NULL;
  PyObject* running = PyObject_GetAttr(self->ctx, s_running);
  PyObject* model = running ? PyWeakref_GetObject(self->model_ref) : NULL;
  Py_ssize_t n_made = 0;
  if (!running) goto unlock;
  // nested, closed, not armed yet: Python's. The images are shared by every run of this
  // model, so they are written only now, under the run lock, from the caller's sequence
  // read again (waiting for the lock let other threads run) and held: the run reads the
  // inputs' memory whatever the caller's list goes through meanwhile
  held = PySequence_Tuple(inputs);
  if (!held) goto unlock;
  int served = running == Py_None && model != Py_None && *self->armed && outputs_served(self) &&
               PyTuple_GET_SIZE(held) == self->n_in;
  for (Py_ssize_t i = 0; served && i < self->n_in; i++)
    served = write_input(self, i, PyTuple_GET_ITEM(held, i));
  if (!served) {
    result = Py_NewRef(Py_NotImplemented);
    goto unlock;
  }
  for (; n_made < n_out; n_made++) {
    const etm_out* o = &self->outs[n_made];
    void* data = NULL;
    if (((empty_fn)self->fn[F_EMPTY])(o->dim, o->sizes, o->strides, o->dtype, 0, 0,
                                     &made[n_made]))
      break;
    if (((get_ptr_fn)self->fn[F_DATA])(made[n_made], &data)) {
      n_made++;
      break;
    }
    self->dsts[n_made] = (int64_t)(intptr_t)data;
  }
  if (n_made < n_out) {  // libtorch could not make one: the Python path reports it
    result = Py_NewRef(Py_NotImplemented);
    goto unlock;
  }
  if (PyObject_SetAttr(self->ctx, s_running, model) < 0) goto unlock;
  result = run_locked(self, held, made);
  if (set_attr(self->ctx, s_running, Py_None) < 0) Py_CLEAR(result);
unlock:
  for (Py_ssize_t i = 0; i < n_made; i++) ((delete_fn)self->fn[F_DELETE])(made[i]);
  Py_XDECREF(held);
  Py_XDECREF(running);
  if (release_lock(self->release) < 0) Py_CLEAR(result);
  return result;
}

static PyObject* fast_call(PyObject* callable, PyObject* const* args, size_t nargsf,
                           PyObject* kwnames) {
  FastRun* self = (FastRun*)callable;
  if (PyVectorcall_NARGS(nargsf) != 1 || kwnames) return call_fallback(self, args, nargsf, kwnames);
  PyObject* inputs = args[0];
  if (!PyList_CheckExact(inputs) && !PyTuple_CheckExact(inputs))
    return call_fallback(self, args, nargsf, kwnames);
  Py_ssize_t n = PySequence_Fast_GET_SIZE(inputs);
  PyObject** items = PySequence_Fast_ITEMS(inputs);
  if (n != self->n_in) return call_fallback(self, args, nargsf, kwnames);
  for (Py_ssize_t i = 0; i < n; i++)  // not a tensor this path serves: decline at once
    if (Py_TYPE(items[i]) != self->tensor_type) return call_fallback(self, args, nargsf, kwnames);
  PyObject* result;
  if (self->guard_acquire) {
    PyObject* owner = PyWeakref_GetObject(self->guard_owner);  // borrowed; the caller's
    if (owner == Py_None) return call_fallback(self, args, nargsf, kwnames);
    PyObject* me = PyLong_FromUnsignedLong(PyThread_get_thread_ident());
    if (!me) return NULL;
    // this thread inside its own execute (re-entrant): the Python path refuses it by name
    PyObject* current = PyObject_GetAttr(owner, s_owner);
    int mine = current ? PyObject_RichCompareBool(current, me, Py_EQ) : -1;
    Py_XDECREF(current);
    if (mine) {
      Py_DECREF(me);
      return mine < 0 ? NULL : call_fallback(self, args, nargsf, kwnames);
    }
    if (acquire_lock(self->guard_acquire) < 0) {
      Py_DECREF(me);
      return NULL;
    }
    Py_INCREF(owner);
    int set = PyObject_SetAttr(owner, s_owner, me);
    Py_DECREF(me);
    if (set < 0) {
      Py_DECREF(owner);
      release_lock(self->guard_release);
      return NULL;
    }
    result = run_model(self, inputs);
    if (set_attr(owner, s_owner, Py_None) < 0) Py_CLEAR(result);
    Py_DECREF(owner);
    if (release_lock(self->guard_release) < 0) Py_CLEAR(result);
  } else {
    result = run_model(self, inputs);
  }
  if (result == Py_NotImplemented) {
    Py_DECREF(result);
    return call_fallback(self, args, nargsf, kwnames);
  }
  return result;
}

static int read_layouts(PyObject* obj, Py_ssize_t n, etm_out** dst, const char* what) {
  if (obj == Py_None) return 0;
  Py_buffer view;
  if (PyObject_GetBuffer(obj, &view, PyBUF_SIMPLE) < 0) return -1;
  if (view.len != (Py_ssize_t)sizeof(etm_out) * n) {
    PyBuffer_Release(&view);
    PyErr_Format(PyExc_ValueError, "%s: %zd bytes, expected %zd etm_out", what, view.len, n);
    return -1;
  }
  *dst = PyMem_Malloc(sizeof(etm_out) * (size_t)(n ? n : 1));
  if (*dst) memcpy(*dst, view.buf, (size_t)view.len);
  PyBuffer_Release(&view);
  if (!*dst) PyErr_NoMemory();
  return *dst ? 0 : -1;
}

static void fast_dealloc(FastRun* self) {
  Py_XDECREF(self->tensor_type);
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
  PyMem_Free(self->expect_in);
  PyMem_Free(self->expect_out);
  Py_TYPE(self)->tp_free((PyObject*)self);
}

static PyObject* fast_new(PyTypeObject* type, PyObject* args, PyObject* kwargs) {
  static char* names[] = {"call", "etm_run", "armed", "fns", "itemsize", "tensor_type",
                          "ctx", "lock", "model_ref", "fallback", "finish", "keepalive",
                          "expect_in", "expect_out", "guard", "guard_owner", NULL};
  unsigned long long call, etm_run, armed;
  PyObject *fns, *tensor_type, *ctx, *lock, *model_ref, *fallback, *finish, *keepalive;
  PyObject *expect_in = Py_None, *expect_out = Py_None, *guard = Py_None, *owner = Py_None;
  Py_buffer sizes;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "KKKO!y*O!OOOOOO|OOOO", names, &call, &etm_run,
                                   &armed, &PyTuple_Type, &fns, &sizes, &PyType_Type,
                                   &tensor_type, &ctx, &lock, &model_ref, &fallback, &finish,
                                   &keepalive, &expect_in, &expect_out, &guard, &owner))
    return NULL;
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
  self->vectorcall = fast_call;
  self->release_gil = RELEASE_RUNS;  // until runs show they are short
  memcpy(self->itemsize, sizes.buf, ETM_NDTYPES);
  PyBuffer_Release(&sizes);
  for (int i = 0; i < F_COUNT; i++) {
    self->fn[i] = PyLong_AsVoidPtr(PyTuple_GET_ITEM(fns, i));
    if (!self->fn[i]) {
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
  self->tensor_type = (PyTypeObject*)Py_NewRef(tensor_type);
  self->ctx = Py_NewRef(ctx);
  self->model_ref = Py_NewRef(model_ref);
  self->fallback = Py_NewRef(fallback);
  self->finish = Py_NewRef(finish);
  self->keepalive = Py_NewRef(keepalive);
  self->acquire = PyObject_GetAttrString(lock, "acquire");
  self->release = PyObject_GetAttrString(lock, "release");
  if (!self->acquire || !self->release || !PyWeakref_Check(model_ref)) goto fail;
  if (read_layouts(expect_in, self->n_in, &self->expect_in, "expect_in") < 0 ||
      read_layouts(expect_out, self->n_out, &self->expect_out, "expect_out") < 0)
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
  if (((get_ptr_fn)(uintptr_t)fn)((char*)t + sizeof(PyObject), &data)) Py_RETURN_NONE;
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
  s_running = PyUnicode_InternFromString("running");
  s_owner = PyUnicode_InternFromString("_owner");
  if (!s_running || !s_owner || PyType_Ready(&FastRunType) < 0) return NULL;
  PyObject* m = PyModule_Create(&fast_module);
  if (!m) return NULL;
  if (PyModule_AddObjectRef(m, "FastRun", (PyObject*)&FastRunType) < 0) {
    Py_DECREF(m);
    return NULL;
  }
  return m;
}
