// The emulated Metal device's load-time shims in C, for the stock runtime (stock_mps.h).
//
// In etmetal's Python runtime, aoti_torch_mps_create_shader_library compiles the MSL
// through Python (msl_compiler.py) and get_kernel_function hands each kernel to the
// bridge's launch path (native_launch.register). Here there is no Python: a library comes
// from the stock shader index (stock_msl.py), a record per source that Python's compiler
// wrote and MAC'd with the cache root's secret. A record is used only if the root is
// private, its MAC verifies and the library file's sha256 is the one it names; on a miss
// the configured Python compiles the source in a subprocess (which publishes the record),
// and without one the creation fails by name. Nothing unverified is ever mapped.
#include "stock_mps.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <climits>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <set>
#include <sstream>
#include <vector>

#include "stock_backend.h"
#include "stock_tensors.h"

extern char** environ;

extern "C" {
// the bridge's launch path (mps_encoder.cpp), compiled into this library
extern int64_t etm_mps_native;
extern uint64_t etm_mps_launch_limit;
extern uint32_t etm_mps_workers;
extern void (*etm_mps_fail)(const char*, const char*);
int32_t etm_mps_fn_add(void* handle, void* entry, void* loop, void* run, const char* name,
                       int32_t n, const int32_t* indices, const int32_t* kinds,
                       const int32_t* bytes, uint64_t limit);
void etm_mps_fn_remove(void* handle);
}

