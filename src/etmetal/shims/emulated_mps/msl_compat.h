// Metal Shading Language on the CPU: the MSL surface Inductor's kernels and c10's Metal headers
// use, as C++20 for g++/clang++.
//
// The source of a shader library is compiled after this header (msl_compiler.py force-includes
// it). What it provides:
//   - address spaces: `device` and `thread` are empty macros (one flat host memory);
//     `constant`, `threadgroup` and `kernel` are rewritten by msl_parse.py (a kernel-local threadgroup
//     array becomes a `static thread_local`: every thread of one threadgroup runs on the same OS
//     thread, so they share it);
//   - scalar names (uint, ushort, uchar, ulong, half = _Float16, bfloat with 16-bit storage and
//     round-to-nearest-even on store), vectors (float2..4, half2..4, int2..4, ...) with
//     components, swizzles, arithmetic, comparisons and conversions;
//   - the metal:: library: math (with precise:: and fast::), integer and relational functions,
//     select, dot, as_type, type traits, numeric_limits, array, atomics;
//   - threadgroup_barrier and the simd_* functions, which call the dispatcher (msl_abi.h).
#pragma once

// No <cmath>/<math.h>, <cstdlib> or <cstring>: they declare C functions in the global namespace
// (expm1f, abs, div, ...) that MSL does not have and that would make c10's unqualified calls
// ambiguous. The math below uses GCC builtins, which need no declaration.
#include <array>
#include <cfloat>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <utility>

#include "msl_abi.h"

#define __METAL__ 1
#ifndef __METAL_VERSION__
#define __METAL_VERSION__ 310
#endif

// Address spaces: one flat memory on the host. `constant` is made `const` by msl_parse.py
// (read-only, and it keeps overloads on address space apart: c10's val_at_offs(constant void*)
// and val_at_offs(device void*)); a macro could not drop the second `const` of
// `constant const char*`.
#ifdef ETM_MSL_CHECK
// a checked build: msl_instrument.py finds device pointers by this word, then removes it
#define device __etm_device
#else
#define device
#endif
#define thread
#define ray_data

typedef unsigned char uchar;
typedef unsigned short ushort;
typedef unsigned int uint;
typedef unsigned long ulong;
typedef _Float16 half;

#include "msl_types.h"
#include "msl_math.h"
#include "msl_sync.h"
#include "msl_split.h"
#ifdef ETM_MSL_CHECK
#include "msl_check.h"
#endif


// MSL code names the library unqualified (threadgroup_barrier, as_type, simd_sum, ...).
using namespace metal;

// Constants MSL defines (math.h is not included, see the top of this file).
#define NAN __builtin_nanf("")
#define INFINITY __builtin_inff()
#define HUGE_VALF __builtin_huge_valf()
#define HUGE_VAL __builtin_huge_val()
#define MAXFLOAT FLT_MAX
#define HUGE_VALH ((half)__builtin_inff())
#define MAXHALF ((half)65504.0f)
#define M_E_F 2.71828182845904523536f
#define M_LOG2E_F 1.44269504088896340736f
#define M_LOG10E_F 0.434294481903251827651f
#define M_LN2_F 0.693147180559945309417f
#define M_LN10_F 2.30258509299404568402f
#define M_PI_F 3.14159265358979323846f
#define M_PI_2_F 1.57079632679489661923f
#define M_PI_4_F 0.785398163397448309616f
#define M_1_PI_F 0.318309886183790671538f
#define M_2_PI_F 0.636619772367581343076f
#define M_2_SQRTPI_F 1.12837916709551257390f
#define M_SQRT2_F 1.41421356237309504880f
#define M_SQRT1_2_F 0.707106781186547524401f
#define M_E_H half(M_E_F)
#define M_PI_H half(M_PI_F)
#define M_SQRT2_H half(M_SQRT2_F)
#define M_LN2_H half(M_LN2_F)

// Thread-position attributes: the entries build them from the dispatcher's thread record.
namespace etm {
template <class V>
constexpr V position(const uint32_t* p) {
  if constexpr (comps_v<V> == 1)
    return V(p[0]);
  else if constexpr (comps_v<V> == 2)
    return V(p[0], p[1]);
  else if constexpr (comps_v<V> == 3)
    return V(p[0], p[1], p[2]);
  else
    return V(p[0], p[1], p[2], 0);
}
}  // namespace etm

// A kernel that never synchronises (msl_classify.py) runs a threadgroup as this loop: `g`
// carries the threadgroup's fields, the loop sets each thread's own, in
// thread_index_in_threadgroup order. The body is inlined, so the compiler sees a plain loop
// over the threads (no call, no fiber) and may vectorize it.
namespace etm {
template <class F>
inline void for_each_thread(const etm_msl_thread* g, F body) {
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
        body(&t);
      }
    }
  }
}
}  // namespace etm

// [[buffer(i)]] arguments: a pointer parameter gets the buffer's address, a reference (or a
// by-value struct) reads the slot the address points at.
namespace etm {
template <class T>
inline T buffer_arg(void* p) {
  if constexpr (std::is_pointer_v<T>)
    return reinterpret_cast<T>(p);
  else
    return *reinterpret_cast<std::remove_reference_t<T>*>(p);
}

// What a [[buffer(i)]] parameter takes, for the device's argument checks (see msl.py's
// ARG_KINDS): kind << 32 | the bytes a by-reference (or by-value) parameter reads.
template <class T>
constexpr unsigned long long arg_desc() {
  using U = std::remove_cv_t<std::remove_reference_t<T>>;
  if constexpr (std::is_pointer_v<T>)
    return 1ull << 32;  // a buffer
  else if constexpr (std::is_integral_v<U> || std::is_enum_v<U>)
    return (2ull << 32) | sizeof(U);  // an integer scalar
  else if constexpr (std::is_floating_point_v<U> || std::is_same_v<U, bfloat> ||
                     std::is_same_v<U, half>)
    return (3ull << 32) | sizeof(U);  // a floating scalar
  else
    return (4ull << 32) | sizeof(U);  // bytes: a vector or struct
}
}  // namespace etm
