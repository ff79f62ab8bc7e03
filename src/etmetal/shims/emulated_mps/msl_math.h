// msl_compat.h, part 2: the metal:: library's type traits, numeric_limits, as_type and math
// (float, integer, relational and geometric functions, with precise:: and fast::).
#pragma once
#include <array>
#include <limits>
#include <type_traits>
#include <utility>

#include "msl_types.h"

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
  __builtin_memcpy(static_cast<void*>(&t), static_cast<const void*>(&f), sizeof(To));
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

ETM_MATH1(exp, __builtin_expf(x))
ETM_MATH1(exp2, __builtin_exp2f(x))
ETM_MATH1(exp10, __builtin_powf(10.0f, x))
ETM_MATH1(expm1, __builtin_expm1f(x))
ETM_MATH1(log, __builtin_logf(x))
ETM_MATH1(log2, __builtin_log2f(x))
ETM_MATH1(log10, __builtin_log10f(x))
ETM_MATH1(log1p, __builtin_log1pf(x))
ETM_MATH1(sqrt, __builtin_sqrtf(x))
ETM_MATH1(rsqrt, 1.0f / __builtin_sqrtf(x))
ETM_MATH1(cbrt, __builtin_cbrtf(x))
ETM_MATH1(sin, __builtin_sinf(x))
ETM_MATH1(cos, __builtin_cosf(x))
ETM_MATH1(tan, __builtin_tanf(x))
ETM_MATH1(asin, __builtin_asinf(x))
ETM_MATH1(acos, __builtin_acosf(x))
ETM_MATH1(atan, __builtin_atanf(x))
ETM_MATH1(sinh, __builtin_sinhf(x))
ETM_MATH1(cosh, __builtin_coshf(x))
ETM_MATH1(tanh, __builtin_tanhf(x))
ETM_MATH1(asinh, __builtin_asinhf(x))
ETM_MATH1(acosh, __builtin_acoshf(x))
ETM_MATH1(atanh, __builtin_atanhf(x))
ETM_MATH1(sinpi, __builtin_sinf(3.14159265358979323846f * x))
ETM_MATH1(cospi, __builtin_cosf(3.14159265358979323846f * x))
ETM_MATH1(tanpi, __builtin_tanf(3.14159265358979323846f * x))
ETM_MATH1(floor, __builtin_floorf(x))
ETM_MATH1(ceil, __builtin_ceilf(x))
ETM_MATH1(trunc, __builtin_truncf(x))
ETM_MATH1(round, __builtin_roundf(x))
ETM_MATH1(rint, __builtin_nearbyintf(x))
ETM_MATH1(fabs, __builtin_fabsf(x))
ETM_MATH1(fract, __builtin_fminf(x - __builtin_floorf(x), 0x1.fffffep-1f))
ETM_MATH1(saturate, __builtin_fminf(__builtin_fmaxf(x, 0.0f), 1.0f))
ETM_MATH1(erf, __builtin_erff(x))
ETM_MATH1(erfc, __builtin_erfcf(x))
ETM_MATH1(lgamma, __builtin_lgammaf(x))
ETM_MATH1(tgamma, __builtin_tgammaf(x))
ETM_MATH2(pow, __builtin_powf(x, y))
ETM_MATH2(powr, __builtin_powf(x, y))
ETM_MATH2(atan2, __builtin_atan2f(x, y))
ETM_MATH2(fmod, __builtin_fmodf(x, y))
ETM_MATH2(fmin, __builtin_fminf(x, y))
ETM_MATH2(fmax, __builtin_fmaxf(x, y))
ETM_MATH2(fdim, __builtin_fdimf(x, y))
ETM_MATH2(copysign, __builtin_copysignf(x, y))
ETM_MATH2(nextafter, __builtin_nextafterf(x, y))
ETM_MATH2(hypot, __builtin_hypotf(x, y))
ETM_MATH2(step, y < x ? 0.0f : 1.0f)

// sign: -1, 0 or 1; NaN gives 0 (MSL).
ETM_MATH1(sign, x > 0 ? 1.0f : (x < 0 ? -1.0f : (x == 0 ? x : 0.0f)))

template <class T, std::enable_if_t<etm::is_scalar_v<T>, int> = 0>
inline detail::fres_t<T> fma(T a, T b, T c) {
  return detail::fres_t<T>(__builtin_fmaf(float(a), float(b), float(c)));
}
template <class T, class U, class V,
          std::enable_if_t<etm::is_scalar_v<T> && etm::is_scalar_v<U> && etm::is_scalar_v<V> &&
                               !(std::is_same_v<T, U> && std::is_same_v<U, V>), int> = 0>