namespace etm_stock {
namespace {

const char* kFormat = "etmetal-msl-stock/1";
const size_t kMaxSource = size_t(64) << 20;  // mps_kernels.MAX_SOURCE_BYTES
const size_t kMaxRecord = size_t(1) << 20;
const int kKeyBytes = 32;  // common/cache.py _KEY_BYTES
// msl.py ARG_KINDS -> mps_encoder.cpp's ETM_ARG_* (unknown kinds read bytes)
const int kThreadgroup = 5, kBytes = 4;

char sticky[2048] = {0};
std::string cache_root, toolchain, python;
int64_t compiles = 0;

struct Kernel {
  std::string name;
  int index = 0;
  uint64_t limit = 1024;
  bool loop = false;
  std::vector<int32_t> buffers;
  std::set<int32_t> threadgroup;
};
struct Loaded {  // one library file, mapped once per process (it cannot be unmapped safely)
  void* dl = nullptr;
  void* launch = nullptr;
  std::vector<Kernel> kernels;
};
struct Library;
struct Function {
  Library* library;
  std::string name;
};
struct Library {  // one create_shader_library call
  Loaded* loaded;
  std::map<std::string, Function*> functions;
};
// never destroyed: the models' static destructors delete their libraries at exit
std::map<std::string, Loaded*>& loaded_files() {
  static auto* table = new std::map<std::string, Loaded*>();
  return *table;
}
std::set<Library*>& libraries() {
  static auto* table = new std::set<Library*>();
  return *table;
}

int32_t failed(const char* shim, const std::string& message) {
  etm_stock_mps_fail(shim, message.c_str());
  return 1;
}

bool insecure_allowed() {
  const char* v = std::getenv("ETMETAL_CACHE_ALLOW_INSECURE");
  return v && *v && std::strcmp(v, "0") != 0;
}

bool read_file(const std::string& path, size_t limit, std::string* out, std::string* error) {
  int fd = open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return *error = "cannot open " + path + ": " + std::strerror(errno), false;
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || (size_t)st.st_size > limit) {
    close(fd);
    return *error = path + " is not a regular file of at most " + std::to_string(limit) +
                    " bytes", false;
  }
  out->resize((size_t)st.st_size);
  size_t got = 0;
  while (got < out->size()) {
    ssize_t n = read(fd, &(*out)[got], out->size() - got);
    if (n <= 0) break;
    got += (size_t)n;
  }
  close(fd);
  if (got != out->size()) return *error = "short read of " + path, false;
  return true;
}

// the cache root's MAC secret, after the checks common/cache.py makes
bool root_key(std::string* key, std::string* error) {
  struct stat st;
  if (stat(cache_root.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
    return *error = "the etmetal cache root " + cache_root + " is not a directory", false;
  if (!insecure_allowed() && (st.st_uid != getuid() || (st.st_mode & (S_IWGRP | S_IWOTH))))
    return *error = "the etmetal cache root " + cache_root + " is not private to this user " +
                    "(anyone who can write there could plant code)", false;
  std::string path = cache_root + "/.key";
  int fd = open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return *error = "the cache has no key file " + path, false;
  char buf[kKeyBytes + 1];
  ssize_t n = read(fd, buf, sizeof(buf));
  bool own = fstat(fd, &st) == 0 && (insecure_allowed() || (st.st_uid == getuid() &&
                                                            !(st.st_mode & 077)));
  close(fd);
  if (!own || n != kKeyBytes)
    return *error = "the cache key file " + path + " is not a private 32-byte key", false;
  key->assign(buf, kKeyBytes);
  return true;
}

std::string hex(const unsigned char* p, size_t n) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (size_t i = 0; i < n; i++) {
    out += digits[p[i] >> 4];
    out += digits[p[i] & 15];
  }
  return out;
}

bool ints(const std::string& text, std::vector<int32_t>* out) {
  if (text == "-") return true;
  std::stringstream ss(text);
  std::string part;
  while (std::getline(ss, part, ',')) {
    if (part.empty() || part.size() > 2 || part.find_first_not_of("0123456789") != std::string::npos)
      return false;
    int v = std::atoi(part.c_str());
    if (v > 30) return false;  // Metal's buffer argument table has 31 entries
    out->push_back(v);
  }
  return true;
}

bool identifier(const std::string& s) {
  if (s.empty() || s.size() > 255) return false;
  for (char c : s)
    if (!(std::isalnum((unsigned char)c) || c == '_')) return false;
  return true;
}

// the record at path, verified; false with *error. *missing: there is no record
bool parse_record(const std::string& path, const std::string& key, std::string* library,
                  std::string* digest, std::vector<Kernel>* kernels, bool* missing,
                  std::string* error) {
  std::string text;
  *missing = access(path.c_str(), F_OK) != 0;
  if (*missing) return false;
  if (!read_file(path, kMaxRecord, &text, error)) return false;
  size_t mac_at = text.rfind("mac ");
  if (mac_at == std::string::npos || (mac_at && text[mac_at - 1] != '\n'))
    return *error = "the shader record " + path + " has no MAC", false;
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int mac_len = 0;
  if (!HMAC(EVP_sha256(), key.data(), (int)key.size(), (const unsigned char*)text.data(), mac_at,
            mac, &mac_len))
    return *error = "HMAC failed", false;
  std::string want = hex(mac, mac_len), have = text.substr(mac_at + 4);
  while (!have.empty() && have.back() == '\n') have.pop_back();
  if (have.size() != want.size() || CRYPTO_memcmp(have.data(), want.data(), want.size()) != 0)
    return *error = "the shader record " + path + " was not written by this user's etmetal " +
                    "(its MAC does not verify)", false;
  std::stringstream lines(text.substr(0, mac_at));
  std::string line;
  if (!std::getline(lines, line) || line != kFormat)
    return *error = "the shader record " + path + " is not " + kFormat, false;
  while (std::getline(lines, line)) {
    std::stringstream ss(line);
    std::string word;
    ss >> word;
    if (word == "toolchain") {
      std::string t;
      ss >> t;
      if (t != toolchain) return *missing = true, false;  // built by another compiler
    } else if (word == "library") {
      std::getline(ss >> std::ws, *library);
    } else if (word == "sha256") {
      ss >> *digest;
    } else if (word == "kernel") {
      Kernel k;
      std::string loop, buffers, tg;
      ss >> k.index >> k.limit >> loop >> buffers >> tg >> k.name;
      std::vector<int32_t> tgs;
      if (ss.fail() || !identifier(k.name) || k.index < 0 || k.limit < 1 || k.limit > 1024 ||
          (loop != "0" && loop != "1") || !ints(buffers, &k.buffers) || !ints(tg, &tgs))
        return *error = "the shader record " + path + " has a malformed kernel line", false;
      k.loop = loop == "1";
      k.threadgroup.insert(tgs.begin(), tgs.end());
      kernels->push_back(k);
    } else {
      return *error = "the shader record " + path + " has an unknown line", false;
    }
  }
  std::string inside = cache_root + "/msl/";
  if (library->compare(0, inside.size(), inside) != 0 || library->find("/../") != std::string::npos)
    return *error = "the shader record " + path + " names a library outside the cache", false;
  return true;
}

// the verified, mapped library of the record `name` (the stock key); nullptr with *missing
// when there is no usable record, or with *error
Loaded* load_record(const std::string& name, bool* missing, std::string* error) {
  auto it = loaded_files().find(name);
  if (it != loaded_files().end()) return it->second;
  std::string key, library, digest, bytes;
  if (!root_key(&key, error)) return nullptr;
  std::vector<Kernel> kernels;
  std::string path = cache_root + "/msl/stock/" + name + ".txt";
  if (!parse_record(path, key, &library, &digest, &kernels, missing, error)) return nullptr;
  if (!read_file(library, size_t(1) << 31, &bytes, error)) return nullptr;
  std::string actual = sha256_hex(bytes.data(), bytes.size());
  if (actual != digest) {
    *error = "the compiled shader library " + library + " does not match its record (sha256 " +
             actual + ", recorded " + digest + "); refusing to load it";
    return nullptr;
  }
  void* dl = dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!dl) {
    const char* why = dlerror();
    *error = "loading the shader library " + library + ": " + (why ? why : "dlopen failed");
    return nullptr;
  }
  auto* l = new Loaded();
  l->dl = dl;
  l->launch = dlsym(dl, "etm_msl_launch");  // the dispatcher the library links by path
  l->kernels = std::move(kernels);
  if (!l->launch) {
    delete l;
    *error = "the shader library " + library + " links no MSL dispatcher (etm_msl_launch)";
    return nullptr;
  }
  loaded_files()[name] = l;
  return l;
}

// compile `source` with the configured Python (stock_msl.py publishes the record)
bool compile(const char* source, size_t n, const std::string& record, std::string* error) {
  if (python.empty())
    return *error = "the shader library (record " + record +
                    ") is not in etmetal's compiled-shader cache and no compiler is configured"
                    " (call etmetal.stock_runtime.register() in a "
                    "process with etmetal, or set ETMETAL_MSL_PYTHON for etmetal_runner; or "
                    "run the program once with etmetal's runtime to fill the cache)", false;
  std::string dir, src, log = "";
  if (!make_private_dir(&dir, error) ||
      !write_private_file(dir, "library.metal", source, n, &src, error))
    return remove_private_dir(dir), false;
  log = dir + "/compile.log";
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&actions, 2, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  posix_spawn_file_actions_adddup2(&actions, 2, 1);
  std::string mod = "etmetal.shims.emulated_mps.stock_msl_compile";
  std::vector<char*> argv = {const_cast<char*>(python.c_str()), const_cast<char*>("-m"),
                             const_cast<char*>(mod.c_str()), const_cast<char*>(src.c_str()),
                             nullptr};
  pid_t pid = 0;
  int rc = posix_spawn(&pid, python.c_str(), &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) {
    *error = "running the shader compiler " + python + " failed: " + std::strerror(rc);
    remove_private_dir(dir);
    return false;
  }
  compiles++;
  const char* limit_env = std::getenv("ETMETAL_MSL_COMPILE_TIMEOUT");
  double limit = limit_env && *limit_env ? std::atof(limit_env) : 900.0;
  int status = 0;
  struct timespec start, now, pause = {0, 5000000};
  clock_gettime(CLOCK_MONOTONIC, &start);
  for (;;) {
    pid_t done = waitpid(pid, &status, WNOHANG);
    if (done == pid) break;
    if (done < 0 && errno != EINTR) return *error = "waiting for the shader compiler failed", false;
    clock_gettime(CLOCK_MONOTONIC, &now);
    if ((double)(now.tv_sec - start.tv_sec) + 1e-9 * (double)(now.tv_nsec - start.tv_nsec) > limit) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      remove_private_dir(dir);
      return *error = "the shader compiler did not finish within " + std::to_string((int)limit) +
                      " s (ETMETAL_MSL_COMPILE_TIMEOUT)", false;
    }
    nanosleep(&pause, nullptr);
  }
  std::string out, ignored;
  read_file(log, size_t(1) << 20, &out, &ignored);
  remove_private_dir(dir);
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return true;
  while (!out.empty() && (out.back() == '\n' || out.back() == ' ')) out.pop_back();
  size_t cut = out.rfind('\n', out.size() > 1500 ? out.size() - 1500 : 0);
  *error = "the shader compiler (" + python + " -m " + mod + ") failed" +
           (WIFEXITED(status) ? " with exit code " + std::to_string(WEXITSTATUS(status))
                              : std::string(" (killed by a signal)")) +
           ": " + (out.size() > 1500 && cut != std::string::npos ? out.substr(cut + 1) : out);
  return false;
}

