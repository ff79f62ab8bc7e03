// Metal Shading Language on the CPU: the MSL surface Inductor's kernels and c10's Metal headers
// use, as C++20 for g++/clang++.
//
// The source of a shader library is compiled after this header (msl_compiler.py force-includes
// it). What it provides:
//   - address spaces: `device`, `constant`, `thread` are empty macros (one flat host memory);
//     `threadgroup` and `kernel` are rewritten by msl_compiler.py (a kernel-local threadgroup
//     array becomes a `static thread_local`: every thread of one threadgroup runs on the same OS
//     thread, so they share it);
//   - scalar names (uint, ushort, uchar, ulong, half = _Float16, bfloat with 16-bit storage and
//     round-to-nearest-even on store), vectors (float2..4, half2..4, int2..4, ...) with
//     components, swizzles, arithmetic, comparisons and conversions;
//   - the metal:: library: math (with precise:: and fast::), integer and relational functions,
//     select, dot, as_type, type traits, numeric_limits, array, atomics;
//   - threadgroup_barrier and the simd_* functions, which call the dispatcher (msl_abi.h).
#pragma once

#include <algorithm>
#include <array>
#include <cfloat>
#include <climits>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <utility>

#include "msl_abi.h"

#define __METAL__ 1
#ifndef __METAL_VERSION__
#define __METAL_VERSION__ 310
#endif

// Address spaces: one flat memory on the host.
#define device
#define constant
#define thread
#define ray_data

typedef unsigned char uchar;
typedef unsigned short ushort;
typedef unsigned int uint;
typedef unsigned long ulong;
typedef _Float16 half;

// ---------------------------------------------------------------------------------------------
// bfloat: 16-bit storage, float arithmetic, round-to-nearest-even when a value is stored.
struct bfloat {
  uint16_t bits;
  bfloat() = default;
  static constexpr uint16_t round(float f) {
    uint32_t u = __builtin_bit_cast(uint32_t, f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40u);  // quiet NaN
    u += 0x7fffu + ((u >> 16) & 1u);
    return uint16_t(u >> 16);
  }
  constexpr bfloat(float f) : bits(round(f)) {}
  constexpr bfloat(double d) : bits(round(float(d))) {}
  constexpr bfloat(half h) : bits(round(float(h))) {}
  template <class I, std::enable_if_t<std::is_integral_v<I>, int> = 0>
  constexpr bfloat(I i) : bits(round(float(i))) {}
  constexpr operator float() const { return __builtin_bit_cast(float, uint32_t(bits) << 16); }
  constexpr bfloat operator-() const { return from_bits(bits ^ 0x8000u); }
  constexpr bfloat operator+() const { return *this; }
  static constexpr bfloat from_bits(uint32_t b) {
    bfloat r{};
    r.bits = uint16_t(b);
    return r;
  }
};

namespace etm {
template <class T>
inline constexpr bool is_bf_v = std::is_same_v<std::remove_cv_t<T>, bfloat>;
// The scalar a bfloat meets in a binary operation: float-like operands give float, integers
// keep bfloat (as half does).
template <class S>
using bf_mix_t = std::conditional_t<std::is_integral_v<S>, bfloat, float>;
}  // namespace etm

#define ETM_BF_ARITH(OP)                                                                    \
  constexpr inline bfloat operator OP(bfloat a, bfloat b) { return bfloat(float(a) OP float(b)); } \
  template <class S, std::enable_if_t<std::is_arithmetic_v<S> || std::is_same_v<S, half>, int> = 0> \
  constexpr inline etm::bf_mix_t<S> operator OP(bfloat a, S b) {                            \
    return etm::bf_mix_t<S>(float(a) OP float(b));                                          \
  }                                                                                         \
  template <class S, std::enable_if_t<std::is_arithmetic_v<S> || std::is_same_v<S, half>, int> = 0> \
  constexpr inline etm::bf_mix_t<S> operator OP(S a, bfloat b) {                            \
    return etm::bf_mix_t<S>(float(a) OP float(b));                                          \
  }                                                                                         \
  template <class S>                                                                        \
  constexpr inline bfloat& operator OP##=(bfloat & a, S b) {                                \
    a = bfloat(float(a) OP float(b));                                                       \
    return a;                                                                               \
  }
ETM_BF_ARITH(+)
ETM_BF_ARITH(-)
ETM_BF_ARITH(*)
ETM_BF_ARITH(/)
#undef ETM_BF_ARITH
#define ETM_BF_CMP(OP)                                                                      \
  constexpr inline bool operator OP(bfloat a, bfloat b) { return float(a) OP float(b); }    \
  template <class S, std::enable_if_t<std::is_arithmetic_v<S> || std::is_same_v<S, half>, int> = 0> \
  constexpr inline bool operator OP(bfloat a, S b) {                                        \
    return float(a) OP float(b);                                                            \
  }                                                                                         \
  template <class S, std::enable_if_t<std::is_arithmetic_v<S> || std::is_same_v<S, half>, int> = 0> \
  constexpr inline bool operator OP(S a, bfloat b) {                                        \
    return float(a) OP float(b);                                                            \
  }
ETM_BF_CMP(<)
ETM_BF_CMP(>)
ETM_BF_CMP(<=)
ETM_BF_CMP(>=)
ETM_BF_CMP(==)
ETM_BF_CMP(!=)
#undef ETM_BF_CMP
inline bfloat& operator++(bfloat& a) { return a += 1; }
inline bfloat& operator--(bfloat& a) { return a -= 1; }

