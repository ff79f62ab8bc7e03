// msl_compat.h, part 4, in a checked build only (ETM_MSL_CHECK, see msl_instrument.py): the
// accessors the instrumented subscripts call. `p` is the element's address as the subscript
// computed it; the result is where the access goes (p, or the checker's scratch memory when
// the access is outside its memory).
#pragma once
#include "msl_abi.h"

namespace etm::check {
constexpr unsigned kScratchBytes = 4096;  // msl_check.cpp's scratch

template <class T>
inline T* device_access(T* p, int buffer, unsigned flags, unsigned site) {
  static_assert(sizeof(T) <= kScratchBytes, "element wider than the checker's scratch");
  return static_cast<T*>(etm_msl_check_device(p, sizeof(T), buffer, flags, site));
}

template <class T>
inline T* tg_access(T* p, unsigned flags, unsigned site) {
  static_assert(sizeof(T) <= kScratchBytes, "element wider than the checker's scratch");
  return static_cast<T*>(etm_msl_check_threadgroup(p, sizeof(T), nullptr, flags, site));
}

// a subscript of a declared threadgroup array: it must stay inside that array
template <class T, class A>
inline T* tg_array_access(T* p, A& array, unsigned flags, unsigned site) {
  static_assert(sizeof(T) <= kScratchBytes, "element wider than the checker's scratch");
  const void* base = __builtin_addressof(array);
  return static_cast<T*>(etm_msl_check_threadgroup(p, sizeof(T), base, flags, site));
}

template <class T>
inline void declare_tg(T& array, unsigned site) {
  etm_msl_declare_threadgroup(__builtin_addressof(array), sizeof(T), site);
}
}  // namespace etm::check
