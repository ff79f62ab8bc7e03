// msl_compat.h, part 1: MSL's scalar and vector types (bfloat, float2..4, half2..4, int2..4, ...,
// with components, swizzles, arithmetic, comparisons and conversions).
#pragma once
#include <cstdint>
#include <type_traits>

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

// The swizzle members of vec<T, N>'s union, one table: S(name, components...), grouped by
// the highest component they name, so a vector of N components takes the groups up to N
// (MSL lets a vector name any swizzle of its components).
#define ETM_SWIZZLES_XY(S)                                                             \
  S(xx, 0, 0) S(xy, 0, 1) S(yx, 1, 0) S(yy, 1, 1) S(xxx, 0, 0, 0) S(yyy, 1, 1, 1)      \
  S(xyx, 0, 1, 0) S(xyy, 0, 1, 1) S(xxy, 0, 0, 1) S(xyxy, 0, 1, 0, 1) S(xxyy, 0, 0, 1, 1)
#define ETM_SWIZZLES_Z(S)                                                              \
  S(xz, 0, 2) S(yz, 1, 2) S(zx, 2, 0) S(zy, 2, 1) S(zz, 2, 2) S(zzz, 2, 2, 2)          \
  S(xyz, 0, 1, 2) S(rgb, 0, 1, 2) S(zyx, 2, 1, 0) S(yzx, 1, 2, 0) S(zxy, 2, 0, 1)      \
  S(xzy, 0, 2, 1) S(yxz, 1, 0, 2)
#define ETM_SWIZZLES_W(S)                                                              \
  S(xw, 0, 3) S(yw, 1, 3) S(zw, 2, 3) S(wx, 3, 0) S(wy, 3, 1) S(wz, 3, 2) S(ww, 3, 3)  \
  S(yzw, 1, 2, 3) S(xyw, 0, 1, 3) S(xzw, 0, 2, 3) S(wzy, 3, 2, 1)                      \
  S(xyzw, 0, 1, 2, 3) S(rgba, 0, 1, 2, 3) S(wzyx, 3, 2, 1, 0) S(zyxw, 2, 1, 0, 3)      \
  S(yxwz, 1, 0, 3, 2) S(zwxy, 2, 3, 0, 1) S(zzww, 2, 2, 3, 3) S(xzyw, 0, 2, 1, 3)      \
  S(wxyz, 3, 0, 1, 2) S(yzwx, 1, 2, 3, 0) S(bgra, 2, 1, 0, 3)
// one member; swz_n is the component count of the vec_base it is declared in
#define ETM_SWZ_MEMBER(name, ...) swz<T, swz_n, __VA_ARGS__> name;

// A vector assigns its components, not the union: swizzle members have their own assignment
// (a.xy = b.yx writes two components), which deletes the union's. Copy construction stays
// trivial, so vectors are still passed in registers.
#define ETM_VEC_COPY(N)                                                        \
  vec_base() = default;                                                        \
  vec_base(const vec_base&) = default;                                         \
  constexpr vec_base& operator=(const vec_base& o) {                           \
    for (int i = 0; i < N; i++) v[i] = o.v[i];                                 \
    return *this;                                                              \
  }

template <class T, int N>
struct vec_base;

template <class T>
struct vec_base<T, 2> {
  static constexpr int swz_n = 2;
  ETM_VEC_COPY(2)
  union {
    T v[2];
    struct {
      T x, y;
    };
    struct {
      T r, g;
    };
    ETM_SWIZZLES_XY(ETM_SWZ_MEMBER)
  };
};

template <class T>
struct vec_base<T, 3> {
  static constexpr int swz_n = 3;
  ETM_VEC_COPY(3)
  union {
    T v[4];
    struct {
      T x, y, z;
    };
    struct {
      T r, g, b;
    };
    ETM_SWIZZLES_XY(ETM_SWZ_MEMBER) ETM_SWIZZLES_Z(ETM_SWZ_MEMBER)
  };
};

template <class T>
struct vec_base<T, 4> {
  static constexpr int swz_n = 4;
  ETM_VEC_COPY(4)
  union {
    T v[4];
    struct {
      T x, y, z, w;
    };
    struct {
      T r, g, b, a;
    };
    ETM_SWIZZLES_XY(ETM_SWZ_MEMBER) ETM_SWIZZLES_Z(ETM_SWZ_MEMBER) ETM_SWIZZLES_W(ETM_SWZ_MEMBER)
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
  template <class U, int M, int... I, std::enable_if_t<sizeof...(I) == N, int> = 0>
  explicit(!std::is_same_v<U, T>) constexpr vec(const swz<U, M, I...>& s) : vec(s.get()) {}

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
