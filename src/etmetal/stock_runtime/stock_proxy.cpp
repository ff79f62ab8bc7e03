// The proxy executor in the stock backend: a delegate whose .so calls operators without a C
// shim gets its extern-node table parsed once, at init, by the native executor of
// libetmetal_proxy.so (shims/proxy_native.cpp), which this library loads by path
// (etm_stock_configure_proxy) instead of linking: the library itself stays free of libtorch.
#include "stock_proxy.h"

#include <dlfcn.h>

#include <cstdio>
#include <cstring>
#include <mutex>
#include <sstream>
#include <vector>

#include "proxy_host.h"
#include "stock_backend.h"

extern "C" {
extern char etm_check_message[1024];
}

namespace etm_stock {
namespace {

typedef etm_proxy* (*ParseFn)(const char*, int64_t, const char* const*, int64_t, const char* const*,
                              int64_t, char*, int64_t);
typedef void (*FreeFn)(etm_proxy*);
typedef const char* (*LastErrorFn)(void);

ParseFn parse_fn = nullptr;
FreeFn free_fn = nullptr;
LastErrorFn last_error_fn = nullptr;
std::string proxy_path;
std::vector<std::string> allowed, custom;  // what only the loading process knows

std::vector<std::string> lines(const char* text) {
  std::vector<std::string> out;
  std::istringstream in(text ? text : "");
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) out.push_back(line);
  return out;
}

std::vector<const char*> pointers(const std::vector<std::string>& items) {
  std::vector<const char*> out;
  for (const auto& s : items) out.push_back(s.c_str());
  return out;
}

}  // namespace

etm_proxy* parse_extern_nodes(const void* data, size_t n, std::string* error) {
  if (!parse_fn) {
    *error = "the .so runs operators without a C shim through etmetal's proxy executor, and no "
             "proxy library is configured (etmetal.stock_runtime.register() loads it; a runner "
             "takes --proxy-lib PATH, from etmetal.shims.proxy_native.library_path())";
    return nullptr;
  }
  auto a = pointers(allowed), c = pointers(custom);
  char message[4096] = {0};
  etm_proxy* p = parse_fn((const char*)data, (int64_t)n, a.data(), (int64_t)a.size(), c.data(),
                          (int64_t)c.size(), message, sizeof(message));
  if (!p) *error = std::string("the extern-node table is refused: ") + message;
  return p;
}

void free_extern_nodes(etm_proxy* p) {
  if (p && free_fn) free_fn(p);
}

}  // namespace etm_stock

extern "C" {

ETM_EXPORT int32_t etm_stock_configure_proxy(const char* path) {
  void* lib = path ? dlopen(path, RTLD_NOW | RTLD_LOCAL) : nullptr;
  if (!lib) {
    const char* why = dlerror();
    etm_stock::set_error(std::string("etm_stock_configure_proxy: cannot load the proxy library ") +
                         (path ? path : "(null)") + ": " + (why ? why : "no such file"));
    return 1;
  }
  auto parse = (etm_stock::ParseFn)dlsym(lib, "etm_proxy_parse");
  auto free_ = (etm_stock::FreeFn)dlsym(lib, "etm_proxy_free");
  auto call = (etm_proxy_call_fn)dlsym(lib, "etm_proxy_call");
  auto last = (etm_stock::LastErrorFn)dlsym(lib, "etm_proxy_last_error");
  if (!parse || !free_ || !call || !last) {
    etm_stock::set_error(std::string("etm_stock_configure_proxy: ") + path +
                         " is not etmetal's proxy library (etm_proxy_* missing)");
    return 1;
  }
  etm_stock::parse_fn = parse;
  etm_stock::free_fn = free_;
  etm_stock::last_error_fn = last;
  etm_stock::proxy_path = path;
  etm_proxy_entry = call;
  return 0;
}

ETM_EXPORT void etm_stock_set_extern_names(const char* allowed, const char* custom) {
  etm_stock::allowed = etm_stock::lines(allowed);
  etm_stock::custom = etm_stock::lines(custom);
}

// the proxy shim's native path here: 0 served, 1 failed with the reason in etm_check_message
int etm_stock_proxy_call(void* handle, int64_t index, int64_t num_ints, const int64_t* ints,
                         int64_t num_tensors, void* const* tensors) {
  int r = etm_proxy_native(handle, index, num_ints, ints, num_tensors, tensors);
  if (r > 0) return 0;
  std::string why = r < 0 && etm_stock::last_error_fn
                        ? std::string(etm_stock::last_error_fn())
                        : "extern node " + std::to_string(index) + ": not served (no extern-node "
                          "table for this proxy handle, or a tensor handle that is not a native "
                          "host record, or the wrong number of ints/tensors)";
  std::snprintf(etm_check_message, sizeof(etm_check_message), "%s", why.c_str());
  return 1;
}

}  // extern "C"
