// msl_compat.h, part 3: atomics, threadgroup_barrier and the SIMD-group functions (simd_*,
// quad_*), which reach the dispatcher through msl_abi.h.
#pragma once
#include <cstdint>
#include <type_traits>

#include "msl_abi.h"
#include "msl_math.h"

namespace metal {
// ---------------------------------------------------------------------------------------------
// Atomics: real atomic read-modify-writes (threadgroups may run on several OS threads).
enum memory_order {
  memory_order_relaxed = __ATOMIC_RELAXED,
  memory_order_acquire = __ATOMIC_ACQUIRE,
  memory_order_release = __ATOMIC_RELEASE,
  memory_order_acq_rel = __ATOMIC_ACQ_REL,
  memory_order_seq_cst = __ATOMIC_SEQ_CST,
};
enum class memory_scope { memory_scope_thread, memory_scope_simdgroup, memory_scope_threadgroup, memory_scope_device };

template <class T>
struct atomic {
  T value;
};
typedef atomic<int> atomic_int;
typedef atomic<uint> atomic_uint;
typedef atomic<bool> atomic_bool;
typedef atomic<float> atomic_float;
typedef atomic<ulong> atomic_ulong;
typedef atomic<long> atomic_long;

template <class T>
inline T atomic_load_explicit(const atomic<T>* p, memory_order) {
  T r;
  __atomic_load(&p->value, &r, __ATOMIC_SEQ_CST);
  return r;
}
template <class T, class U>
inline void atomic_store_explicit(atomic<T>* p, U v, memory_order) {
  T t = T(v);
  __atomic_store(&p->value, &t, __ATOMIC_SEQ_CST);
}
template <class T, class U>
inline T atomic_exchange_explicit(atomic<T>* p, U v, memory_order) {
  T t = T(v), r;
  __atomic_exchange(&p->value, &t, &r, __ATOMIC_SEQ_CST);
  return r;
}
template <class T, class U>
inline bool atomic_compare_exchange_weak_explicit(atomic<T>* p, T* expected, U desired,
                                                  memory_order, memory_order) {
  T d = T(desired);
  return __atomic_compare_exchange(&p->value, expected, &d, false, __ATOMIC_SEQ_CST,
                                   __ATOMIC_SEQ_CST);
}
template <class T, class U>
inline bool atomic_compare_exchange_strong_explicit(atomic<T>* p, T* expected, U desired,
                                                    memory_order a, memory_order b) {
  return atomic_compare_exchange_weak_explicit(p, expected, desired, a, b);
}
namespace detail {
template <class T, class F>
inline T atomic_rmw(atomic<T>* p, F f) {
  T old;
  __atomic_load(&p->value, &old, __ATOMIC_SEQ_CST);
  T next = f(old);
  while (!__atomic_compare_exchange(&p->value, &old, &next, false, __ATOMIC_SEQ_CST,
                                    __ATOMIC_SEQ_CST))
    next = f(old);
  return old;
}
}  // namespace detail
#define ETM_ATOMIC_RMW(NAME, EXPR)                                                   \
  template <class T, class U>                                                        \
  inline T atomic_fetch_##NAME##_explicit(atomic<T>* p, U v_, memory_order) {         \
    const T v = T(v_);                                                               \
    return detail::atomic_rmw(p, [v](T o) { return T(EXPR); });                      \
  }
ETM_ATOMIC_RMW(add, o + v)
ETM_ATOMIC_RMW(sub, o - v)
ETM_ATOMIC_RMW(and, o & v)
ETM_ATOMIC_RMW(or, o | v)
ETM_ATOMIC_RMW(xor, o ^ v)
ETM_ATOMIC_RMW(min, v < o ? v : o)
ETM_ATOMIC_RMW(max, o < v ? v : o)
#undef ETM_ATOMIC_RMW

