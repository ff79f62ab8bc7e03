// Threadgroups of one dispatch spread over a small pool of OS threads (appended to
// msl_dispatch.cpp, whose run_threadgroup runs one).
//
// Metal gives threadgroups no order and no way to wait for each other, so running them at once
// is as exact as running them in turn; a kernel whose result depends on their order races
// through device memory, which the checker reports (a checked dispatch runs on one thread).
// Each OS thread runs whole threadgroups with its own Worker: its fibers, its bookkeeping
// and its threadgroup memory (`static thread_local`, see msl_parse.py). The calling thread
// takes part; helpers claim threadgroups from a shared counter, so none is run twice and the
// split follows the work. Helpers are started on first need, are never joined (they sleep
// between dispatches) and serve one dispatch at a time; a dispatch arriving while they serve
// another runs on its own thread.
#include <atomic>
#include <condition_variable>
#include <mutex>
#include <thread>

namespace {

constexpr uint32_t kMaxWorkers = 64;
// Waking a helper costs some microseconds: a loop-run grid smaller than this (a few tens of
// microseconds of work) stays on the calling thread. A fiber-run threadgroup costs more than
// a wake-up, so any grid of two or more of them is shared.
constexpr uint64_t kMinLoopThreadsToShare = 16384;

struct Job {
  const Launch* launch;
  uint32_t helpers;  // helpers wanted
  std::atomic<uint64_t> next{0};
  std::atomic<bool> failed{false};
  std::mutex m;
  uint64_t failed_at = UINT64_MAX;  // the lowest failing threadgroup seen: its message wins
  char message[600];
};

struct Pool {
  std::mutex m;              // guards everything below
  std::mutex busy;           // held by the dispatch the helpers serve
  std::condition_variable wake, done;
  Job* job = nullptr;
  uint64_t generation = 0;
  uint32_t joined = 0;   // helpers that took the current job
  uint32_t working = 0;  // helpers still running it
  uint32_t started = 0;  // helper threads alive
};

Pool& pool() {
  static Pool* p = new Pool;  // never destroyed: helpers may outlive static destruction
  return *p;
}

void run_share(Job& job) {
  Worker& w = worker();
  const Launch& L = *job.launch;
  char err[600];
  const uint64_t step = L.batch ? ETM_MSL_BATCH : 1;  // a batch entry's threadgroups together
  while (!job.failed.load(std::memory_order_relaxed)) {
    uint64_t i = job.next.fetch_add(step, std::memory_order_relaxed);
    if (i >= L.count) break;
    const uint64_t n = L.count - i < step ? L.count - i : step;
    if (run_threadgroups(w, L, i, n, err, sizeof err) != 0) {
      std::lock_guard<std::mutex> lock(job.m);
      if (i < job.failed_at) {
        job.failed_at = i;
        memcpy(job.message, err, sizeof err);
      }
      job.failed.store(true, std::memory_order_relaxed);
    }
  }
}

void helper_main() {
  Pool& p = pool();
  uint64_t seen = 0;
  std::unique_lock<std::mutex> lock(p.m);
  for (;;) {
    p.wake.wait(lock, [&] { return p.generation != seen; });
    seen = p.generation;
    Job* job = p.job;
    if (job == nullptr || p.joined >= job->helpers) continue;
    p.joined++;
    p.working++;
    lock.unlock();
    run_share(*job);
    lock.lock();
    if (--p.working == 0) p.done.notify_all();
  }
}

int run_grid(Worker& w, const Launch& L, uint32_t workers, char* err, uint64_t err_len) {
  if (workers > kMaxWorkers) workers = kMaxWorkers;
  Pool& p = pool();
  std::unique_lock<std::mutex> busy(p.busy, std::defer_lock);
  const bool worth_it = L.loop == nullptr || L.count * L.per_group >= kMinLoopThreadsToShare;
  if (workers > 1 && L.count > 1 && worth_it) busy.try_lock();
  if (!busy.owns_lock()) return run_threadgroups(w, L, 0, L.count, err, err_len);
  Job job;
  job.launch = &L;
  job.helpers = uint32_t(L.count - 1 < workers - 1 ? L.count - 1 : workers - 1);
  {
    std::lock_guard<std::mutex> lock(p.m);
    while (p.started < job.helpers) {
      std::thread(helper_main).detach();
      p.started++;
    }
    p.job = &job;
    p.joined = 0;
    p.generation++;
  }
  p.wake.notify_all();
  run_share(job);
  {
    // no helper may take the job once it is withdrawn; wait for those that did
    std::unique_lock<std::mutex> lock(p.m);
    p.job = nullptr;
    p.done.wait(lock, [&] { return p.working == 0; });
  }
  if (job.failed.load()) {
    snprintf(err, err_len, "%s", job.message);
    return 1;
  }
  return 0;
}

}  // namespace