// ---------------------------------------------------------------------------------------------
// Scalar classification shared by vectors and the metal:: library.
namespace etm {
template <class T>
inline constexpr bool is_scalar_v = std::is_arithmetic_v<T> || std::is_same_v<T, half> ||
                                    std::is_same_v<T, bfloat>;
template <class T>
inline constexpr bool is_fp_scalar_v = std::is_floating_point_v<T> || std::is_same_v<T, half> ||
                                       std::is_same_v<T, bfloat>;

template <class T, int N>
struct vec;
template <class T, int N, int... I>
struct swz;

template <class T>
struct vec_traits {
  static constexpr int size = 1;
  using elem = T;
  static constexpr bool is_vec = false;
};
template <class T, int N>
struct vec_traits<vec<T, N>> {
  static constexpr int size = N;
  using elem = T;
  static constexpr bool is_vec = true;
};
template <class T, int N, int... I>
struct vec_traits<swz<T, N, I...>> {
  static constexpr int size = sizeof...(I);
  using elem = T;
  static constexpr bool is_vec = true;
};
template <class T>
inline constexpr bool is_swz_v = false;
template <class T, int N, int... I>
inline constexpr bool is_swz_v<swz<T, N, I...>> = true;
template <class T>
inline constexpr bool is_vec_v = vec_traits<std::remove_cv_t<T>>::is_vec;
template <class T>
inline constexpr int comps_v = vec_traits<std::remove_cv_t<std::remove_reference_t<T>>>::size;

constexpr int storage_n(int n) { return n == 3 ? 4 : n; }

// A swizzle: a view of the storage of the vector it lives in (a union member), read as a
// vector of sizeof...(I) components, assignable when it names distinct components.
template <class T, int N, int... I>
struct swz {
  T s[storage_n(N)];
  using V = vec<T, int(sizeof...(I))>;
  constexpr operator V() const { return V(s[I]...); }
  V get() const { return V(s[I]...); }
  swz& operator=(const V& o) {
    int k = 0;
    ((s[I] = o[k++]), ...);
    return *this;
  }
  swz& operator=(const swz& o) { return *this = o.get(); }
  template <class S, std::enable_if_t<is_scalar_v<S>, int> = 0>
  swz& operator=(S o) {
    ((s[I] = T(o)), ...);
    return *this;
  }
#define ETM_SWZ_CASSIGN(OP)                  \
  template <class R>                          \
  swz& operator OP##=(const R& r) {           \
    return *this = V(get() OP r);             \
  }
  ETM_SWZ_CASSIGN(+)
  ETM_SWZ_CASSIGN(-)
  ETM_SWZ_CASSIGN(*)
  ETM_SWZ_CASSIGN(/)
#undef ETM_SWZ_CASSIGN
  T operator[](int i) const { return get()[i]; }
};

template <class X>
constexpr decltype(auto) devec(const X& x) {
  if constexpr (is_swz_v<X>)
    return x.get();
  else
    return (x);
}

// The members of vec<T, N>'s union, by size.
#define ETM_SW2(T, N, a, b, A, B) swz<T, N, A, B> a##b;
#define ETM_SW3(T, N, a, b, c, A, B, C) swz<T, N, A, B, C> a##b##c;

// A vector copies its components, not the union: swizzle members have their own assignment
// (a.xy = b.yx writes two components), which would otherwise delete the union's.
#define ETM_VEC_COPY(N)                                                        \
  vec_base() = default;                                                        \
  constexpr vec_base(const vec_base& o) : v{} {                                \
    for (int i = 0; i < N; i++) v[i] = o.v[i];                                 \
  }                                                                            \
  constexpr vec_base& operator=(const vec_base& o) {                           \
    for (int i = 0; i < N; i++) v[i] = o.v[i];                                 \
    return *this;                                                              \
  }

template <class T, int N>
struct vec_base;

template <class T>
struct vec_base<T, 2> {
  ETM_VEC_COPY(2)
  union {
    T v[2];
    struct {
      T x, y;
    };
    struct {
      T r, g;
    };
    swz<T, 2, 0, 0> xx;
    swz<T, 2, 0, 1> xy;
    swz<T, 2, 1, 0> yx;
    swz<T, 2, 1, 1> yy;
    swz<T, 2, 0, 1, 0> xyx;
    swz<T, 2, 0, 1, 1> xyy;
    swz<T, 2, 0, 0, 1> xxy;
    swz<T, 2, 0, 1, 0, 1> xyxy;
    swz<T, 2, 0, 0, 1, 1> xxyy;
  };
};

template <class T>
struct vec_base<T, 3> {
  ETM_VEC_COPY(3)
  union {
    T v[4];
    struct {
      T x, y, z;
    };
    struct {
      T r, g, b;
    };
    swz<T, 3, 0, 1> xy;
    swz<T, 3, 0, 2> xz;
    swz<T, 3, 1, 0> yx;
    swz<T, 3, 1, 2> yz;
    swz<T, 3, 2, 0> zx;
    swz<T, 3, 2, 1> zy;
    swz<T, 3, 0, 0> xx;
    swz<T, 3, 1, 1> yy;
    swz<T, 3, 2, 2> zz;
    swz<T, 3, 0, 1, 2> xyz;
    swz<T, 3, 0, 1, 2> rgb;
    swz<T, 3, 2, 1, 0> zyx;
    swz<T, 3, 1, 2, 0> yzx;
    swz<T, 3, 2, 0, 1> zxy;
    swz<T, 3, 0, 2, 1> xzy;
    swz<T, 3, 1, 0, 2> yxz;
    swz<T, 3, 0, 0, 0> xxx;
    swz<T, 3, 1, 1, 1> yyy;
    swz<T, 3, 2, 2, 2> zzz;
  };
};

