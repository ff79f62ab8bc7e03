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

// The threadgroups a batch entry runs at once (generated code is preprocessed: no macros).
constexpr uint32_t kBatch = ETM_MSL_BATCH;

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
  // one thread_local (one __tls_get_addr in a dlopen'ed library), not two
  static thread_local struct {
    void* buf = nullptr;
    size_t cap = 0;
  } mem;
  return static_cast<T*>(grow(&mem.buf, &mem.cap, sizeof(T) * (n ? n : 1)));
}

// The threads of threadgroup `g` in thread_index_in_threadgroup order: `body(thread, i)` with
// one record updated in place (the fields the dispatcher gives a fiber-run thread, as
// msl_dispatch.cpp's run_fibers fills them). No array of records: a region's loop touches only
// the fields its kernel reads once the body is inlined.
template <class F>
inline void each(const etm_msl_thread* g, F&& body) {
  etm_msl_thread t = *g;
  uint32_t i = 0;
  for (uint32_t z = 0; z < g->tg_size[2]; z++) {
    t.tg_pos[2] = z;
    t.grid_pos[2] = g->tg_id[2] * g->dispatch_tg_size[2] + z;
    for (uint32_t y = 0; y < g->tg_size[1]; y++) {
      t.tg_pos[1] = y;
      t.grid_pos[1] = g->tg_id[1] * g->dispatch_tg_size[1] + y;
      const uint32_t x0 = g->tg_id[0] * g->dispatch_tg_size[0];
      for (uint32_t x = 0; x < g->tg_size[0]; x++, i++) {
        t.tg_pos[0] = x;
        t.grid_pos[0] = x0 + x;
        t.index_in_tg = i;
        t.lane = i % ETM_MSL_SIMD_WIDTH;
        t.simd_index = i / ETM_MSL_SIMD_WIDTH;
        t.quad_index = i / 4;
        t.lane_in_quad = i % 4;
        body(static_cast<const etm_msl_thread*>(&t), i);
      }
    }
  }
}

