// Runs a compiled MSL kernel over a grid with Metal's execution model (see msl_abi.h).
//
// Threadgroups run one after another on the calling OS thread, or spread over a small pool of
// OS threads (msl_pool.cpp, appended to this file). A kernel that can never synchronise
// (msl_classify.py) has a loop entry: its threadgroup runs as one plain loop over its threads,
// with no fiber at all; should such a thread reach a barrier anyway, the dispatch stops with
// an error. The threads of any other kernel's threadgroup run as fibers: a fiber runs threads to completion one after another and only switches when a
// thread blocks at a threadgroup_barrier or a SIMD-group operation, so a kernel that never
// synchronises costs one call per thread. Blocking rules:
//   - a barrier releases when every thread of the threadgroup has reached it (a thread that
//     returns without reaching it is a deadlock, reported as an error);
//   - a SIMD operation completes when every live lane of the 32-lane SIMD group has reached a
//     SIMD operation; lanes that have returned are inactive (partial SIMD groups at the tail of
//     a threadgroup simply have no such lanes);
//   - when nothing can run any more (every live thread blocked), the lanes waiting at a SIMD
//     operation while the rest of their SIMD group waits at a barrier took a divergent branch:
//     their operation completes with exactly them active (c10's threadgroup reductions do this);
//   - when nothing can run and no SIMD operation can complete, the threadgroup is deadlocked.
// Limitation: g++ knows nothing of convergence, so lanes are matched by operation (kind and
// operand size), not by call site. Lanes of one SIMD group meeting at different operations
// are reported as divergent (an error, not a guess); two branches of an if/else that both
// call the same operation (say simd_sum) would be combined into one operation over both
// branches' lanes, where Metal runs two. c10's and Inductor's kernels do neither.
// Each SIMD group exchanges values through two slot buffers used alternately: a lane writes
// the next operation's value while its siblings may still be reading the previous result.
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>

#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "msl_abi.h"

#if !defined(__x86_64__)
#include <ucontext.h>
#endif