template <class T>
struct vec_base<T, 4> {
  ETM_VEC_COPY(4)
  union {
    T v[4];
    struct {
      T x, y, z, w;
    };
    struct {
      T r, g, b, a;
    };
    swz<T, 4, 0, 1> xy;
    swz<T, 4, 0, 2> xz;
    swz<T, 4, 0, 3> xw;
    swz<T, 4, 1, 0> yx;
    swz<T, 4, 1, 2> yz;
    swz<T, 4, 1, 3> yw;
    swz<T, 4, 2, 0> zx;
    swz<T, 4, 2, 1> zy;
    swz<T, 4, 2, 3> zw;
    swz<T, 4, 3, 0> wx;
    swz<T, 4, 3, 1> wy;
    swz<T, 4, 3, 2> wz;
    swz<T, 4, 0, 0> xx;
    swz<T, 4, 1, 1> yy;
    swz<T, 4, 2, 2> zz;
    swz<T, 4, 3, 3> ww;
    swz<T, 4, 0, 1, 2> xyz;
    swz<T, 4, 1, 2, 3> yzw;
    swz<T, 4, 0, 1, 3> xyw;
    swz<T, 4, 0, 2, 3> xzw;
    swz<T, 4, 2, 1, 0> zyx;
    swz<T, 4, 3, 2, 1> wzy;
    swz<T, 4, 0, 1, 2> rgb;
    swz<T, 4, 0, 1, 2, 3> xyzw;
    swz<T, 4, 0, 1, 2, 3> rgba;
    swz<T, 4, 3, 2, 1, 0> wzyx;
    swz<T, 4, 2, 1, 0, 3> zyxw;
    swz<T, 4, 1, 0, 3, 2> yxwz;
    swz<T, 4, 2, 3, 0, 1> zwxy;
    swz<T, 4, 0, 0, 1, 1> xxyy;
    swz<T, 4, 2, 2, 3, 3> zzww;
    swz<T, 4, 0, 2, 1, 3> xzyw;
    swz<T, 4, 3, 0, 1, 2> wxyz;
    swz<T, 4, 1, 2, 3, 0> yzwx;
    swz<T, 4, 2, 1, 0, 3> bgra;
  };
};

template <class T, int N>
struct alignas(sizeof(T) * storage_n(N)) vec : vec_base<T, N> {
  using vec_base<T, N>::v;
  using value_type = T;
  vec() = default;
  // splat: float4 f = 1.0f;  int2(0)
  template <class S, std::enable_if_t<is_scalar_v<S>, int> = 0>
  constexpr vec(S s) : vec_base<T, N>{} {
    for (int i = 0; i < N; i++) v[i] = T(s);
  }
  // components from scalars and vectors: float4(a.xy, 0, 1), float3(v2, z)
  template <class A0, class A1, class... As,
            std::enable_if_t<comps_v<A0> + comps_v<A1> + (0 + ... + comps_v<As>) == N, int> = 0>
  constexpr vec(const A0& a0, const A1& a1, const As&... as) : vec_base<T, N>{} {
    int k = 0;
    put(k, a0);
    put(k, a1);
    (put(k, as), ...);
  }
  // between element types: explicit, as in MSL (float2(int2), static_cast<half4>(f4))
  template <class U, std::enable_if_t<!std::is_same_v<U, T>, int> = 0>
  explicit constexpr vec(const vec<U, N>& o) : vec_base<T, N>{} {
    for (int i = 0; i < N; i++) v[i] = T(o.v[i]);
  }
  template <int M, int... I, std::enable_if_t<sizeof...(I) == N, int> = 0>
  constexpr vec(const swz<T, M, I...>& s) : vec(s.get()) {}

  constexpr T& operator[](int i) { return v[i]; }
  constexpr const T& operator[](int i) const { return v[i]; }

 private:
  template <class X>
  constexpr void put(int& k, const X& x) {
    if constexpr (is_swz_v<X>) {
      auto g = x.get();
      for (int i = 0; i < comps_v<X>; i++) v[k++] = T(g[i]);
    } else if constexpr (is_vec_v<X>) {
      for (int i = 0; i < comps_v<X>; i++) v[k++] = T(x.v[i]);
    } else {
      v[k++] = T(x);
    }
  }
};

// Element-wise operators: vector (op) vector of the same element type, vector (op) scalar,
// scalar (op) vector (the scalar converts to the element type, as in MSL).
#define ETM_VEC_BINOP(OP)                                                                  \
  template <class T, int N>                                                                \
  constexpr vec<T, N> operator OP(const vec<T, N>& a, const vec<T, N>& b) {                \
    vec<T, N> r{};                                                                         \
    for (int i = 0; i < N; i++) r.v[i] = T(a.v[i] OP b.v[i]);                              \
    return r;                                                                              \
  }                                                                                        \
  template <class T, int N, class S, std::enable_if_t<is_scalar_v<S>, int> = 0>            \
  constexpr vec<T, N> operator OP(const vec<T, N>& a, S s) {                               \
    return a OP vec<T, N>(T(s));                                                           \
  }                                                                                        \
  template <class T, int N, class S, std::enable_if_t<is_scalar_v<S>, int> = 0>            \
  constexpr vec<T, N> operator OP(S s, const vec<T, N>& b) {                               \
    return vec<T, N>(T(s)) OP b;                                                           \
  }                                                                                        \
  template <class T, int N, class R>                                                       \
  constexpr vec<T, N>& operator OP##=(vec<T, N>& a, const R& b) {                          \
    a = a OP devec(b);                                                                     \
    return a;                                                                              \
  }                                                                                        \
  template <class A, class B, std::enable_if_t<is_swz_v<A> || is_swz_v<B>, int> = 0>       \
  constexpr auto operator OP(const A& a, const B& b) {                                     \
    return devec(a) OP devec(b);                                                           \
  }
ETM_VEC_BINOP(+)
ETM_VEC_BINOP(-)
ETM_VEC_BINOP(*)
ETM_VEC_BINOP(/)
ETM_VEC_BINOP(%)
ETM_VEC_BINOP(&)
ETM_VEC_BINOP(|)
ETM_VEC_BINOP(^)
ETM_VEC_BINOP(<<)
ETM_VEC_BINOP(>>)
#undef ETM_VEC_BINOP

#define ETM_VEC_CMP(OP)                                                                    \
  template <class T, int N>                                                                \
  constexpr vec<bool, N> operator OP(const vec<T, N>& a, const vec<T, N>& b) {             \
    vec<bool, N> r{};                                                                      \
    for (int i = 0; i < N; i++) r.v[i] = a.v[i] OP b.v[i];                                 \
    return r;                                                                              \
  }                                                                                        \
  template <class T, int N, class S, std::enable_if_t<is_scalar_v<S>, int> = 0>            \
  constexpr vec<bool, N> operator OP(const vec<T, N>& a, S s) {                            \
    return a OP vec<T, N>(T(s));                                                           \
  }                                                                                        \
  template <class T, int N, class S, std::enable_if_t<is_scalar_v<S>, int> = 0>            \
  constexpr vec<bool, N> operator OP(S s, const vec<T, N>& b) {                            \
    return vec<T, N>(T(s)) OP b;                                                           \
  }                                                                                        \
  template <class A, class B, std::enable_if_t<is_swz_v<A> || is_swz_v<B>, int> = 0>       \
  constexpr auto operator OP(const A& a, const B& b) {                                     \
    return devec(a) OP devec(b);                                                           \
  }
