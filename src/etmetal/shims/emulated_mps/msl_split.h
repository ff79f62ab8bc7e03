// msl_compat.h, part 5: what a split kernel's entry runs on (msl_split.py writes the entries).
//
// A split entry runs one threadgroup as a sequence of loops over its threads (regions), cut at
// the kernel's top-level statements that synchronise. A thread's locals that live across a cut
// travel in a struct per thread (declared by the region itself), stored in per-OS-thread slot arrays (`slots`); a
// statement that synchronises runs for every thread at once on the dispatcher's fibers
// (`fibers`), and a threadgroup_barrier statement is just the cut between two regions.
#pragma once
#include <cstdint>
#include <new>
#include <type_traits>

#include "msl_abi.h"

// What a uniform helper's copy calls where the helper has a barrier (see msl_split.py).
template <class... T>
inline void etm_msl_no_barrier(T&&...) {}

namespace etm::split {

// Per OS thread memory that only grows (no <vector>: every library's preprocessing pays for
// the headers this one includes).
inline void* grow(void** buf, size_t* cap, size_t bytes) {
  if (*cap < bytes) {
    ::operator delete(*buf);
    *buf = ::operator new(bytes);
    *cap = bytes;
  }
  return *buf;
}

// Storage for n values of T, reused by every threadgroup this OS thread runs; `K` (the cut's
// index) keeps the two arrays one region reads and writes apart.
template <class T, int K>
inline T* slots(uint32_t n) {
  static_assert(std::is_trivially_destructible_v<T>, "a kept value needs a destructor");
  static_assert(alignof(T) <= __STDCPP_DEFAULT_NEW_ALIGNMENT__, "an over-aligned kept value");
  static thread_local void* buf = nullptr;
  static thread_local size_t cap = 0;
  return static_cast<T*>(grow(&buf, &cap, sizeof(T) * (n ? n : 1)));
}

// The thread records of threadgroup `g`, in thread_index_in_threadgroup order: the same fields
// the dispatcher gives a fiber-run thread (msl_dispatch.cpp's run_fibers).
inline const etm_msl_thread* threads(const etm_msl_thread* g, uint32_t* count) {
  static thread_local void* buf = nullptr;
  static thread_local size_t cap = 0;
  const uint32_t n = g->tg_size[0] * g->tg_size[1] * g->tg_size[2];
  etm_msl_thread* recs =
      static_cast<etm_msl_thread*>(grow(&buf, &cap, sizeof(etm_msl_thread) * (n ? n : 1)));
  uint32_t i = 0;
  for (uint32_t z = 0; z < g->tg_size[2]; z++)
    for (uint32_t y = 0; y < g->tg_size[1]; y++)
      for (uint32_t x = 0; x < g->tg_size[0]; x++, i++) {
        etm_msl_thread& t = recs[i];
        t = *g;
        const uint32_t p[3] = {x, y, z};
        for (int d = 0; d < 3; d++) {
          t.tg_pos[d] = p[d];
          t.grid_pos[d] = g->tg_id[d] * g->dispatch_tg_size[d] + p[d];
        }
        t.index_in_tg = i;
        t.lane = i % ETM_MSL_SIMD_WIDTH;
        t.simd_index = i / ETM_MSL_SIMD_WIDTH;
        t.quad_index = i / 4;
        t.lane_in_quad = i % 4;
      }
  *count = n;
  return recs;
}

template <class F>
void phase_entry(void* const* closure, const etm_msl_thread* t) {
  (*reinterpret_cast<F*>(const_cast<void**>(closure)))(t);
}

// Runs `body(thread)` for every thread of threadgroup `g` as fibers (barriers and SIMD-group
// operations with Metal's semantics); a failure ends the threadgroup with its message.
template <class F>
inline void fibers(const etm_msl_thread* g, F& body) {
  etm_msl_fiber_phase(g, &phase_entry<F>, reinterpret_cast<void* const*>(&body));
}

}  // namespace etm::split