inline uint32_t count(const etm_msl_thread* g) {
  return g->tg_size[0] * g->tg_size[1] * g->tg_size[2];
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

// ---- c10's threadgroup_welford_reduce for a batch of threadgroups (msl_split.py's BATCHED) --
// The helper is one serial chain per threadgroup (each step divides by the count so far), so
// one threadgroup at a time waits on the divider at every step; run for the k threadgroups of
// a batch interleaved, the chains overlap. Each threadgroup's chain is the helper's own, step
// for step and rounding for rounding (its text is recognised by digest): `arrays[b]` is the
// threadgroup memory of threadgroup b, `size` the helper's argument, out[b] its result.
template <class A>
inline void threadgroup_welford_reduce_batch(A& arrays, uint32_t k, unsigned size, float3* out) {
  float m[ETM_MSL_BATCH], m2[ETM_MSL_BATCH];
  for (uint32_t b = 0; b < k; b++) {
    m[b] = arrays[b][0];
    m2[b] = 0;
  }
  for (unsigned idx = 1; idx < size; ++idx) {
    for (uint32_t b = 0; b < k; b++) {
      float delta = arrays[b][idx] - m[b];
      m[b] += delta / (idx + 1);
      m2[b] += delta * (arrays[b][idx] - m[b]);
    }
  }
  for (uint32_t b = 0; b < k; b++) out[b] = float3(m[b], m2[b], size);
}

// ---- c10's threadgroup reductions with the lanes of each SIMD group in lockstep ------------
// A pure function `simd` of one operand that makes SIMD operations (the one a c10 helper calls,
// msl_split.py's NAME__etm_simd), run for the active lanes of one SIMD group without fibers,
// by replay: pass p runs every lane with operations before p answered exactly and records
// operation p's operands; a last pass, every answer exact, gives the result of each lane in
// `need`. False (fall back to fibers) if an answer could not be exact.
template <class D>
struct tg_arg {
  D val;
  unsigned idx;
};

// c10's simd_sum/max/min of a float, recognised by the digests of their text (msl_split.py's
// FOLDS): what msl_sync.h's reduce gives every active lane (in lane order, the same operator),
// after c10's NaN test for max and min, computed at once instead of replayed lane by lane.
struct fold_none {
  template <class V>
  static constexpr bool exact = false;
  template <class V>
  V operator()(const V*, uint32_t) const { return V{}; }
};
template <class Op>
struct fold_float {
  template <class V>
  static constexpr bool exact = std::is_same_v<V, float>;
  template <class V>
  V operator()(const V* vals, uint32_t active) const {
    bool first = true;
    V r{};
    for (uint32_t l = 0; l < ETM_MSL_SIMD_WIDTH; l++) {
      if (!((active >> l) & 1u)) continue;
      if (Op::nan_test && ::metal::isnan(vals[l])) return ::metal::numeric_limits<V>::quiet_NaN();
      r = first ? vals[l] : V(Op{}(r, vals[l]));
      first = false;
    }
    return r;
  }
};
struct fold_sum_op {
  static constexpr bool nan_test = false;
  float operator()(float a, float b) const { return a + b; }
};
struct fold_max_op {
  static constexpr bool nan_test = true;
  float operator()(float a, float b) const { return ::metal::max(a, b); }
};
struct fold_min_op {
  static constexpr bool nan_test = true;
  float operator()(float a, float b) const { return ::metal::min(a, b); }
};
using fold_sum = fold_float<fold_sum_op>;
using fold_max = fold_float<fold_max_op>;
using fold_min = fold_float<fold_min_op>;

template <class Fold = fold_none, class V, class R, class S>
inline bool lockstep(S& simd, const V* vals, uint32_t active, R* results, uint32_t need) {
  constexpr uint32_t W = ETM_MSL_SIMD_WIDTH;
  if constexpr (Fold::template exact<V> && std::is_same_v<R, V>) {
    const V r = Fold{}(vals, active);
    for (uint32_t l = 0; l < W; l++)
      if ((active & need) >> l & 1u) results[l] = r;
    return true;
  }
  for (uint32_t p = 0;; p++) {
    uint32_t most = 0;
    for (uint32_t l = 0; l < W; l++) {
      if (!((active >> l) & 1u)) continue;
      etm_msl_lockstep(p, l, active);
      (void)simd(vals[l]);
      const uint32_t c = etm_msl_lockstep_end();
      if (c == UINT32_MAX) return false;
      most = c > most ? c : most;
    }
    if (most <= p + 1) break;  // operation p was the last any lane reached
  }
  // A lane's operations are decided by the exact answers before them, the same in the pass
  // that recorded each and in this one: only the lanes whose result is used (`need`) run it.
  for (uint32_t l = 0; l < W; l++) {
    if (!((active & need) >> l & 1u)) continue;
    etm_msl_lockstep(UINT32_MAX, l, active);
    results[l] = simd(vals[l]);
    if (etm_msl_lockstep_end() == UINT32_MAX) return false;
  }
  return true;
}

// c10's threadgroup_{sum,prod,max,min}(data, val, idx, size) for the n threads of a threadgroup
// at once (args[t]: thread t's val and idx; size the same for all), each thread's result in
// out[t]. Its steps are the helper's: SIMD group reductions stored by lanes whose idx is a
// multiple of 32; if size > 32, a barrier, then the threads with idx below the number of
// SIMD groups reduce those (their SIMD groups' active lanes) and idx 0 stores the total; a
// barrier; every thread reads data[0]. Returns false, having done nothing, when `simd` is not
// a single SIMD operation.
template <class Fold = fold_none, class D, class S>
inline bool tg_reduce(D* data, const tg_arg<D>* args, uint32_t n, unsigned size, S simd, D* out) {
  constexpr uint32_t W = ETM_MSL_SIMD_WIDTH;
  const uint32_t nsimd = (n + W - 1) / W;
  D vals[W], res[W];
  // a fallback after stores is still exact: the helper stores each slot before reading it
  for (uint32_t s = 0; s < nsimd; s++) {
    const uint32_t base = s * W, cnt = n - base < W ? n - base : W;
    const uint32_t active = cnt == W ? 0xffffffffu : ((1u << cnt) - 1u);
    uint32_t need = 0;
    for (uint32_t l = 0; l < cnt; l++) {
      vals[l] = args[base + l].val;
      need |= uint32_t(args[base + l].idx % W == 0) << l;
    }
    if (!lockstep<Fold>(simd, vals, active, res, need)) return false;
    for (uint32_t l = 0; l < cnt; l++)
      if (args[base + l].idx % W == 0) data[args[base + l].idx / W] = res[l];
  }
  if (size > W) {  // after the barrier: every store above is seen
    const unsigned used = (size + W - 1) / W;
    D* stage = out;  // the second stage's operands, all read before any store
    for (uint32_t t = 0; t < n; t++)
      if (args[t].idx < used) stage[t] = data[args[t].idx];
    for (uint32_t s = 0; s < nsimd; s++) {
      const uint32_t base = s * W, cnt = n - base < W ? n - base : W;
      uint32_t active = 0, need = 0;
      for (uint32_t l = 0; l < cnt; l++) {
        if (args[base + l].idx >= used) continue;
        active |= 1u << l;
        need |= uint32_t(args[base + l].idx == 0) << l;
        vals[l] = stage[base + l];
      }
      if (active == 0) continue;
      if (!lockstep<Fold>(simd, vals, active, res, need)) return false;
      for (uint32_t l = 0; l < cnt; l++)
        if (((active >> l) & 1u) && args[base + l].idx == 0) data[0] = res[l];
    }
  }
  for (uint32_t t = 0; t < n; t++) out[t] = data[0];  // after the last barrier
  return true;
}

}  // namespace etm::split