// ---------------------------------------------------------------------------------------------
// Barriers and SIMD-group functions (the dispatcher runs a threadgroup's threads as fibers).
enum class mem_flags : unsigned {
  mem_none = 0,
  mem_device = 1,
  mem_threadgroup = 2,
  mem_texture = 4,
  mem_threadgroup_imageblock = 8,
  mem_object_data = 16,
};
constexpr mem_flags operator|(mem_flags a, mem_flags b) {
  return mem_flags(unsigned(a) | unsigned(b));
}
inline void threadgroup_barrier(mem_flags = mem_flags::mem_none) {
  __atomic_thread_fence(__ATOMIC_SEQ_CST);
  etm_msl_threadgroup_barrier();
}

namespace detail {
enum simd_op : uint32_t {
  op_sync = 1, op_sum, op_product, op_min, op_max, op_and, op_or, op_xor, op_broadcast,
  op_broadcast_first, op_shuffle, op_shuffle_up, op_shuffle_down, op_shuffle_xor,
  op_rotate_up, op_rotate_down, op_fill_up, op_fill_down, op_ballot, op_any, op_all,
  op_prefix_incl_sum, op_prefix_excl_sum, op_prefix_incl_product, op_prefix_excl_product,
  op_quad_sum, op_quad_product, op_quad_min, op_quad_max, op_quad_broadcast, op_quad_shuffle,
  op_quad_shuffle_xor, op_quad_shuffle_down, op_quad_shuffle_up, op_is_first,
};
template <class T>
inline etm_msl_exchange exchange(const T& v, simd_op op) {
  static_assert(sizeof(T) <= ETM_MSL_SLOT_BYTES, "SIMD operand wider than a slot");
  return etm_msl_simd_exchange(&v, sizeof(T), (uint32_t(op) << 8) | uint32_t(sizeof(T)));
}
// A lane's value; an inactive lane reads as zero bits (what Apple GPUs give in practice; the
// MSL specification leaves it undefined).
template <class T>
inline T lane_value(const etm_msl_exchange& e, uint32_t lane) {
  T t;
  if (lane < ETM_MSL_SIMD_WIDTH && ((e.active >> lane) & 1u))
    __builtin_memcpy(static_cast<void*>(&t), e.slots + lane * ETM_MSL_SLOT_BYTES, sizeof(T));
  else
    __builtin_memset(static_cast<void*>(&t), 0, sizeof(T));
  return t;
}
template <class T, class F>
inline T reduce(const T& v, simd_op op, F f, uint32_t group = ETM_MSL_SIMD_WIDTH) {
  etm_msl_exchange e = exchange(v, op);
  const uint32_t base = e.lane / group * group;
  bool first = true;
  T r{};
  for (uint32_t l = base; l < base + group; l++) {
    if (!((e.active >> l) & 1u)) continue;
    T x = lane_value<T>(e, l);
    r = first ? x : T(f(r, x));
    first = false;
  }
  return r;
}
template <class T, class F>
inline T prefix(const T& v, simd_op op, F f, T identity, bool inclusive) {
  etm_msl_exchange e = exchange(v, op);
  T r = identity;
  for (uint32_t l = 0; l < e.lane + (inclusive ? 1u : 0u); l++)
    if ((e.active >> l) & 1u) r = T(f(r, lane_value<T>(e, l)));
  return r;
}
template <class T>
inline T shuffled(const T& v, simd_op op, int src) {
  etm_msl_exchange e = exchange(v, op);
  return lane_value<T>(e, uint32_t(src));
}
struct plus_op {
  template <class T>
  T operator()(const T& a, const T& b) const { return a + b; }
};
struct times_op {
  template <class T>
  T operator()(const T& a, const T& b) const { return a * b; }
};
struct min_op {
  template <class T>
  T operator()(const T& a, const T& b) const { return metal::min(a, b); }
};
struct max_op {
  template <class T>
  T operator()(const T& a, const T& b) const { return metal::max(a, b); }
};
}  // namespace detail

struct simd_vote {
  typedef ulong vote_t;
  vote_t v;
  vote_t active = 0xffffffffull;  // all() asks about the lanes that voted
  explicit constexpr simd_vote(vote_t x = 0) : v(x) {}
  constexpr simd_vote(vote_t x, vote_t lanes) : v(x), active(lanes) {}
  explicit constexpr operator vote_t() const { return v; }
  constexpr bool all() const { return (v & active) == active; }
  constexpr bool any() const { return v != 0; }
};

