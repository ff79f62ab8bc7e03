// The FastRun object (fast_run.c: its call; fast_run_type.c: its construction and the
// module; fast_run_tensors.c: the tensors it reads and makes).
#ifndef ETMETAL_FAST_RUN_H
#define ETMETAL_FAST_RUN_H

#include "fast_run_tensors.h"

typedef int32_t (*etm_run_fn)(etm_call*);

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
  int64_t copy_limit;  // steady_run.COPY_LIMIT: a larger output takes the Python path
  etm_torch lib;  // the libtorch functions and the dtypes served
  PyObject* ctx;         // the ShimContext: `running` is read and set around the run
  PyObject* acquire;     // ctx.run_lock.acquire / .release
  PyObject* release;
  PyObject* model_ref;   // weakref to the model, the context's `running` during the run
  PyObject* fallback;    // the Python path: called with the caller's arguments
  PyObject* finish;      // finish(inputs, rc, results): a run that came back unusual
  PyObject* keepalive;   // the SteadyRun that owns the buffers above
  // optional: tuples of tensors whose layouts, as they are at each call, the caller's
  // inputs and the outputs must have (a .pte method's planned tensors, which a dynamic
  // shape resizes); anything else is the fallback's to copy or report
  PyObject* expect_in;
  PyObject* expect_out;
  // optional: a Method's lock and the object whose `_owner` is the running thread
  PyObject* guard_acquire;
  PyObject* guard_release;
  PyObject* guard_owner;  // weakref: the owner holds this object
  // optional (a device model's): the objects whose `unchecked_error` (a str) records a
  // launch failure the .so could not see; set before a run: declined, after: finished by
  // Python, which raises it (ModelRunner.finish_fast)
  PyObject* unchecked;
  int32_t device_type;  // the c10 device the inputs are lent as (SteadyRun.device_type)
  long long fast_runs, fallbacks;
  int release_gil;  // > 0: release the GIL around the next runs (see run_locked)
} FastRun;

#define RELEASE_RUNS 64

// the vectorcall of a FastRun (fast_run.c)
PyObject* etm_fast_call(PyObject* callable, PyObject* const* args, size_t nargsf,
                        PyObject* kwnames);

// the names the call reads and sets; 0 once made (the module's init calls it)
int etm_fast_call_init(void);

#endif
