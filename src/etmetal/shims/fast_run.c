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
// A model of the emulated Metal device runs this way too: its inputs are host memory lent
// as device-13 records (as steady_run.py lends them), and the launch failures its device
// records (the wrapper ignores their return codes) are read in C before and after the run:
// one recorded before declines the call, one recorded during it is finished by Python,
// which raises it with the general path's message.
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
// shim header (aoti_torch/c/shim.h). Reading and making the tensors is
// fast_run_tensors.c's; this file is the call: locks, `running`, the run and its result.
#include "fast_run.h"  // first: Python.h sets the feature macros <time.h> reads

#include <time.h>

static PyObject* s_running;
static PyObject* s_owner;
static PyObject* s_unchecked;

// 1 when a device recorded a launch failure the .so could not see (the Metal wrapper
// ignores its kernel calls' return codes); an attribute that cannot be read counts as one,
// so Python's path, which reads it too, reports it
static int unchecked_set(FastRun* self) {
  if (!self->unchecked) return 0;
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(self->unchecked); i++) {
    PyObject* message = PyObject_GetAttr(PyTuple_GET_ITEM(self->unchecked, i), s_unchecked);
    int set = message ? PyObject_IsTrue(message) : -1;
    Py_XDECREF(message);
    if (set) {
      if (set < 0) PyErr_Clear();
      return 1;
    }
  }
  return 0;
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
  // a launch failure recorded during the run: Python finishes it and raises it
  int unusual = rc != 0 || c->pending || c->leftover || unchecked_set(self);
  for (Py_ssize_t i = 0; i < n_out; i++) {
    PyObject* item;
    if (unusual && self->out_handles[i])  // Python takes this handle
      item = PyLong_FromVoidPtr(self->out_handles[i]);
    else
      item = etm_wrap(&self->lib, made[i]);
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
    PyObject* want = self->expect_out ? PyTuple_GET_ITEM(self->expect_out, i) : NULL;
    if (!etm_output_served(&self->lib, &self->outs[i], want, self->copy_limit)) return 0;
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
  // a failure recorded before this run (outside any run): the Python path clears it first
  int served = running == Py_None && model != Py_None && *self->armed && outputs_served(self) &&
               PyTuple_GET_SIZE(held) == self->n_in && !unchecked_set(self);
  for (Py_ssize_t i = 0; served && i < self->n_in; i++) {
    PyObject* want = self->expect_in ? PyTuple_GET_ITEM(self->expect_in, i) : NULL;
    served = etm_write_input(&self->lib, PyTuple_GET_ITEM(held, i), want, self->device_type,
                             &self->images[i]);
  }
  if (!served) {
    result = Py_NewRef(Py_NotImplemented);
    goto unlock;
  }
  if (!etm_make_outputs(&self->lib, self->outs, n_out, made, self->dsts, &n_made)) {
    // libtorch could not make one: the Python path reports it
    result = Py_NewRef(Py_NotImplemented);
    goto unlock;
  }
  if (PyObject_SetAttr(self->ctx, s_running, model) < 0) goto unlock;
  result = run_locked(self, held, made);
  if (set_attr(self->ctx, s_running, Py_None) < 0) Py_CLEAR(result);
unlock:
  etm_delete_outputs(&self->lib, made, n_made);
  Py_XDECREF(held);
  Py_XDECREF(running);
  if (release_lock(self->release) < 0) Py_CLEAR(result);
  return result;
}

PyObject* etm_fast_call(PyObject* callable, PyObject* const* args, size_t nargsf,
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
    if (Py_TYPE(items[i]) != self->lib.tensor_type)
      return call_fallback(self, args, nargsf, kwnames);
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

int etm_fast_call_init(void) {
  s_running = PyUnicode_InternFromString("running");
  s_owner = PyUnicode_InternFromString("_owner");
  s_unchecked = PyUnicode_InternFromString("unchecked_error");
  return s_running && s_owner && s_unchecked ? 0 : -1;
}