inline void simdgroup_barrier(mem_flags = mem_flags::mem_none) {
  detail::exchange(0, detail::op_sync);
}
template <class T>
inline T simd_sum(T v) { return detail::reduce(v, detail::op_sum, detail::plus_op{}); }
template <class T>
inline T simd_product(T v) { return detail::reduce(v, detail::op_product, detail::times_op{}); }
template <class T>
inline T simd_min(T v) { return detail::reduce(v, detail::op_min, detail::min_op{}); }
template <class T>
inline T simd_max(T v) { return detail::reduce(v, detail::op_max, detail::max_op{}); }
template <class T>
inline T simd_and(T v) { return detail::reduce(v, detail::op_and, [](T a, T b) { return a & b; }); }
template <class T>
inline T simd_or(T v) { return detail::reduce(v, detail::op_or, [](T a, T b) { return a | b; }); }
template <class T>
inline T simd_xor(T v) { return detail::reduce(v, detail::op_xor, [](T a, T b) { return a ^ b; }); }
template <class T>
inline T simd_prefix_inclusive_sum(T v) { return detail::prefix(v, detail::op_prefix_incl_sum, detail::plus_op{}, T(0), true); }
template <class T>
inline T simd_prefix_exclusive_sum(T v) { return detail::prefix(v, detail::op_prefix_excl_sum, detail::plus_op{}, T(0), false); }
template <class T>
inline T simd_prefix_inclusive_product(T v) { return detail::prefix(v, detail::op_prefix_incl_product, detail::times_op{}, T(1), true); }
template <class T>
inline T simd_prefix_exclusive_product(T v) { return detail::prefix(v, detail::op_prefix_excl_product, detail::times_op{}, T(1), false); }
template <class T, class L>
inline T simd_broadcast(T v, L lane) { return detail::shuffled(v, detail::op_broadcast, int(lane)); }
template <class T, class L>
inline T simd_shuffle(T v, L lane) { return detail::shuffled(v, detail::op_shuffle, int(lane)); }
template <class T>
inline T simd_broadcast_first(T v) {
  etm_msl_exchange e = detail::exchange(v, detail::op_broadcast_first);
  return detail::lane_value<T>(e, uint32_t(__builtin_ctz(e.active)));
}
template <class T, class D>
inline T simd_shuffle_down(T v, D delta) {
  etm_msl_exchange e = detail::exchange(v, detail::op_shuffle_down);
  uint32_t src = e.lane + uint32_t(delta);
  return src < ETM_MSL_SIMD_WIDTH ? detail::lane_value<T>(e, src) : v;
}
template <class T, class D>
inline T simd_shuffle_up(T v, D delta) {
  etm_msl_exchange e = detail::exchange(v, detail::op_shuffle_up);
  int src = int(e.lane) - int(delta);
  return src >= 0 ? detail::lane_value<T>(e, uint32_t(src)) : v;
}
template <class T, class M>
inline T simd_shuffle_xor(T v, M mask) {
  etm_msl_exchange e = detail::exchange(v, detail::op_shuffle_xor);
  return detail::lane_value<T>(e, (e.lane ^ uint32_t(mask)) % ETM_MSL_SIMD_WIDTH);
}
template <class T, class D>
inline T simd_shuffle_rotate_down(T v, D delta) {
  etm_msl_exchange e = detail::exchange(v, detail::op_rotate_down);
  return detail::lane_value<T>(e, (e.lane + uint32_t(delta)) % ETM_MSL_SIMD_WIDTH);
}
template <class T, class D>
inline T simd_shuffle_rotate_up(T v, D delta) {
  etm_msl_exchange e = detail::exchange(v, detail::op_rotate_up);
  return detail::lane_value<T>(e, (e.lane + ETM_MSL_SIMD_WIDTH - uint32_t(delta) % ETM_MSL_SIMD_WIDTH) % ETM_MSL_SIMD_WIDTH);
}
namespace detail {
template <class T>
struct data_fill {
  T data, fill;
};
}  // namespace detail
// Lanes whose source is past the end (of the SIMD group, or of a `modulo`-lane segment) take
// the lower lanes of `fill` (MSL's simd_shuffle_and_fill_down); _up mirrors it.
template <class T, class D>
inline T simd_shuffle_and_fill_down(T data, T fill, D delta, ushort modulo = ETM_MSL_SIMD_WIDTH) {
  etm_msl_exchange e = detail::exchange(detail::data_fill<T>{data, fill}, detail::op_fill_down);
  const uint32_t m = modulo ? modulo : ETM_MSL_SIMD_WIDTH;
  const uint32_t base = e.lane / m * m, idx = e.lane % m + uint32_t(delta);
  if (idx < m) return detail::lane_value<detail::data_fill<T>>(e, base + idx).data;
  return detail::lane_value<detail::data_fill<T>>(e, base + idx - m).fill;
}
template <class T, class D>
inline T simd_shuffle_and_fill_up(T data, T fill, D delta, ushort modulo = ETM_MSL_SIMD_WIDTH) {
  etm_msl_exchange e = detail::exchange(detail::data_fill<T>{data, fill}, detail::op_fill_up);
  const uint32_t m = modulo ? modulo : ETM_MSL_SIMD_WIDTH;
  const int base = int(e.lane / m * m), idx = int(e.lane % m) - int(delta);
  if (idx >= 0) return detail::lane_value<detail::data_fill<T>>(e, uint32_t(base + idx)).data;
  return detail::lane_value<detail::data_fill<T>>(e, uint32_t(base + idx + int(m))).fill;
}
inline simd_vote simd_ballot(bool b) {
  etm_msl_exchange e = detail::exchange(uint32_t(b), detail::op_ballot);
  ulong m = 0;
  for (uint32_t l = 0; l < ETM_MSL_SIMD_WIDTH; l++)
    if (detail::lane_value<uint32_t>(e, l)) m |= 1ull << l;
  return simd_vote(m, e.active);
}
inline simd_vote simd_active_threads_mask() {
  etm_msl_exchange e = detail::exchange(uint32_t(1), detail::op_ballot);
  return simd_vote(e.active, e.active);
}
inline bool simd_any(bool b) { return simd_ballot(b).any(); }
inline bool simd_all(bool b) {
  etm_msl_exchange e = detail::exchange(uint32_t(b), detail::op_all);
  for (uint32_t l = 0; l < ETM_MSL_SIMD_WIDTH; l++)
    if (((e.active >> l) & 1u) && !detail::lane_value<uint32_t>(e, l)) return false;
  return true;
}
inline bool simd_is_first() {
  etm_msl_exchange e = detail::exchange(uint32_t(1), detail::op_is_first);
  return e.lane == uint32_t(__builtin_ctz(e.active));
}
// quad_*: the same over groups of four lanes.
template <class T>
inline T quad_sum(T v) { return detail::reduce(v, detail::op_quad_sum, detail::plus_op{}, 4); }
template <class T>
inline T quad_product(T v) { return detail::reduce(v, detail::op_quad_product, detail::times_op{}, 4); }
template <class T>
inline T quad_min(T v) { return detail::reduce(v, detail::op_quad_min, detail::min_op{}, 4); }
template <class T>
inline T quad_max(T v) { return detail::reduce(v, detail::op_quad_max, detail::max_op{}, 4); }
template <class T, class L>
inline T quad_broadcast(T v, L lane) {
  etm_msl_exchange e = detail::exchange(v, detail::op_quad_broadcast);
  return detail::lane_value<T>(e, e.lane / 4 * 4 + uint32_t(lane) % 4);
}
template <class T, class L>
inline T quad_shuffle(T v, L lane) {
  etm_msl_exchange e = detail::exchange(v, detail::op_quad_shuffle);
  return detail::lane_value<T>(e, e.lane / 4 * 4 + uint32_t(lane) % 4);
}
template <class T, class M>
inline T quad_shuffle_xor(T v, M mask) {
  etm_msl_exchange e = detail::exchange(v, detail::op_quad_shuffle_xor);
  return detail::lane_value<T>(e, e.lane / 4 * 4 + ((e.lane % 4) ^ (uint32_t(mask) % 4)));
}
}  // namespace metal
