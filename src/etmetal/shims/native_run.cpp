// The one-call steady run (etm_run, shims/steady_run.py): the inputs lent as borrowed
// records, the container's run, then what is left of the inputs and the outputs copied out
// where Python asked. Part of the native tensors (native_tensors.cpp, native_records.h).
#include <cstring>

#include "native_records.h"

extern "C" {

ETM_EXPORT int32_t etm_run(etm_call* c) {
  if (!etm_slots_free(c->n_in)) return ETM_NO_SLOT;
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

}  // extern "C"