std::string stock_key(const char* source, size_t n) {
  std::string text = toolchain + "\n";
  text.append(source, n);
  return sha256_hex(text.data(), text.size());
}

}  // namespace

std::string take_mps_error() {
  std::string out = sticky;
  sticky[0] = '\0';
  return out;
}

void configure_mps_device() {
  etm_mps_fail = etm_stock_mps_fail;
  etm_mps_native = 1;
  const char* raw = std::getenv("ETMETAL_MPS_MAX_THREADS");  // limits.py reads the same
  char* end = nullptr;
  unsigned long long v = raw && *raw ? std::strtoull(raw, &end, 0) : 0;
  etm_mps_launch_limit = v && end && !*end ? v : (1ULL << 28);
}

}  // namespace etm_stock

extern "C" {

void etm_stock_mps_fail(const char* shim, const char* message) {
  if (etm_stock::sticky[0]) return;  // later failures of a run are its consequences
  std::snprintf(etm_stock::sticky, sizeof(etm_stock::sticky), "%s: %s", shim ? shim : "?",
                message ? message : "");
}

int32_t etm_stock_mps_create_library(const char* source, void** library) {
  const char* shim = "aoti_torch_mps_create_shader_library";
  if (!library) return etm_stock::failed(shim, "output pointer library_handle is NULL");
  if (!source) return etm_stock::failed(shim, "metal_shader_source is NULL");
  size_t n = strnlen(source, etm_stock::kMaxSource + 1);
  if (n > etm_stock::kMaxSource)
    return etm_stock::failed(shim, "metal_shader_source is more than the 64 MiB allowed");
  if (etm_stock::cache_root.empty() || etm_stock::toolchain.empty())
    return etm_stock::failed(shim, "the emulated Metal device is not configured (no shader "
                                   "cache: etm_stock_configure_msl was not called)");
  std::string name = etm_stock::stock_key(source, n), error;
  bool missing = false;
  etm_stock::Loaded* l = etm_stock::load_record(name, &missing, &error);
  // a record that does not verify is a miss too when a compiler can replace it (as the
  // content cache rebuilds a bad entry); the library it names is never mapped
  std::string refused = missing ? std::string() : error;
  if (!l && (missing || !etm_stock::python.empty()) && etm_stock::compile(source, n, name, &error)) {
    l = etm_stock::load_record(name, &missing, &error);
    if (!l && missing) error = "the shader compiler ran but published no record for the library";
  } else if (!l && !refused.empty()) {
    error = refused;
  }
  if (!l) return etm_stock::failed(shim, "the shader library could not be loaded: " + error);
  auto* lib = new etm_stock::Library{l, {}};
  etm_stock::libraries().insert(lib);
  *library = lib;
  return 0;
}

int32_t etm_stock_mps_delete_library(void* library) {
  const char* shim = "aoti_torch_mps_delete_shader_library";
  auto* lib = static_cast<etm_stock::Library*>(library);
  if (!lib) return etm_stock::failed(shim, "library_handle is NULL");
  if (!etm_stock::libraries().erase(lib))
    return etm_stock::failed(shim, "library handle " + etm_stock::handle_hex(library) +
                                       " is not a live shader library");
  for (auto& kv : lib->functions) {
    etm_mps_fn_remove(kv.second);
    delete kv.second;
  }
  delete lib;
  return 0;
}

int32_t etm_stock_mps_kernel_function(void* library, const char* name, void** function) {
  const char* shim = "aoti_torch_mps_get_kernel_function";
  auto* lib = static_cast<etm_stock::Library*>(library);
  if (!function) return etm_stock::failed(shim, "output pointer function_handle is NULL");
  if (!lib) return etm_stock::failed(shim, "library_handle is NULL");
  if (!etm_stock::libraries().count(lib))
    return etm_stock::failed(shim, "library handle " + etm_stock::handle_hex(library) +
                                       " is not a live shader library");
  if (!name) return etm_stock::failed(shim, "kernel_name is NULL");
  std::string wanted(name, strnlen(name, 4097));
  auto known = lib->functions.find(wanted);
  if (known != lib->functions.end()) return *function = known->second, 0;
  const etm_stock::Kernel* k = nullptr;
  std::string names;
  for (const auto& kernel : lib->loaded->kernels) {
    names += (names.empty() ? "" : ", ") + kernel.name;
    if (kernel.name == wanted) k = &kernel;
  }
  if (!k)
    return etm_stock::failed(shim, "kernel '" + wanted + "' is not in the shader library (its "
                                   "kernels: " + (names.empty() ? "none" : names) + ")");
  std::string i = std::to_string(k->index);
  void* entry = dlsym(lib->loaded->dl, ("etm_msl_entry_" + i).c_str());
  void* loop = k->loop ? dlsym(lib->loaded->dl, ("etm_msl_loop_" + i).c_str()) : nullptr;
  auto* descs = (const uint64_t*)dlsym(lib->loaded->dl, ("etm_msl_args_" + i).c_str());
  if (!entry || (k->loop && !loop) || (!k->buffers.empty() && !descs))
    return etm_stock::failed(shim, "the shader library has no entry for kernel '" + wanted + "'");
  std::vector<int32_t> kinds, bytes;
  for (size_t j = 0; j < k->buffers.size(); j++) {
    uint64_t d = descs[j];
    int32_t kind = (int32_t)(d >> 32);
    if (k->threadgroup.count(k->buffers[j])) kind = etm_stock::kThreadgroup;
    else if (kind < 1 || kind > 4) kind = etm_stock::kBytes;
    kinds.push_back(kind);
    bytes.push_back((int32_t)(d & 0xFFFFFFFFu));
  }
  auto* fn = new etm_stock::Function{lib, wanted};
  if (etm_mps_fn_add(fn, entry, loop, lib->loaded->launch, wanted.c_str(), (int32_t)kinds.size(),
                     k->buffers.data(), kinds.data(), bytes.data(), k->limit) != 0) {
    delete fn;
    return etm_stock::failed(shim, "kernel '" + wanted + "' takes buffer indices the launch path "
                                   "cannot hold");
  }
  lib->functions[wanted] = fn;
  *function = fn;
  return 0;
}

ETM_EXPORT int32_t etm_stock_configure_msl(const char* root, const char* chain, const char* py,
                                           uint32_t workers) {
  char real[PATH_MAX];
  if (!root || !*root || !realpath(root, real) || !chain || std::strlen(chain) != 32) {
    etm_stock::set_error(std::string("etm_stock_configure_msl: the cache root '") +
                         (root ? root : "(null)") + "' does not exist or the toolchain digest " +
                         "is not 32 hex digits");
    return 1;
  }
  etm_stock::cache_root = real;
  etm_stock::toolchain = chain;
  etm_stock::python = py ? py : "";
  etm_mps_workers = workers ? workers : 1;
  etm_stock::configure_mps_device();
  return 0;
}

ETM_EXPORT int64_t etm_stock_mps_libraries(void) {
  return (int64_t)etm_stock::loaded_files().size();
}
ETM_EXPORT int64_t etm_stock_mps_compiles(void) { return etm_stock::compiles; }

}  // extern "C"