ETM_VEC_CMP(==)
ETM_VEC_CMP(!=)
ETM_VEC_CMP(<)
ETM_VEC_CMP(>)
ETM_VEC_CMP(<=)
ETM_VEC_CMP(>=)
ETM_VEC_CMP(&&)
ETM_VEC_CMP(||)
#undef ETM_VEC_CMP

template <class T, int N>
constexpr vec<T, N> operator-(const vec<T, N>& a) {
  vec<T, N> r{};
  for (int i = 0; i < N; i++) r.v[i] = T(-a.v[i]);
  return r;
}
template <class T, int N>
constexpr vec<T, N> operator+(const vec<T, N>& a) {
  return a;
}
template <class T, int N>
constexpr vec<T, N> operator~(const vec<T, N>& a) {
  vec<T, N> r{};
  for (int i = 0; i < N; i++) r.v[i] = T(~a.v[i]);
  return r;
}
template <class T, int N>
constexpr vec<bool, N> operator!(const vec<T, N>& a) {
  vec<bool, N> r{};
  for (int i = 0; i < N; i++) r.v[i] = !a.v[i];
  return r;
}
template <class T, int N, int... I>
constexpr auto operator-(const swz<T, N, I...>& a) {
  return -a.get();
}
}  // namespace etm

#define ETM_VEC_NAMES(T, NAME) \
  typedef etm::vec<T, 2> NAME##2;  \
  typedef etm::vec<T, 3> NAME##3;  \
  typedef etm::vec<T, 4> NAME##4;
ETM_VEC_NAMES(float, float)
ETM_VEC_NAMES(half, half)
ETM_VEC_NAMES(bfloat, bfloat)
ETM_VEC_NAMES(int, int)
ETM_VEC_NAMES(uint, uint)
ETM_VEC_NAMES(short, short)
ETM_VEC_NAMES(ushort, ushort)
ETM_VEC_NAMES(char, char)
ETM_VEC_NAMES(uchar, uchar)
ETM_VEC_NAMES(long, long)
ETM_VEC_NAMES(ulong, ulong)
ETM_VEC_NAMES(bool, bool)
#undef ETM_VEC_NAMES