inline float fma(T a, U b, V c) {
  return __builtin_fmaf(float(a), float(b), float(c));
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
  return T(__builtin_ldexpf(float(x), int(e)));
}
template <class T, class S>
inline T frexp(T x, S& e) {
  int k = 0;
  T r = T(__builtin_frexpf(float(x), &k));
  e = S(k);
  return r;
}
template <class T>
inline T modf(T x, T& ip) {
  float i = 0;
  float f = __builtin_modff(float(x), &i);
  ip = T(i);
  return T(f);
}
template <class T, std::enable_if_t<etm::is_scalar_v<T>, int> = 0>
inline detail::fres_t<T> sincos(T x, T& c) {
  c = T(__builtin_cosf(float(x)));
  return detail::fres_t<T>(__builtin_sinf(float(x)));
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
    return T(__builtin_fabsf(float(x)));
}
template <class T, std::enable_if_t<etm::is_scalar_v<T>, int> = 0>
constexpr T max(T a, T b) {
  if constexpr (etm::is_fp_scalar_v<T>)
    return T(__builtin_fmaxf(float(a), float(b)));
  else
    return a < b ? b : a;
}
template <class T, std::enable_if_t<etm::is_scalar_v<T>, int> = 0>
constexpr T min(T a, T b) {
  if constexpr (etm::is_fp_scalar_v<T>)
    return T(__builtin_fminf(float(a), float(b)));
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
    return __builtin_isnan(float(x));
  else
    return false;
}
template <class T, std::enable_if_t<etm::is_scalar_v<T>, int> = 0>
constexpr bool isinf(T x) {
  if constexpr (etm::is_fp_scalar_v<T>)
    return __builtin_isinf(float(x));
  else
    return false;
}
template <class T, std::enable_if_t<etm::is_scalar_v<T>, int> = 0>
constexpr bool isfinite(T x) {
  if constexpr (etm::is_fp_scalar_v<T>)
    return __builtin_isfinite(float(x));
  else
    return true;
}
template <class T, std::enable_if_t<etm::is_scalar_v<T>, int> = 0>
constexpr bool isnormal(T x) {
  return __builtin_isnormal(float(x));
}
template <class T, std::enable_if_t<etm::is_scalar_v<T>, int> = 0>
constexpr bool signbit(T x) {
  return __builtin_signbit(float(x));
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
  return T(__builtin_sqrtf(float(dot(a, a))));
}
template <class T, int N>
inline T distance(const etm::vec<T, N>& a, const etm::vec<T, N>& b) {
  return length(a - b);
}
template <class T, int N>
inline etm::vec<T, N> normalize(const etm::vec<T, N>& a) {
  return a * T(1.0f / __builtin_sqrtf(float(dot(a, a))));
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

// A swizzle passed to a library function is read as the vector it names.
#define ETM_SWZ_FWD1(NAME)                                                        \
  template <class A, std::enable_if_t<etm::is_swz_v<A>, int> = 0>                 \
  inline auto NAME(const A& a) {                                                  \
    return NAME(a.get());                                                         \
  }
#define ETM_SWZ_FWD2(NAME)                                                        \
  template <class A, class B,                                                     \
            std::enable_if_t<etm::is_swz_v<A> || etm::is_swz_v<B>, int> = 0>      \
  inline auto NAME(const A& a, const B& b) {                                      \
    return NAME(etm::devec(a), etm::devec(b));                                    \
  }
#define ETM_SWZ_FWD3(NAME)                                                        \
  template <class A, class B, class C,                                            \
            std::enable_if_t<etm::is_swz_v<A> || etm::is_swz_v<B> || etm::is_swz_v<C>, int> = 0> \
  inline auto NAME(const A& a, const B& b, const C& c) {                          \
    return NAME(etm::devec(a), etm::devec(b), etm::devec(c));                     \
  }
ETM_SWZ_FWD1(exp) ETM_SWZ_FWD1(exp2) ETM_SWZ_FWD1(log) ETM_SWZ_FWD1(log2) ETM_SWZ_FWD1(sqrt)
ETM_SWZ_FWD1(rsqrt) ETM_SWZ_FWD1(sin) ETM_SWZ_FWD1(cos) ETM_SWZ_FWD1(tan) ETM_SWZ_FWD1(tanh)
ETM_SWZ_FWD1(floor) ETM_SWZ_FWD1(ceil) ETM_SWZ_FWD1(trunc) ETM_SWZ_FWD1(round) ETM_SWZ_FWD1(rint)
ETM_SWZ_FWD1(fabs) ETM_SWZ_FWD1(abs) ETM_SWZ_FWD1(fract) ETM_SWZ_FWD1(saturate) ETM_SWZ_FWD1(sign)
ETM_SWZ_FWD1(length) ETM_SWZ_FWD1(length_squared) ETM_SWZ_FWD1(normalize) ETM_SWZ_FWD1(all)
ETM_SWZ_FWD1(any) ETM_SWZ_FWD1(isnan) ETM_SWZ_FWD1(isinf) ETM_SWZ_FWD1(isfinite)
ETM_SWZ_FWD1(ctz) ETM_SWZ_FWD1(clz) ETM_SWZ_FWD1(popcount)
ETM_SWZ_FWD2(dot) ETM_SWZ_FWD2(cross) ETM_SWZ_FWD2(distance) ETM_SWZ_FWD2(min) ETM_SWZ_FWD2(max)
ETM_SWZ_FWD2(pow) ETM_SWZ_FWD2(atan2) ETM_SWZ_FWD2(fmin) ETM_SWZ_FWD2(fmax) ETM_SWZ_FWD2(fmod)
ETM_SWZ_FWD2(step) ETM_SWZ_FWD2(copysign)
ETM_SWZ_FWD3(select) ETM_SWZ_FWD3(clamp) ETM_SWZ_FWD3(mix) ETM_SWZ_FWD3(fma)
#undef ETM_SWZ_FWD1
#undef ETM_SWZ_FWD2
#undef ETM_SWZ_FWD3

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
}  // namespace metal
