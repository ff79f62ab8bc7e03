// Loading a delegate's .so without a compiler.
//
// The .so leaves every aoti_torch_* undefined, and they must bind to this library's
// trampoline without any of them entering the process-wide scope (torch's own AOTI
// runner, loaded later, must still bind to libtorch). dlopen has no argument naming the
// scope to resolve against, but a link group does it: dlopen(wrapper, RTLD_LOCAL) of an
// empty object whose DT_NEEDED are [this library, libtorch_cpu (SLEEF vector math),
// model] resolves the model's undefined symbols, after the global scope, in that order.
// etmetal's Python runtime links such a wrapper per model (shims/model_link.py); here the
// wrapper is built once, with the library, from placeholder DT_NEEDED names
// (build.py), and embedded in it: init copies the template, writes the three paths over
// the placeholders of its string table, and writes it next to the model.
#include <dirent.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <climits>
#include <cstdlib>
#include <cstring>

#include "stock_backend.h"
#include "wrapper_template.inc"  // etm_wrapper_template, ETM_PLACEHOLDER_* (build.py)

extern "C" int32_t aoti_torch_empty_strided(int64_t, const int64_t*, const int64_t*, int32_t,
                                            int32_t, int32_t, void**);
extern "C" int32_t aoti_torch_delete_tensor_object(void*);

namespace etm_stock {

std::string libtorch_path;

const std::string& self_path() {
  static const std::string path = [] {
    Dl_info info;
    char real[PATH_MAX];
    if (!dladdr((void*)&make_private_dir, &info) || !info.dli_fname) return std::string();
    return std::string(realpath(info.dli_fname, real) ? real : info.dli_fname);
  }();
  return path;
}

bool make_private_dir(std::string* dir, std::string* error) {
  const char* tmp = std::getenv("TMPDIR");
  std::string root = tmp && *tmp ? tmp : "/tmp";
  std::string pattern = root + "/etmetal-stock-" + std::to_string(getpid()) + "-XXXXXX";
  std::vector<char> buf(pattern.begin(), pattern.end());
  buf.push_back('\0');
  if (!mkdtemp(buf.data())) {  // mode 0700
    *error = "cannot create a private directory under " + root + ": " + std::strerror(errno);
    return false;
  }
  *dir = buf.data();
  return true;
}

bool write_private_file(const std::string& dir, const char* name, const void* data, size_t n,
                        std::string* path, std::string* error) {
  *path = dir + "/" + name;
  int fd = open(path->c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0500);
  if (fd < 0) {
    *error = "cannot create " + *path + ": " + std::strerror(errno);
    return false;
  }
  const char* p = (const char*)data;
  size_t left = n;
  while (left) {
    ssize_t w = write(fd, p, left);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      *error = "writing " + *path + " failed: " + std::strerror(errno);
      close(fd);
      unlink(path->c_str());
      return false;
    }
    p += w;
    left -= (size_t)w;
  }
  if (close(fd) != 0) {
    *error = "writing " + *path + " failed: " + std::strerror(errno);
    unlink(path->c_str());
    return false;
  }
  return true;
}

void remove_private_dir(const std::string& dir) {
  if (dir.empty()) return;
  if (DIR* d = opendir(dir.c_str())) {  // only files: this library never makes subfolders
    while (struct dirent* e = readdir(d)) {
      if (!std::strcmp(e->d_name, ".") || !std::strcmp(e->d_name, "..")) continue;
      unlinkat(dirfd(d), e->d_name, 0);
    }
    closedir(d);
  }
  rmdir(dir.c_str());
}

namespace {

// the one offset of placeholder in the template, or npos
size_t find_once(const std::string& image, const char* placeholder) {
  size_t at = image.find(placeholder);
  if (at == std::string::npos || image.find(placeholder, at + 1) != std::string::npos)
    return std::string::npos;
  return at;
}

bool patch(std::string* image, const char* placeholder, const std::string& path,
           std::string* error) {
  size_t room = std::strlen(placeholder);
  size_t at = find_once(*image, placeholder);
  if (at == std::string::npos) {
    *error = "the link-wrapper template has no single placeholder " + std::string(placeholder, 40);
    return false;
  }
  if (path.empty() || path[0] != '/' || path.size() >= room) {
    *error = "the path '" + path + "' must be absolute and shorter than " +
             std::to_string(room) + " bytes to be linked";
    return false;
  }
  image->replace(at, room, std::string(room, '\0'));
  image->replace(at, path.size(), path);
  return true;
}

}  // namespace

void* load_model(const std::string& dir, const std::string& model_path, std::string* error) {
  // a library in the global scope that defines the shims would win over this one
  for (void* ours : {(void*)&aoti_torch_empty_strided, (void*)&aoti_torch_delete_tensor_object}) {
    Dl_info info;
    const char* name = dladdr(ours, &info) && info.dli_sname ? info.dli_sname : "aoti_torch_*";
    void* global = dlsym(RTLD_DEFAULT, name);
    if (global && global != ours) {
      Dl_info other;
      const char* where = dladdr(global, &other) && other.dli_fname ? other.dli_fname : "?";
      *error = std::string("the process-wide scope already defines ") + name + " (" + where +
               ", loaded RTLD_GLOBAL): the .so would bind to it, not to etmetal";
      return nullptr;
    }
  }
  if (libtorch_path.empty() || self_path().empty()) {
    *error = "the library is not configured (etm_stock_configure names libtorch_cpu)";
    return nullptr;
  }
  std::string image((const char*)etm_wrapper_template, etm_wrapper_template_len);
  if (!patch(&image, ETM_PLACEHOLDER_BRIDGE, self_path(), error) ||
      !patch(&image, ETM_PLACEHOLDER_VECMATH, libtorch_path, error) ||
      !patch(&image, ETM_PLACEHOLDER_MODEL, model_path, error))
    return nullptr;
  std::string wrapper;
  if (!write_private_file(dir, "libetmetal_link.so", image.data(), image.size(), &wrapper, error))
    return nullptr;
  void* handle = dlopen(wrapper.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle) {
    const char* why = dlerror();
    *error = "loading the .so failed: " + std::string(why ? why : "dlopen failed");
  }
  return handle;
}

}  // namespace etm_stock