// ---------------------------------------------------------------------------------------------
// The metal:: library.
namespace metal {
using std::declval;
using std::enable_if;
using std::enable_if_t;
using std::conditional;
using std::conditional_t;
using std::is_same;
using std::is_same_v;
using std::remove_cv_t;
using std::remove_reference_t;
using std::decay_t;
using std::integral_constant;
using std::bool_constant;
using std::true_type;
using std::false_type;
using std::is_convertible_v;
using std::is_pointer_v;
using std::is_const_v;
using std::make_unsigned_t;
using std::make_signed_t;

template <class T, size_t N>
using array = std::array<T, N>;

// Metal's traits see through vectors: is_floating_point_v<float2> is true.
template <class T>
struct is_floating_point : bool_constant<etm::is_fp_scalar_v<typename etm::vec_traits<remove_cv_t<T>>::elem>> {};
template <class T>
inline constexpr bool is_floating_point_v = is_floating_point<T>::value;
template <class T>
struct is_integral : bool_constant<std::is_integral_v<typename etm::vec_traits<remove_cv_t<T>>::elem>> {};
template <class T>
inline constexpr bool is_integral_v = is_integral<T>::value;
template <class T>
struct is_arithmetic : bool_constant<is_integral_v<T> || is_floating_point_v<T>> {};
template <class T>
inline constexpr bool is_arithmetic_v = is_arithmetic<T>::value;
template <class T>
struct is_scalar : bool_constant<etm::is_scalar_v<remove_cv_t<T>> || std::is_enum_v<T> || std::is_pointer_v<T>> {};
template <class T>
inline constexpr bool is_scalar_v = is_scalar<T>::value;
template <class T>
struct is_vector : bool_constant<etm::is_vec_v<remove_cv_t<T>>> {};
template <class T>
inline constexpr bool is_vector_v = is_vector<T>::value;
template <class T>
struct is_signed
    : bool_constant<etm::is_fp_scalar_v<typename etm::vec_traits<remove_cv_t<T>>::elem> ||
                    std::is_signed_v<typename etm::vec_traits<remove_cv_t<T>>::elem>> {};
template <class T>
inline constexpr bool is_signed_v = is_signed<T>::value;
template <class T>
struct is_unsigned : bool_constant<std::is_unsigned_v<typename etm::vec_traits<remove_cv_t<T>>::elem>> {};
template <class T>
inline constexpr bool is_unsigned_v = is_unsigned<T>::value;
template <class T>
struct vec_elements : integral_constant<int, etm::vec_traits<remove_cv_t<T>>::size> {};

template <class T>
struct numeric_limits : std::numeric_limits<T> {};
template <>
struct numeric_limits<half> {
  static constexpr bool is_specialized = true;
  static constexpr bool is_signed = true;
  static constexpr bool is_integer = false;
  static constexpr bool has_infinity = true;
  static constexpr bool has_quiet_NaN = true;
  static constexpr int digits = 11;
  static constexpr half min() { return half(6.103515625e-05f); }
  static constexpr half max() { return half(65504.0f); }
  static constexpr half lowest() { return half(-65504.0f); }
  static constexpr half epsilon() { return half(0.0009765625f); }
  static constexpr half infinity() { return half(__builtin_inff()); }
  static constexpr half quiet_NaN() { return half(__builtin_nanf("")); }
  static constexpr half denorm_min() { return half(5.9604644775390625e-08f); }
};
template <>
struct numeric_limits<bfloat> {
  static constexpr bool is_specialized = true;
  static constexpr bool is_signed = true;
  static constexpr bool is_integer = false;
  static constexpr bool has_infinity = true;
  static constexpr bool has_quiet_NaN = true;
  static constexpr int digits = 8;
  static constexpr bfloat min() { return bfloat::from_bits(0x0080); }
  static constexpr bfloat max() { return bfloat::from_bits(0x7f7f); }
  static constexpr bfloat lowest() { return bfloat::from_bits(0xff7f); }
  static constexpr bfloat epsilon() { return bfloat::from_bits(0x3c00); }
  static constexpr bfloat infinity() { return bfloat::from_bits(0x7f80); }
  static constexpr bfloat quiet_NaN() { return bfloat::from_bits(0x7fc0); }
  static constexpr bfloat denorm_min() { return bfloat::from_bits(0x0001); }
};

template <class To, class From>
inline To as_type(const From& f) {
  static_assert(sizeof(To) == sizeof(From), "as_type: the two types differ in size");
  To t;
  std::memcpy(static_cast<void*>(&t), static_cast<const void*>(&f), sizeof(To));
  return t;
}

namespace detail {
// The type a math function returns for a scalar argument: half and bfloat keep their type,
// everything else (float, the double a literal makes on the host, integers) is float.
template <class T>
using fres_t = std::conditional_t<std::is_same_v<T, half> || std::is_same_v<T, bfloat>, T, float>;
template <class T, class F>
inline auto map(const etm::vec<T, 2>& a, F f) {
  using R = decltype(f(a.v[0]));
  return etm::vec<R, 2>(f(a.v[0]), f(a.v[1]));
}
template <class T, class F>
inline auto map(const etm::vec<T, 3>& a, F f) {
  using R = decltype(f(a.v[0]));
  return etm::vec<R, 3>(f(a.v[0]), f(a.v[1]), f(a.v[2]));
}
template <class T, class F>
inline auto map(const etm::vec<T, 4>& a, F f) {
  using R = decltype(f(a.v[0]));
  return etm::vec<R, 4>(f(a.v[0]), f(a.v[1]), f(a.v[2]), f(a.v[3]));
}
template <class T, int N, class F>
inline auto map2(const etm::vec<T, N>& a, const etm::vec<T, N>& b, F f) {
  etm::vec<decltype(f(a.v[0], b.v[0])), N> r{};
  for (int i = 0; i < N; i++) r.v[i] = f(a.v[i], b.v[i]);
  return r;
}
template <class T, int N, class F>
inline auto map3(const etm::vec<T, N>& a, const etm::vec<T, N>& b, const etm::vec<T, N>& c, F f) {
  etm::vec<decltype(f(a.v[0], b.v[0], c.v[0])), N> r{};
  for (int i = 0; i < N; i++) r.v[i] = f(a.v[i], b.v[i], c.v[i]);
  return r;
}
}  // namespace detail

// One-argument float functions: scalars (computed in float, returned in the argument's
// precision) and vectors (per component).
#define ETM_MATH1(NAME, EXPR)                                                           \
  template <class T, std::enable_if_t<etm::is_scalar_v<T>, int> = 0>                    \
  inline detail::fres_t<T> NAME(T x_) {                                                 \
    const float x = float(x_);                                                          \
    return detail::fres_t<T>(EXPR);                                                     \
  }                                                                                     \
  template <class T, int N>                                                             \
  inline auto NAME(const etm::vec<T, N>& v) {                                           \
    return detail::map(v, [](T e) { return NAME(e); });                                 \
  }
#define ETM_MATH2(NAME, EXPR)                                                           \
  template <class T, std::enable_if_t<etm::is_scalar_v<T>, int> = 0>                    \
  inline detail::fres_t<T> NAME(T x_, T y_) {                                           \
    const float x = float(x_), y = float(y_);                                           \
    return detail::fres_t<T>(EXPR);                                                     \
  }                                                                                     \
  template <class T, class U,                                                           \
            std::enable_if_t<etm::is_scalar_v<T> && etm::is_scalar_v<U> &&              \
                                 !std::is_same_v<T, U>, int> = 0>                       \
  inline float NAME(T x_, U y_) {                                                       \
    const float x = float(x_), y = float(y_);                                           \
    return float(EXPR);                                                                 \
  }                                                                                     \
  template <class T, int N>                                                             \
  inline auto NAME(const etm::vec<T, N>& a, const etm::vec<T, N>& b) {                  \
    return detail::map2(a, b, [](T p, T q) { return NAME(p, q); });                     \
  }                                                                                     \
  template <class T, int N, class S, std::enable_if_t<etm::is_scalar_v<S>, int> = 0>    \
  inline auto NAME(const etm::vec<T, N>& a, S s) {                                      \
    return NAME(a, etm::vec<T, N>(T(s)));                                               \
  }

ETM_MATH1(exp, std::exp(x))
ETM_MATH1(exp2, std::exp2(x))
ETM_MATH1(exp10, std::pow(10.0f, x))
ETM_MATH1(expm1, std::expm1(x))
ETM_MATH1(log, std::log(x))
ETM_MATH1(log2, std::log2(x))
ETM_MATH1(log10, std::log10(x))
ETM_MATH1(log1p, std::log1p(x))
ETM_MATH1(sqrt, std::sqrt(x))
ETM_MATH1(rsqrt, 1.0f / std::sqrt(x))
ETM_MATH1(cbrt, std::cbrt(x))
ETM_MATH1(sin, std::sin(x))
ETM_MATH1(cos, std::cos(x))
ETM_MATH1(tan, std::tan(x))
ETM_MATH1(asin, std::asin(x))
ETM_MATH1(acos, std::acos(x))
ETM_MATH1(atan, std::atan(x))
ETM_MATH1(sinh, std::sinh(x))
ETM_MATH1(cosh, std::cosh(x))
ETM_MATH1(tanh, std::tanh(x))
ETM_MATH1(asinh, std::asinh(x))
ETM_MATH1(acosh, std::acosh(x))
ETM_MATH1(atanh, std::atanh(x))
ETM_MATH1(sinpi, std::sin(float(M_PI) * x))
ETM_MATH1(cospi, std::cos(float(M_PI) * x))
ETM_MATH1(tanpi, std::tan(float(M_PI) * x))
ETM_MATH1(floor, std::floor(x))
ETM_MATH1(ceil, std::ceil(x))
ETM_MATH1(trunc, std::trunc(x))
ETM_MATH1(round, std::round(x))
ETM_MATH1(rint, std::nearbyint(x))
ETM_MATH1(fabs, std::fabs(x))
ETM_MATH1(fract, std::fmin(x - std::floor(x), 0x1.fffffep-1f))
ETM_MATH1(saturate, std::fmin(std::fmax(x, 0.0f), 1.0f))
ETM_MATH1(erf, std::erf(x))
ETM_MATH1(erfc, std::erfc(x))
ETM_MATH1(lgamma, std::lgamma(x))
ETM_MATH1(tgamma, std::tgamma(x))
ETM_MATH2(pow, std::pow(x, y))
ETM_MATH2(powr, std::pow(x, y))
ETM_MATH2(atan2, std::atan2(x, y))
ETM_MATH2(fmod, std::fmod(x, y))
ETM_MATH2(fmin, std::fmin(x, y))
ETM_MATH2(fmax, std::fmax(x, y))
ETM_MATH2(fdim, std::fdim(x, y))
ETM_MATH2(copysign, std::copysign(x, y))
ETM_MATH2(nextafter, std::nextafter(x, y))
ETM_MATH2(hypot, std::hypot(x, y))
ETM_MATH2(step, y < x ? 0.0f : 1.0f)

// sign: -1, 0 or 1; NaN gives 0 (MSL).
ETM_MATH1(sign, x > 0 ? 1.0f : (x < 0 ? -1.0f : (x == 0 ? x : 0.0f)))

template <class T, std::enable_if_t<etm::is_scalar_v<T>, int> = 0>
inline detail::fres_t<T> fma(T a, T b, T c) {
  return detail::fres_t<T>(std::fma(float(a), float(b), float(c)));
}
template <class T, class U, class V,
          std::enable_if_t<etm::is_scalar_v<T> && etm::is_scalar_v<U> && etm::is_scalar_v<V> &&
                               !(std::is_same_v<T, U> && std::is_same_v<U, V>), int> = 0>
inline float fma(T a, U b, V c) {
  return std::fma(float(a), float(b), float(c));
}
template <class T, int N>
inline auto fma(const etm::vec<T, N>& a, const etm::vec<T, N>& b, const etm::vec<T, N>& c) {
  return detail::map3(a, b, c, [](T p, T q, T r) { return fma(p, q, r); });
}
template <class T, std::enable_if_t<etm::is_scalar_v<T>, int> = 0>
inline detail::fres_t<T> mix(T a, T b, T t) {
  return detail::fres_t<T>(float(a) + (float(b) - float(a)) * float(t));
}
template <class T, int N>
inline auto mix(const etm::vec<T, N>& a, const etm::vec<T, N>& b, const etm::vec<T, N>& t) {
  return detail::map3(a, b, t, [](T p, T q, T r) { return mix(p, q, r); });
}
template <class T, class S>
inline T ldexp(T x, S e) {
  return T(std::ldexp(float(x), int(e)));
}
template <class T, class S>
inline T frexp(T x, S& e) {
  int k = 0;
  T r = T(std::frexp(float(x), &k));
  e = S(k);
  return r;
}
template <class T>
inline T modf(T x, T& ip) {
  float i = 0;
  float f = std::modf(float(x), &i);
  ip = T(i);
  return T(f);
}
template <class T, std::enable_if_t<etm::is_scalar_v<T>, int> = 0>
inline detail::fres_t<T> sincos(T x, T& c) {
  c = T(std::cos(float(x)));
  return detail::fres_t<T>(std::sin(float(x)));
}
template <class T, int N>
inline etm::vec<T, N> sincos(const etm::vec<T, N>& x, etm::vec<T, N>& c) {
  etm::vec<T, N> s{};
  for (int i = 0; i < N; i++) s.v[i] = sincos(x.v[i], c.v[i]);
  return s;
}

// abs/min/max/clamp work on integers too: integers keep their type; float min/max ignore a
// NaN operand (fmin/fmax), as MSL's do.
template <class T, std::enable_if_t<etm::is_scalar_v<T>, int> = 0>
constexpr T abs(T x) {
  if constexpr (std::is_unsigned_v<T> || std::is_same_v<T, bool>)
    return x;
  else if constexpr (std::is_integral_v<T>)
    return x < 0 ? T(-x) : x;
  else
    return T(std::fabs(float(x)));
}
template <class T, std::enable_if_t<etm::is_scalar_v<T>, int> = 0>
constexpr T max(T a, T b) {
  if constexpr (etm::is_fp_scalar_v<T>)
    return T(std::fmax(float(a), float(b)));
  else
    return a < b ? b : a;
}
template <class T, std::enable_if_t<etm::is_scalar_v<T>, int> = 0>
constexpr T min(T a, T b) {
  if constexpr (etm::is_fp_scalar_v<T>)
    return T(std::fmin(float(a), float(b)));
  else
    return b < a ? b : a;
}
template <class T, class U,
          std::enable_if_t<etm::is_scalar_v<T> && etm::is_scalar_v<U> && !std::is_same_v<T, U>,
                           int> = 0>
constexpr auto max(T a, U b) {
  using C = decltype(a + b);
  return max(C(a), C(b));
}
template <class T, class U,
          std::enable_if_t<etm::is_scalar_v<T> && etm::is_scalar_v<U> && !std::is_same_v<T, U>,
                           int> = 0>
constexpr auto min(T a, U b) {
  using C = decltype(a + b);
  return min(C(a), C(b));
}
template <class T>
constexpr T clamp(T x, T lo, T hi) {
  return min(max(x, lo), hi);
}
template <class T>
constexpr T max3(T a, T b, T c) {
  return max(max(a, b), c);
}
template <class T>
constexpr T min3(T a, T b, T c) {
  return min(min(a, b), c);
}
template <class T>
constexpr T median3(T a, T b, T c) {
  return max(min(a, b), min(max(a, b), c));
}
template <class T>
constexpr T fmax3(T a, T b, T c) {
  return max3(a, b, c);
}
template <class T>
constexpr T fmin3(T a, T b, T c) {
  return min3(a, b, c);
}
template <class T, int N>
inline etm::vec<T, N> abs(const etm::vec<T, N>& a) {
  return detail::map(a, [](T e) { return abs(e); });
}
template <class T, int N>
inline etm::vec<T, N> max(const etm::vec<T, N>& a, const etm::vec<T, N>& b) {
  return detail::map2(a, b, [](T p, T q) { return max(p, q); });
}
template <class T, int N>
inline etm::vec<T, N> min(const etm::vec<T, N>& a, const etm::vec<T, N>& b) {
  return detail::map2(a, b, [](T p, T q) { return min(p, q); });
}
template <class T, int N, class S, std::enable_if_t<etm::is_scalar_v<S>, int> = 0>
inline etm::vec<T, N> max(const etm::vec<T, N>& a, S s) {
  return max(a, etm::vec<T, N>(s));
}
template <class T, int N, class S, std::enable_if_t<etm::is_scalar_v<S>, int> = 0>
inline etm::vec<T, N> min(const etm::vec<T, N>& a, S s) {
  return min(a, etm::vec<T, N>(s));
}
template <class T, int N, class S, class U>
inline etm::vec<T, N> clamp(const etm::vec<T, N>& x, const S& lo, const U& hi) {
  return min(max(x, etm::vec<T, N>(lo)), etm::vec<T, N>(hi));
}
template <class T, std::enable_if_t<std::is_integral_v<T>, int> = 0>
constexpr T absdiff(T a, T b) {
  return a > b ? T(a - b) : T(b - a);
}

// Classification: bool for scalars, bool vectors for vectors.
template <class T, std::enable_if_t<etm::is_scalar_v<T>, int> = 0>
constexpr bool isnan(T x) {
  if constexpr (etm::is_fp_scalar_v<T>)
    return std::isnan(float(x));
  else
    return false;
}
template <class T, std::enable_if_t<etm::is_scalar_v<T>, int> = 0>
constexpr bool isinf(T x) {
  if constexpr (etm::is_fp_scalar_v<T>)
    return std::isinf(float(x));
  else
    return false;
}
template <class T, std::enable_if_t<etm::is_scalar_v<T>, int> = 0>
constexpr bool isfinite(T x) {
  if constexpr (etm::is_fp_scalar_v<T>)
    return std::isfinite(float(x));
  else
    return true;
}
template <class T, std::enable_if_t<etm::is_scalar_v<T>, int> = 0>
constexpr bool isnormal(T x) {
  return std::isnormal(float(x));
}
template <class T, std::enable_if_t<etm::is_scalar_v<T>, int> = 0>
constexpr bool signbit(T x) {
  return std::signbit(float(x));
}
template <class T, class U>
constexpr bool isunordered(T a, U b) {
  return isnan(a) || isnan(b);
}
template <class T, class U>
constexpr bool isordered(T a, U b) {
  return !isunordered(a, b);
}
#define ETM_CLASSIFY_VEC(NAME)                                            \
  template <class T, int N>                                               \
  inline etm::vec<bool, N> NAME(const etm::vec<T, N>& a) {                \
    etm::vec<bool, N> r{};                                                \
    for (int i = 0; i < N; i++) r.v[i] = NAME(a.v[i]);                    \
    return r;                                                             \
  }
ETM_CLASSIFY_VEC(isnan)
ETM_CLASSIFY_VEC(isinf)
ETM_CLASSIFY_VEC(isfinite)
ETM_CLASSIFY_VEC(signbit)
#undef ETM_CLASSIFY_VEC

constexpr bool all(bool b) { return b; }
constexpr bool any(bool b) { return b; }
template <class T, int N>
constexpr bool all(const etm::vec<T, N>& a) {
  for (int i = 0; i < N; i++)
    if (!a.v[i]) return false;
  return true;
}
template <class T, int N>
constexpr bool any(const etm::vec<T, N>& a) {
  for (int i = 0; i < N; i++)
    if (a.v[i]) return true;
  return false;
}

// select(a, b, c): c ? b : a, per component for vectors.
template <class T, std::enable_if_t<!etm::is_vec_v<T>, int> = 0>
constexpr T select(T a, T b, bool c) {
  return c ? b : a;
}
template <class T, int N>
constexpr etm::vec<T, N> select(const etm::vec<T, N>& a, const etm::vec<T, N>& b,
                                const etm::vec<bool, N>& c) {
  etm::vec<T, N> r{};
  for (int i = 0; i < N; i++) r.v[i] = c.v[i] ? b.v[i] : a.v[i];
  return r;
}
template <class T, int N>
constexpr etm::vec<T, N> select(const etm::vec<T, N>& a, const etm::vec<T, N>& b, bool c) {
  return c ? b : a;
}

// Geometric functions.
template <class T, int N>
constexpr T dot(const etm::vec<T, N>& a, const etm::vec<T, N>& b) {
  T s = T(0);
  for (int i = 0; i < N; i++) s = T(s + a.v[i] * b.v[i]);
  return s;
}
template <class T, int N>
inline T length_squared(const etm::vec<T, N>& a) {
  return dot(a, a);
}
template <class T, int N>
inline T length(const etm::vec<T, N>& a) {
  return T(std::sqrt(float(dot(a, a))));
}
template <class T, int N>
inline T distance(const etm::vec<T, N>& a, const etm::vec<T, N>& b) {
  return length(a - b);
}
template <class T, int N>
inline etm::vec<T, N> normalize(const etm::vec<T, N>& a) {
  return a * T(1.0f / std::sqrt(float(dot(a, a))));
}
template <class T>
inline etm::vec<T, 3> cross(const etm::vec<T, 3>& a, const etm::vec<T, 3>& b) {
  return etm::vec<T, 3>(a.v[1] * b.v[2] - a.v[2] * b.v[1], a.v[2] * b.v[0] - a.v[0] * b.v[2],
                        a.v[0] * b.v[1] - a.v[1] * b.v[0]);
}

// Integer functions: the argument's width decides (ctz(0) is the width, as in MSL).
template <class T, std::enable_if_t<std::is_integral_v<T>, int> = 0>
constexpr T ctz(T x) {
  using U = std::make_unsigned_t<T>;
  constexpr int bits = int(sizeof(T) * 8);
  U u = U(x);
  if (u == 0) return T(bits);
  return T(__builtin_ctzll((unsigned long long)u));
}
template <class T, std::enable_if_t<std::is_integral_v<T>, int> = 0>
constexpr T clz(T x) {
  using U = std::make_unsigned_t<T>;
  constexpr int bits = int(sizeof(T) * 8);
  U u = U(x);
  if (u == 0) return T(bits);
  return T(__builtin_clzll((unsigned long long)u) - (64 - bits));
}
template <class T, std::enable_if_t<std::is_integral_v<T>, int> = 0>
constexpr T popcount(T x) {
  using U = std::make_unsigned_t<T>;
  return T(__builtin_popcountll((unsigned long long)U(x)));
}
template <class T, std::enable_if_t<std::is_integral_v<T>, int> = 0>
constexpr T reverse_bits(T x) {
  using U = std::make_unsigned_t<T>;
  U u = U(x), r = 0;
  for (unsigned i = 0; i < sizeof(T) * 8; i++) r = U((r << 1) | ((u >> i) & 1u));
  return T(r);
}
template <class T, std::enable_if_t<std::is_integral_v<T>, int> = 0>
constexpr T rotate(T x, T n) {
  using U = std::make_unsigned_t<T>;
  constexpr unsigned bits = sizeof(T) * 8;
  unsigned k = unsigned(U(n)) % bits;
  if (k == 0) return x;
  return T(U(U(x) << k) | U(U(x) >> (bits - k)));
}
template <class T, std::enable_if_t<std::is_integral_v<T>, int> = 0>
constexpr T mulhi(T a, T b) {
  if constexpr (sizeof(T) == 8) {
    using W = std::conditional_t<std::is_signed_v<T>, __int128, unsigned __int128>;
    return T((W(a) * W(b)) >> 64);
  } else {
    using W = std::conditional_t<std::is_signed_v<T>, long long, unsigned long long>;
    return T((W(a) * W(b)) >> (sizeof(T) * 8));
  }
}
#define ETM_INT_VEC(NAME)                                              \
  template <class T, int N>                                            \
  inline etm::vec<T, N> NAME(const etm::vec<T, N>& a) {                \
    return detail::map(a, [](T e) { return NAME(e); });                \
  }
ETM_INT_VEC(ctz)
ETM_INT_VEC(clz)
ETM_INT_VEC(popcount)
#undef ETM_INT_VEC

// precise:: and fast:: name the same functions here (the host computes in IEEE float).
#define ETM_MATH_NAMES                                                                    \
  using metal::exp; using metal::exp2; using metal::exp10; using metal::log;             \
  using metal::log2; using metal::log10; using metal::sqrt; using metal::rsqrt;          \
  using metal::cbrt; using metal::sin; using metal::cos; using metal::tan;               \
  using metal::asin; using metal::acos; using metal::atan; using metal::sinh;            \
  using metal::cosh; using metal::tanh; using metal::asinh; using metal::acosh;          \
  using metal::atanh; using metal::sinpi; using metal::cospi; using metal::tanpi;        \
  using metal::floor; using metal::ceil; using metal::trunc; using metal::round;         \
  using metal::rint; using metal::fabs; using metal::fract; using metal::saturate;       \
  using metal::pow; using metal::powr; using metal::atan2; using metal::fmod;            \
  using metal::fmin; using metal::fmax; using metal::fdim; using metal::copysign;        \
  using metal::fma; using metal::sincos; using metal::ldexp; using metal::frexp;         \
  using metal::modf; using metal::divide; using metal::sign; using metal::step;          \
  using metal::clamp; using metal::min; using metal::max; using metal::abs;              \
  using metal::normalize; using metal::length; using metal::distance; using metal::dot;
template <class T, class U>
inline auto divide(T a, U b) {
  return a / b;
}
namespace precise {
ETM_MATH_NAMES
}
namespace fast {
ETM_MATH_NAMES
}
#undef ETM_MATH_NAMES
#undef ETM_MATH1
#undef ETM_MATH2

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
    std::memcpy(static_cast<void*>(&t), e.slots + lane * ETM_MSL_SLOT_BYTES, sizeof(T));
  else
    std::memset(static_cast<void*>(&t), 0, sizeof(T));
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
  explicit constexpr simd_vote(vote_t x = 0) : v(x) {}
  explicit constexpr operator vote_t() const { return v; }
  constexpr bool all() const { return v == 0xffffffffull; }
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
  return simd_vote(m);
}
inline simd_vote simd_active_threads_mask() {
  etm_msl_exchange e = detail::exchange(uint32_t(1), detail::op_ballot);
  return simd_vote(e.active);
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

// MSL code names the library unqualified (threadgroup_barrier, as_type, simd_sum, ...).
using namespace metal;

// Constants MSL defines.
#ifndef MAXFLOAT
#define MAXFLOAT FLT_MAX
#endif
#define HUGE_VALH ((half)__builtin_inff())
#define MAXHALF ((half)65504.0f)
#define M_E_F float(M_E)
#define M_LOG2E_F float(M_LOG2E)
#define M_LOG10E_F float(M_LOG10E)
#define M_LN2_F float(M_LN2)
#define M_LN10_F float(M_LN10)
#define M_PI_F float(M_PI)
#define M_PI_2_F float(M_PI_2)
#define M_PI_4_F float(M_PI_4)
#define M_1_PI_F float(M_1_PI)
#define M_2_PI_F float(M_2_PI)
#define M_2_SQRTPI_F float(M_2_SQRTPI)
#define M_SQRT2_F float(M_SQRT2)
#define M_SQRT1_2_F float(M_SQRT1_2)
#define M_E_H half(M_E)
#define M_PI_H half(M_PI)
#define M_SQRT2_H half(M_SQRT2)
#define M_LN2_H half(M_LN2)

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
}  // namespace etm