namespace {

constexpr uint32_t kWidth = ETM_MSL_SIMD_WIDTH;
// Virtual size; pages are committed as a kernel's thread touches them.
constexpr size_t kStackBytes = 1024 * 1024;
constexpr uint32_t kMaxThreadsPerGroup = 1024;

// ---- context switching ------------------------------------------------------------------
#if defined(__x86_64__)
// etm_msl_switch(save, to): saves the callee-saved registers and the stack pointer into *save,
// then continues on the stack `to` (a stack saved the same way, or a fresh one).
extern "C" void etm_msl_switch(void** save, void* to);
asm(R"(
.text
.p2align 4
.type etm_msl_switch,@function
etm_msl_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
.size etm_msl_switch,.-etm_msl_switch
)");
#endif

struct Fiber {
  unsigned char* stack = nullptr;
  // Where its stack starts below the top. Stacks are 1 MiB apart, so unstaggered the live
  // frames of every fiber would share the same cache sets and evict each other at each switch.
  uint32_t colour = 0;
#if defined(__x86_64__)
  void* sp = nullptr;
#else
  ucontext_t ctx;
#endif
};

struct Thread {
  etm_msl_thread info;
  Fiber* fiber;
  uint8_t state;  // 0 not started, 1 running/runnable, 2 at barrier, 3 at SIMD op, 4 done
  uint8_t result_phase;
  uint32_t result_active;
};

struct SimdGroup {
  uint32_t live;     // lanes that have not returned
  uint32_t waiting;  // lanes blocked at a SIMD operation
  uint32_t wait_mask;
  uint32_t key;
  bool mismatch;
  uint8_t phase;
  alignas(64) unsigned char slots[2][kWidth][ETM_MSL_SLOT_BYTES];
};

struct Group {
  etm_msl_entry entry;
  void* const* args;
  uint32_t n;          // threads in this threadgroup
  uint32_t nsimd;      // its SIMD groups (the vectors below may be longer)
  uint32_t started;    // threads handed to a fiber so far
  uint32_t live;       // threads not returned
  uint32_t at_barrier;
  std::vector<Thread> threads;
  std::vector<SimdGroup> simds;
  std::vector<int32_t> runnable;
  bool failed;
  char message[512];
};

// The checker (msl_check.cpp, appended to this file): set only while a checked dispatch runs,
// so an unchecked one pays a null test per threadgroup and per barrier, nothing per access.
struct Checker;
void check_group_begin(Checker* c);
void check_barrier(Checker* c);

struct Worker {
  Checker* checker = nullptr;
  bool looping = false;  // running a loop entry: no fiber to block
  // etm_msl_lockstep: SIMD operations served from tables without blocking. Operation j of a
  // call: j < ls_pass is answered with every lane's recorded operand, j == ls_pass records
  // the caller's, a later one answers as if the lane were alone (its result is discarded)
  static constexpr uint32_t kMaxLockstepOps = 8;
  bool ls_on = false, ls_bad = false;
  uint32_t ls_pass = 0, ls_lane = 0, ls_active = 0, ls_count = 0;
  uint32_t ls_key[kMaxLockstepOps] = {}, ls_rec[kMaxLockstepOps] = {};
  alignas(64) unsigned char ls_slots[kMaxLockstepOps][kWidth][ETM_MSL_SLOT_BYTES];
  alignas(64) unsigned char ls_alone[kWidth][ETM_MSL_SLOT_BYTES];
  jmp_buf escape;        // where a loop-run thread that synchronises is stopped
  std::vector<Fiber*> fibers;  // all fibers this OS thread owns
  std::vector<Fiber*> free_fibers;
  Group* group = nullptr;
  int32_t current = -1;  // index of the running thread
  Fiber* current_fiber = nullptr;
  Group scratch;
#if defined(__x86_64__)
  void* sched_sp = nullptr;
#else
  ucontext_t sched_ctx;
#endif
  ~Worker() {
    for (Fiber* f : fibers) {
      munmap(f->stack, kStackBytes);
      delete f;
    }
  }
};

// A thread's Worker is reached through one pointer of static TLS (initial-exec: a plain
// thread-pointer-relative load, where a thread_local object of a dlopen'ed library costs a
// __tls_get_addr call on every access, several per kernel thread); it is made on the
// thread's first dispatch and its owner frees it when the thread exits.
__attribute__((tls_model("initial-exec"))) thread_local Worker* tls_worker_ptr = nullptr;
thread_local std::unique_ptr<Worker> tls_worker_owner;

__attribute__((noinline)) Worker* make_worker() {
  tls_worker_owner.reset(new Worker);
  tls_worker_ptr = tls_worker_owner.get();
  return tls_worker_ptr;
}

inline Worker& worker() {
  Worker* w = tls_worker_ptr;
  return __builtin_expect(w != nullptr, 1) ? *w : *make_worker();
}



void fail(Group* g, const char* fmt, ...) {
  if (g->failed) return;
  g->failed = true;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(g->message, sizeof g->message, fmt, ap);
  va_end(ap);
}

// ---- fibers ------------------------------------------------------------------------------
void switch_to_scheduler(Worker& w) {
#if defined(__x86_64__)
  etm_msl_switch(&w.current_fiber->sp, w.sched_sp);
#else
  swapcontext(&w.current_fiber->ctx, &w.sched_ctx);
#endif
}

void resume(Worker& w, Fiber* f) {
  w.current_fiber = f;
#if defined(__x86_64__)
  etm_msl_switch(&w.sched_sp, f->sp);
#else
  swapcontext(&w.sched_ctx, &f->ctx);
#endif
}

void finish_thread(Group* g, int32_t t);

// A fiber's life: run not-yet-started threads one after another until none is left, then go
// back to the scheduler for good (it is re-initialised when reused).
void fiber_main() {
  Worker& w = worker();
  Group* g = w.group;
  Fiber* self = w.current_fiber;
  while (!g->failed && g->started < g->n) {
    int32_t t = int32_t(g->started++);
    Thread& th = g->threads[t];
    th.state = 1;
    th.fiber = self;
    w.current = t;
    g->entry(g->args, &th.info);
    finish_thread(g, t);
  }
  w.free_fibers.push_back(self);
  switch_to_scheduler(w);
  __builtin_trap();  // never resumed
}

#if defined(__x86_64__)
extern "C" void etm_msl_fiber_start() { fiber_main(); }
#endif

Fiber* new_fiber(Worker& w) {
  Fiber* f;
  if (!w.free_fibers.empty()) {
    f = w.free_fibers.back();
    w.free_fibers.pop_back();
  } else {
    void* mem = mmap(nullptr, kStackBytes, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (mem == MAP_FAILED) return nullptr;
    mprotect(mem, 4096, PROT_NONE);  // guard page: a stack overflow faults instead of corrupting
    f = new Fiber;
    f->stack = static_cast<unsigned char*>(mem);
    f->colour = uint32_t((w.fibers.size() * 11) % 64) * 64;  // 64 cache lines, spread
    w.fibers.push_back(f);
  }
#if defined(__x86_64__)
  // A fresh stack as etm_msl_switch leaves one: six saved registers, then the return address
  // (the fiber entry); entry sees a 16-byte aligned stack minus the return address slot.
  uintptr_t top = (uintptr_t(f->stack) + kStackBytes - f->colour) & ~uintptr_t(15);
  void** sp = reinterpret_cast<void**>(top - 64);
  for (int i = 0; i < 6; i++) sp[i] = nullptr;
  sp[6] = reinterpret_cast<void*>(&etm_msl_fiber_start);
  sp[7] = nullptr;
  f->sp = sp;
#else
  getcontext(&f->ctx);
  f->ctx.uc_stack.ss_sp = f->stack;
  f->ctx.uc_stack.ss_size = kStackBytes - f->colour;
  f->ctx.uc_link = nullptr;
  makecontext(&f->ctx, fiber_main, 0);
#endif
  return f;
}

// ---- synchronisation ---------------------------------------------------------------------
void make_runnable(Group* g, int32_t t) {
  g->threads[t].state = 1;
  g->runnable.push_back(t);
}

// Completes the pending operation of SIMD group `s` with the lanes waiting at it.
void complete_simd(Group* g, uint32_t s, int32_t self) {
  SimdGroup& sg = g->simds[s];
  if (sg.mismatch) {
    fail(g, "divergent SIMD-group operations: lanes of SIMD group %u wait at different "
            "operations (lanes 0x%08x)", s, sg.wait_mask);
    return;
  }
  const uint32_t base = s * kWidth;
  for (uint32_t l = 0; l < kWidth; l++) {
    if (!((sg.wait_mask >> l) & 1u)) continue;
    Thread& th = g->threads[base + l];
    th.result_phase = sg.phase;
    th.result_active = sg.wait_mask;
    if (int32_t(base + l) != self) make_runnable(g, int32_t(base + l));
  }
  sg.phase ^= 1;
  sg.waiting = 0;
  sg.wait_mask = 0;
  sg.mismatch = false;
}

void release_barrier(Group* g, int32_t self) {
  for (uint32_t t = 0; t < g->n; t++)
    if (g->threads[t].state == 2 && int32_t(t) != self) make_runnable(g, int32_t(t));
  g->at_barrier = 0;
}

void finish_thread(Group* g, int32_t t) {
  Thread& th = g->threads[t];
  th.state = 4;
  g->live--;
  SimdGroup& sg = g->simds[th.info.simd_index];
  sg.live--;
  if (sg.waiting && sg.waiting == sg.live) complete_simd(g, th.info.simd_index, -1);
}

// Called when nothing can run: complete divergent SIMD operations, or report the deadlock.
bool resolve_stall(Group* g) {
  bool progress = false;
  for (uint32_t s = 0; s < g->nsimd && !g->failed; s++) {
    if (g->simds[s].waiting) {
      complete_simd(g, s, -1);
      progress = true;
    }
  }
  if (progress || g->failed) return progress;
  const uint32_t done = g->n - g->live;
  fail(g, "deadlock: %u of %u threads wait at threadgroup_barrier and %u returned without "
          "reaching it (every thread of a threadgroup must reach each barrier)",
       g->at_barrier, g->n, done);
  return false;
}

// The calling thread waits: control passes straight to the next thread that can run (a
// released one, else a fresh fiber for a thread not started yet), without a round trip
// through the scheduler; only when none can run does the scheduler take over (a stall, a
// failure). Whoever resumes this fiber sets w.current_fiber and w.current.
void block(Worker& w) {
  Group* g = w.group;
  Fiber* self = w.current_fiber;
  Fiber* next = nullptr;
  if (!g->failed) {
    if (!g->runnable.empty()) {
      int32_t t = g->runnable.back();
      g->runnable.pop_back();
      w.current = t;
      next = g->threads[t].fiber;
    } else if (g->started < g->n) {
      next = new_fiber(w);  // on failure the scheduler reports it
    }
  }
  if (next == nullptr) {
    switch_to_scheduler(w);
    return;
  }
  w.current_fiber = next;
#if defined(__x86_64__)
  etm_msl_switch(&self->sp, next->sp);
#else
  swapcontext(&self->ctx, &next->ctx);
#endif
}

// ---- the grid ------------------------------------------------------------------------------
int run_group(Worker& w, Group* g) {
  w.group = g;
  while (g->live > 0 && !g->failed) {
    if (!g->runnable.empty()) {
      int32_t t = g->runnable.back();
      g->runnable.pop_back();
      w.current = t;
      resume(w, g->threads[t].fiber);
    } else if (g->started < g->n) {
      Fiber* f = new_fiber(w);
      if (!f) {
        fail(g, "cannot allocate a fiber stack (%s)", strerror(errno));
        break;
      }
      resume(w, f);
    } else {
      resolve_stall(g);
    }
  }
  if (g->failed) {
    // Fibers of blocked threads are abandoned mid-kernel; their stacks are reused.
    w.free_fibers.clear();
    for (Fiber* f : w.fibers) w.free_fibers.push_back(f);
  }
  w.group = nullptr;
  return g->failed ? 1 : 0;
}

// One dispatch: what every threadgroup of it shares.
struct Launch {
  etm_msl_entry entry;
  etm_msl_loop loop;  // null: fibers
  etm_msl_batch batch;  // null: one threadgroup at a time
  void* const* args;
  uint64_t threads[3], group[3];
  uint32_t groups[3];
  uint64_t count;  // threadgroups
  uint32_t per_group;
};

// Runs the threads of the threadgroup `base` describes (tg_id, tg_size, dispatch_tg_size and
// the per-group counts) as fibers, each calling `entry(args, thread)`. Returns 0, or 1 with
// the message in w.scratch.message.
int run_fibers(Worker& w, const etm_msl_thread& base, etm_msl_entry entry, void* const* args) {
  const uint32_t* size = base.tg_size;
  const uint32_t n = size[0] * size[1] * size[2];
  const uint32_t nsimd = (n + kWidth - 1) / kWidth;
  const uint32_t per_group =
      base.dispatch_tg_size[0] * base.dispatch_tg_size[1] * base.dispatch_tg_size[2];
  // The group's bookkeeping is kept per OS thread and only grows: a dispatch allocates nothing.
  Group& g = w.scratch;
  g.entry = entry;
  g.args = args;
  if (g.threads.size() < per_group) g.threads.resize(per_group);
  if (g.simds.size() < (per_group + kWidth - 1) / kWidth)
    g.simds.resize((per_group + kWidth - 1) / kWidth);
  g.runnable.reserve(per_group);
  g.n = n;
  g.nsimd = nsimd;
  g.started = 0;
  g.live = n;
  g.at_barrier = 0;
  g.failed = false;
  g.runnable.clear();
  for (uint32_t s = 0; s < nsimd; s++) {
    SimdGroup& sg = g.simds[s];
    sg.live = (s + 1) * kWidth <= n ? kWidth : n - s * kWidth;
    sg.waiting = 0;
    sg.wait_mask = 0;
    sg.key = 0;
    sg.mismatch = false;
    sg.phase = 0;
  }
  uint32_t p[3] = {0, 0, 0};  // the position in the threadgroup, x fastest
  for (uint32_t i = 0; i < n; i++) {
    Thread& th = g.threads[i];
    etm_msl_thread& t = th.info;
    t = base;
    for (int d = 0; d < 3; d++) {
      t.tg_pos[d] = p[d];
      t.grid_pos[d] = base.tg_id[d] * base.dispatch_tg_size[d] + p[d];
    }
    if (++p[0] == size[0]) {
      p[0] = 0;
      if (++p[1] == size[1]) p[1] = 0, p[2]++;
    }
    t.index_in_tg = i;
    t.lane = i % kWidth;
    t.simd_index = i / kWidth;
    t.quad_index = i / 4;
    t.lane_in_quad = i % 4;
    th.state = 0;
    th.fiber = nullptr;
    th.result_phase = 0;
    th.result_active = 0;
  }
  if (w.checker) check_group_begin(w.checker);
  return run_group(w, &g);
}

// The record of threadgroup `index` (x fastest) of `L`: its fields every thread shares.
void group_record(const Launch& L, uint64_t index, etm_msl_thread& base) {
  const uint32_t gid[3] = {uint32_t(index % L.groups[0]),
                           uint32_t((index / L.groups[0]) % L.groups[1]),
                           uint32_t(index / (uint64_t(L.groups[0]) * L.groups[1]))};
  uint32_t size[3];
  for (int d = 0; d < 3; d++) {
    uint64_t start = uint64_t(gid[d]) * L.group[d];
    size[d] = uint32_t(L.threads[d] - start < L.group[d] ? L.threads[d] - start : L.group[d]);
  }
  const uint32_t n = size[0] * size[1] * size[2];
  for (int d = 0; d < 3; d++) {
    base.tg_id[d] = gid[d];
    base.tg_size[d] = size[d];
    base.dispatch_tg_size[d] = uint32_t(L.group[d]);
    base.grid_size[d] = uint32_t(L.threads[d]);
    base.tgs_per_grid[d] = L.groups[d];
  }
  base.simds_per_tg = (n + kWidth - 1) / kWidth;
  base.simd_size = kWidth;
  base.dispatch_simds_per_tg = (L.per_group + kWidth - 1) / kWidth;
  base.quads_per_tg = (n + 3) / 4;
}

const char kMissedSync[] =
    "a thread reached a threadgroup barrier or SIMD-group operation in a kernel classified as "
    "never synchronising, or outside the statements a split kernel runs on fibers (an etmetal "
    "bug: msl_classify.py, msl_split.py)";

// Runs threadgroup `index` (x fastest) of `L` on this OS thread. Returns 0, or 1 with the
// message in err.
int run_threadgroup(Worker& w, const Launch& L, uint64_t index, char* err, uint64_t err_len) {
  etm_msl_thread base;
  group_record(L, index, base);
  const uint32_t* gid = base.tg_id;
  if (L.loop) {
    // a loop entry, or a split one (msl_split.py): its statements that synchronise call
    // etm_msl_fiber_phase, which leaves through `escape` (2) when their fibers fail
    w.looping = true;
    const int escaped = setjmp(w.escape);
    if (escaped == 0) {
      L.loop(L.args, &base);
      w.looping = false;
      return 0;
    }
    w.looping = false;
    if (escaped == 2) {
      snprintf(err, err_len, "threadgroup (%u, %u, %u): %s", gid[0], gid[1], gid[2],
               w.scratch.message);
      return 1;
    }
    snprintf(err, err_len, "threadgroup (%u, %u, %u): %s", gid[0], gid[1], gid[2], kMissedSync);
    return 1;
  }
  if (run_fibers(w, base, L.entry, L.args) != 0) {
    snprintf(err, err_len, "threadgroup (%u, %u, %u): %s", gid[0], gid[1], gid[2],
             w.scratch.message);
    return 1;
  }
  return 0;
}

// Runs threadgroups [first, first + count) of `L` on this OS thread: in batches of up to
// ETM_MSL_BATCH when the kernel has a batch entry, else one at a time. Returns 0, or 1 with
// the message in err.
int run_threadgroups(Worker& w, const Launch& L, uint64_t first, uint64_t count, char* err,
                     uint64_t err_len) {
  if (L.batch == nullptr || count < 2) {
    for (uint64_t i = first; i < first + count; i++)
      if (run_threadgroup(w, L, i, err, err_len) != 0) return 1;
    return 0;
  }
  etm_msl_thread recs[ETM_MSL_BATCH];
  for (uint64_t i = first; i < first + count; i += ETM_MSL_BATCH) {
    const uint32_t k = uint32_t(first + count - i < ETM_MSL_BATCH ? first + count - i
                                                                   : ETM_MSL_BATCH);
    for (uint32_t b = 0; b < k; b++) group_record(L, i + b, recs[b]);
    // a batch entry never runs fibers: only a missed synchronisation leaves through `escape`
    w.looping = true;
    if (setjmp(w.escape) != 0) {
      w.looping = false;
      snprintf(err, err_len, "threadgroups (%u, %u, %u) to (%u, %u, %u): %s", recs[0].tg_id[0],
               recs[0].tg_id[1], recs[0].tg_id[2], recs[k - 1].tg_id[0], recs[k - 1].tg_id[1],
               recs[k - 1].tg_id[2], kMissedSync);
      return 1;
    }
    L.batch(L.args, recs, k);
    w.looping = false;
  }
  return 0;
}

// The batch entries of the loaded libraries, by loop entry (etm_msl_register_batch).
struct BatchTable {
  std::mutex m;
  std::vector<std::pair<etm_msl_loop, etm_msl_batch>> entries;
};

BatchTable& batch_table() {
  static BatchTable* t = new BatchTable;  // never destroyed: libraries unload after statics
  return *t;
}

etm_msl_batch find_batch(etm_msl_loop loop) {
  BatchTable& t = batch_table();
  std::lock_guard<std::mutex> lock(t.m);
  for (const auto& e : t.entries)
    if (e.first == loop) return e.second;
  return nullptr;
}

// Runs every threadgroup of `L` (msl_pool.cpp): on this thread, or over up to `workers`.
int run_grid(Worker& w, const Launch& L, uint32_t workers, char* err, uint64_t err_len);

}  // namespace

extern "C" {

int etm_msl_abi_version(void) { return ETM_MSL_ABI_VERSION; }

void etm_msl_register_batch(etm_msl_loop loop, etm_msl_batch batch) {
  BatchTable& t = batch_table();
  std::lock_guard<std::mutex> lock(t.m);
  t.entries.emplace_back(loop, batch);
}

void etm_msl_unregister_batch(etm_msl_loop loop) {
  BatchTable& t = batch_table();
  std::lock_guard<std::mutex> lock(t.m);
  for (size_t i = 0; i < t.entries.size(); i++) {
    if (t.entries[i].first == loop) {
      t.entries.erase(t.entries.begin() + long(i));
      return;
    }
  }
}

// A loop entry's thread reached a synchronising call: the classification missed it.
[[noreturn]] static void escape_loop(Worker& w) { longjmp(w.escape, 1); }

void etm_msl_threadgroup_barrier(void) {
  Worker& w = worker();
  if (w.looping) escape_loop(w);
  Group* g = w.group;
  int32_t self = w.current;
  g->threads[self].state = 2;
  g->at_barrier++;
  if (g->at_barrier == g->n) {
    if (w.checker) check_barrier(w.checker);
    g->threads[self].state = 1;
    release_barrier(g, self);
    return;
  }
  block(w);
  w.current = self;
}

// After a failure the scheduler stops resuming threads; a thread that notices it parks here.
static void park_if_failed(Worker& w) {
  if (w.group->failed) {
    block(w);
    __builtin_trap();  // never resumed
  }
}

etm_msl_exchange etm_msl_simd_exchange(const void* value, uint32_t size, uint32_t key) {
  Worker& w = worker();
  if (w.ls_on) {
    const uint32_t j = w.ls_count++, lane = w.ls_lane;
    etm_msl_exchange e;
    e.lane = lane;
    if (j < w.ls_pass && j < Worker::kMaxLockstepOps) {
      // exact: every active lane recorded this operation, with the same kind
      if (w.ls_key[j] != key || w.ls_rec[j] != w.ls_active) w.ls_bad = true;
      e.slots = &w.ls_slots[j][0][0];
      e.active = w.ls_active;
      return e;
    }
    if (j == w.ls_pass && j < Worker::kMaxLockstepOps) {
      memcpy(w.ls_slots[j][lane], value, size);
      if (w.ls_rec[j] == 0)
        w.ls_key[j] = key;
      else if (w.ls_key[j] != key)
        w.ls_bad = true;
      w.ls_rec[j] |= 1u << lane;
      e.slots = &w.ls_slots[j][0][0];
    } else {
      if (j >= Worker::kMaxLockstepOps) w.ls_bad = true;
      memcpy(w.ls_alone[lane], value, size);
      e.slots = &w.ls_alone[0][0];
    }
    e.active = 1u << lane;
    return e;
  }
  if (w.looping) escape_loop(w);
  Group* g = w.group;
  int32_t self = w.current;
  Thread& th = g->threads[self];
  const uint32_t s = th.info.simd_index, lane = th.info.lane;
  SimdGroup& sg = g->simds[s];
  memcpy(sg.slots[sg.phase][lane], value, size);
  if (sg.waiting == 0)
    sg.key = key;
  else if (sg.key != key)
    sg.mismatch = true;
  sg.waiting++;
  sg.wait_mask |= 1u << lane;
  th.state = 3;
  if (sg.waiting == sg.live) {
    th.state = 1;
    complete_simd(g, s, self);
    park_if_failed(w);
  } else {
    block(w);
    w.current = self;
  }
  etm_msl_exchange e;
  e.slots = &g->simds[s].slots[th.result_phase][0][0];
  e.active = th.result_active;
  e.lane = lane;
  return e;
}

void etm_msl_fiber_phase(const etm_msl_thread* group, etm_msl_entry entry, void* const* closure) {
  Worker& w = worker();
  if (!w.looping || w.group != nullptr) {
    // only a split entry run by the dispatcher calls this (msl_split.py)
    fail(&w.scratch, "a fiber phase outside a split kernel's threadgroup");
    if (w.looping) longjmp(w.escape, 2);
    __builtin_trap();
  }
  w.looping = false;
  const int rc = run_fibers(w, *group, entry, closure);
  w.looping = true;
  if (rc != 0) longjmp(w.escape, 2);
}

void etm_msl_lockstep(uint32_t pass, uint32_t lane, uint32_t active) {
  Worker& w = worker();
  if (pass == 0 && lane == uint32_t(__builtin_ctz(active | 0x80000000u))) {
    for (uint32_t j = 0; j < Worker::kMaxLockstepOps; j++) w.ls_rec[j] = w.ls_key[j] = 0;
    w.ls_bad = false;
  }
  w.ls_on = true;
  w.ls_pass = pass;
  w.ls_lane = lane;
  w.ls_active = active;
  w.ls_count = 0;
}

uint32_t etm_msl_lockstep_end(void) {
  Worker& w = worker();
  w.ls_on = false;
  return w.ls_bad ? UINT32_MAX : w.ls_count;
}

int etm_msl_dispatch(etm_msl_entry entry, void* const* args, const uint64_t* threads,
                     const uint64_t* group, char* err, uint64_t err_len) {
  return etm_msl_launch(entry, nullptr, args, threads, group, 1, err, err_len);
}

int etm_msl_launch(etm_msl_entry entry, etm_msl_loop loop, void* const* args,
                   const uint64_t* threads, const uint64_t* group, uint32_t workers, char* err,
                   uint64_t err_len) {
  Worker& w = worker();
  if (w.group != nullptr || w.looping) {
    snprintf(err, err_len, "dispatch from inside a running kernel");
    return 1;
  }
  Launch L;
  L.entry = entry;
  L.loop = w.checker ? nullptr : loop;  // the checker follows threads: fibers only
  L.batch = L.loop ? find_batch(L.loop) : nullptr;
  L.args = args;
  uint64_t total = 1, per_group = 1;
  for (int d = 0; d < 3; d++) {
    if (group[d] == 0 || group[d] > kMaxThreadsPerGroup) {
      snprintf(err, err_len, "threadgroup size %llu in dimension %d is outside [1, %u]",
               (unsigned long long)group[d], d, kMaxThreadsPerGroup);
      return 1;
    }
    // positions are uint32 per dimension; checked before any product, which could wrap
    if (threads[d] > 0xffffffffull) {
      snprintf(err, err_len, "grid size %llu in dimension %d exceeds 2^32-1",
               (unsigned long long)threads[d], d);
      return 1;
    }
    per_group *= group[d];  // at most 1024^3: no overflow
  }
  if (per_group > kMaxThreadsPerGroup) {
    snprintf(err, err_len, "threadgroup of %llu threads exceeds Metal's limit of %u",
             (unsigned long long)per_group, kMaxThreadsPerGroup);
    return 1;
  }
  for (int d = 0; d < 3; d++) {
    if (__builtin_mul_overflow(total, threads[d], &total)) {
      snprintf(err, err_len, "a grid of %llu x %llu x %llu threads overflows 64 bits",
               (unsigned long long)threads[0], (unsigned long long)threads[1],
               (unsigned long long)threads[2]);
      return 1;
    }
  }
  if (total == 0) return 0;
  L.count = 1;
  for (int d = 0; d < 3; d++) {
    L.threads[d] = threads[d];
    L.group[d] = group[d];
    L.groups[d] = uint32_t((threads[d] + group[d] - 1) / group[d]);
    L.count *= L.groups[d];
  }
  L.per_group = uint32_t(per_group);
  return run_grid(w, L, w.checker ? 1 : workers, err, err_len);
}

}  // extern "C"
