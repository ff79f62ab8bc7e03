// The emulated Metal device's launch path served in C: kernel functions, encoders, argument
// binding and dispatch straight into the MSL executor (etm_msl_launch). Compiled as part
// of the generated bridge source, inside its extern "C" block (after bridge_source.cpp).
//
// Python (mps_kernels.py) stays the reference and does the load-time work: it compiles the
// library, and when a function is fetched it registers it here (etm_mps_fn_add) with the
// argument set its signature takes, checked once into a bit mask, so a dispatch compares
// one word. A handle this table does not know (or any call while etm_mps_native is 0:
// the Python shims, check mode) goes on to Python. The messages are the Python shims'
// own, word for word, and go to Python's error record through etm_mps_fail (an error is
// not the steady state).

// etm_msl_launch (msl_abi.h): entry, loop entry (NULL: fibers), args, grid, group, workers
typedef int (*etm_msl_launch_fn)(void*, void*, void* const*, const uint64_t*, const uint64_t*,
                                 uint32_t, char*, uint64_t);
typedef void (*etm_mps_fail_fn)(const char*, const char*);
typedef int64_t (*etm_mps_room_fn)(void*);

ETM_EXPORT int64_t etm_mps_native = 0;  // 1: the calls below are served here (Python sets it)
ETM_EXPORT etm_mps_fail_fn etm_mps_fail = nullptr;  // Python: record the error, sticky too
ETM_EXPORT etm_mps_room_fn etm_mps_room = nullptr;  // Python: bytes from a tensor's data on
ETM_EXPORT uint64_t etm_mps_launch_limit = 1ULL << 28;  // limits.launch_limit
ETM_EXPORT uint64_t etm_mps_dispatches = 0;             // dispatches run from C
// threadgroups spread over this many OS threads (Python's sync: torch.get_num_threads())
ETM_EXPORT uint32_t etm_mps_workers = 1;

enum { ETM_ARG_UNKNOWN = 0, ETM_ARG_BUFFER, ETM_ARG_INT, ETM_ARG_FLOAT, ETM_ARG_BYTES,
       ETM_ARG_THREADGROUP };
#define ETM_MPS_SLOTS 31  // Metal's buffer argument table

struct etm_mps_fn {
  void* entry;
  void* loop;  // the kernel's loop entry (it never synchronises), or NULL
  etm_msl_launch_fn run;
  char name[260];
  uint32_t expected;  // the buffer indices the kernel takes
  uint32_t bound;     // the indices this encoder has set
  uint64_t limit;     // the pipeline's maxTotalThreadsPerThreadgroup
  int32_t nslots;     // 1 + the highest index the kernel takes
  bool encoding;
  int8_t kind[ETM_MPS_SLOTS];
  int32_t kind_bytes[ETM_MPS_SLOTS];
  void* args[ETM_MPS_SLOTS];
  void* tensor[ETM_MPS_SLOTS];  // the handle set_arg_tensor bound (NULL: an int)
  int64_t tensor_data[ETM_MPS_SLOTS];
  int64_t ints[ETM_MPS_SLOTS];  // set_arg_int's slots: `constant long& n` reads them
};

static std::unordered_map<uintptr_t, etm_mps_fn*>& etm_mps_fns() {
  static auto* table = new std::unordered_map<uintptr_t, etm_mps_fn*>();  // never destroyed:
  return *table;  // static destructors of models may still launch
}

// register function `handle` (Python, at get_kernel_function); kinds[i] | bytes[i] per
// index of `indices`. 0 on success.
ETM_EXPORT int32_t etm_mps_fn_add(void* handle, void* entry, void* loop, void* run,
                                  const char* name, int32_t n, const int32_t* indices,
                                  const int32_t* kinds, const int32_t* bytes, uint64_t limit) {
  if (!handle || !entry || !run || !name || n < 0 || n > ETM_MPS_SLOTS) return 1;
  auto* f = new etm_mps_fn();
  f->entry = entry;
  f->loop = loop;
  f->run = (etm_msl_launch_fn)run;
  std::snprintf(f->name, sizeof(f->name), "%s", name);
  f->limit = limit;
  for (int32_t i = 0; i < n; ++i) {
    if (indices[i] < 0 || indices[i] >= ETM_MPS_SLOTS) {
      delete f;
      return 1;
    }
    f->expected |= 1u << indices[i];
    f->kind[indices[i]] = (int8_t)kinds[i];
    f->kind_bytes[indices[i]] = bytes[i];
    if (indices[i] + 1 > f->nslots) f->nslots = indices[i] + 1;
  }
  auto& fns = etm_mps_fns();
  auto old = fns.find((uintptr_t)handle);
  if (old != fns.end()) delete old->second;
  fns[(uintptr_t)handle] = f;
  return 0;
}

// forget function `handle` (its library was deleted)
ETM_EXPORT void etm_mps_fn_remove(void* handle) {
  auto& fns = etm_mps_fns();
  auto it = fns.find((uintptr_t)handle);
  if (it == fns.end()) return;
  delete it->second;
  fns.erase(it);
}

ETM_EXPORT int64_t etm_mps_fn_count(void) { return (int64_t)etm_mps_fns().size(); }

// etm_native_fallbacks (native_fallbacks.h): 0 while Python's shims serve the context
static etm_mps_fn* etm_mps_fn_of(void* handle) {
  if (!etm_mps_native || !etm_native_fallbacks || !handle) return nullptr;
  auto& fns = etm_mps_fns();
  auto it = fns.find((uintptr_t)handle);
  return it == fns.end() ? nullptr : it->second;
}

__attribute__((format(printf, 2, 3))) static int32_t etm_mps_error(const char* shim,
                                                                    const char* fmt, ...) {
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  if (etm_mps_fail) etm_mps_fail(shim, msg);
  return 1;
}

static int32_t etm_mps_encoding(etm_mps_fn* f, const char* shim, const char* call) {
  if (f->encoding) return 0;
  return etm_mps_error(shim,
                       "kernel '%s': %s without aoti_torch_mps_start_encoding (no active encoder)",
                       f->name, call);
}

static int32_t etm_mps_start_encoding(etm_mps_fn* f) {
  f->encoding = true;
  f->bound = 0;
  for (auto& t : f->tensor) t = nullptr;
  return 0;
}

static int32_t etm_mps_index(etm_mps_fn* f, const char* shim, uint32_t idx) {
  if (idx < ETM_MPS_SLOTS) return 0;
  etm_mps_error(shim, "kernel '%s': buffer index %u is outside Metal's [0, 30]", f->name, idx);
  return 1;  // spelled out: callers index f's slot arrays only after a 0 here
}

static const char* etm_mps_describe(const etm_mps_fn* f, uint32_t idx, char* out, size_t n) {
  static const char* names[] = {"bytes", "buffer", "int", "float", "bytes", "threadgroup"};
  int k = f->kind[idx];
  if (k == ETM_ARG_BUFFER) return "a buffer (a device/constant pointer)";
  if (k == ETM_ARG_THREADGROUP) return "threadgroup memory";
  std::snprintf(out, n, "a %d-byte %s %s", f->kind_bytes[idx], names[k],
                k == ETM_ARG_BYTES ? "value" : "scalar");
  return out;
}

static int32_t etm_mps_set_arg_tensor(etm_mps_fn* f, uint32_t idx, void* handle) {
  const char* shim = "aoti_torch_mps_set_arg_tensor";
  if (etm_mps_encoding(f, shim, "set_arg_tensor") || etm_mps_index(f, shim, idx)) return 1;
  if (!handle)
    return etm_mps_error(shim, "kernel '%s' buffer(%u) tensor handle is NULL", f->name, idx);
  etm_rec* r = etm_rec_of(handle);
  if (!r)
    return etm_mps_error(shim,
                         "kernel '%s' buffer(%u) tensor handle %#llx is not a live tensor "
                         "(deleted or never created)",
                         f->name, idx, (unsigned long long)(uintptr_t)handle);
  int k = f->kind[idx];
  if (k == ETM_ARG_THREADGROUP)
    return etm_mps_error(
        shim, "kernel '%s': [[buffer(%u)]] is threadgroup memory; no set_arg_* binds it",
        f->name, idx);
  if (k != ETM_ARG_UNKNOWN && k != ETM_ARG_BUFFER) {
    // a value read by reference from a tensor (rare: Inductor binds scalars by value)
    // a native record knows its room itself (asking Python would make Python adopt it)
    const etm_rec* nr = etm_rec_of(handle);
    bool known = nr && nr->native && nr->dtype >= 0 && nr->dtype < ETM_NDTYPES &&
                 etm_itemsize[nr->dtype];
    int64_t have = known ? nr->storage_bytes - nr->offset * etm_itemsize[nr->dtype]
                   : etm_mps_room ? etm_mps_room(handle)
                                  : -1;
    if (have < f->kind_bytes[idx]) {
      char d[96];
      return etm_mps_error(shim,
                           "kernel '%s': set_arg_tensor into [[buffer(%u)]], which reads %s, "
                           "with a tensor holding only %lld bytes",
                           f->name, idx, etm_mps_describe(f, idx, d, sizeof(d)),
                           (long long)(have > 0 ? have : 0));
    }
  }
  f->args[idx] = (void*)(intptr_t)r->data_ptr;  // with the storage offset, as setArg binds
  f->tensor[idx] = handle;
  f->tensor_data[idx] = r->data_ptr;
  f->bound |= 1u << idx;
  return 0;
}

static int32_t etm_mps_set_arg_int(etm_mps_fn* f, uint32_t idx, int64_t val) {
  const char* shim = "aoti_torch_mps_set_arg_int";
  if (etm_mps_encoding(f, shim, "set_arg_int") || etm_mps_index(f, shim, idx)) return 1;
  int k = f->kind[idx];
  bool known = (f->expected >> idx) & 1u;
  if (known && (k != ETM_ARG_INT || f->kind_bytes[idx] > 8)) {
    char d[96];
    return etm_mps_error(shim,
                         "kernel '%s': set_arg_int into [[buffer(%u)]], which takes %s: an "
                         "int64 fits only an integer parameter of up to 8 bytes",
                         f->name, idx, etm_mps_describe(f, idx, d, sizeof(d)));
  }
  f->ints[idx] = val;
  f->args[idx] = &f->ints[idx];
  f->tensor[idx] = nullptr;
  f->bound |= 1u << idx;
  return 0;
}

static void etm_mps_index_list(uint32_t mask, char* out, size_t n) {
  size_t used = (size_t)std::snprintf(out, n, "[");
  bool first = true;
  for (int i = 0; i < ETM_MPS_SLOTS && used < n; ++i) {
    if (!((mask >> i) & 1u)) continue;
    used += (size_t)std::snprintf(out + used, n - used, first ? "%d" : ", %d", i);
    first = false;
  }
  if (used < n) std::snprintf(out + used, n - used, "]");
}

static void etm_u128(unsigned __int128 v, char* out) {  // decimal, like Python's int
  char tmp[48];
  int n = 0;
  do {
    tmp[n++] = (char)('0' + (int)(v % 10));
    v /= 10;
  } while (v);
  for (int i = 0; i < n; ++i) out[i] = tmp[n - 1 - i];
  out[n] = 0;
}

static void etm_tuple(const uint64_t* v, int n, char* out, size_t size) {  // Python's repr
  if (n == 1) {
    std::snprintf(out, size, "(%llu,)", (unsigned long long)v[0]);
  } else if (n == 2) {
    std::snprintf(out, size, "(%llu, %llu)", (unsigned long long)v[0], (unsigned long long)v[1]);
  } else {
    std::snprintf(out, size, "(%llu, %llu, %llu)", (unsigned long long)v[0],
                  (unsigned long long)v[1], (unsigned long long)v[2]);
  }
}

// mps_kernels._dispatch: the same checks in the same order, then the executor
static int32_t etm_mps_launch(etm_mps_fn* f, const char* shim, int n, const uint64_t* threads,
                              const uint64_t* group_in) {
  uint64_t t[3] = {1, 1, 1}, g[3] = {1, 1, 1}, total = 1;
  for (int d = 0; d < n; ++d) {
    t[d] = threads[d];
    uint64_t gd = group_in[d] < threads[d] ? group_in[d] : threads[d];
    g[d] = gd ? gd : 1;
    total *= g[d];
  }
  uint64_t limit = f->limit;
  if (total > limit)
    return etm_mps_error(shim, "kernel '%s': threadgroup of %llu threads exceeds the pipeline's %llu",
                         f->name, (unsigned long long)total, (unsigned long long)limit);
  if (f->bound != f->expected) {
    char missing[128], extra[128];
    uint32_t miss = f->expected & ~f->bound, more = f->bound & ~f->expected;
    etm_mps_index_list(miss, missing, sizeof(missing));
    etm_mps_index_list(more, extra, sizeof(extra));
    if (miss && more)
      return etm_mps_error(shim,
                           "kernel '%s': missing buffer index(es) %s; extra argument index(es) "
                           "%s the kernel does not take",
                           f->name, missing, extra);
    if (miss) return etm_mps_error(shim, "kernel '%s': missing buffer index(es) %s", f->name, missing);
    return etm_mps_error(shim,
                         "kernel '%s': extra argument index(es) %s the kernel does not take",
                         f->name, extra);
  }
  for (int i = 0; i < ETM_MPS_SLOTS; ++i) {
    if (!f->tensor[i]) continue;
    etm_rec* r = etm_rec_of(f->tensor[i]);
    if (!r || r->data_ptr != f->tensor_data[i])  // its handle was deleted: memory may be gone
      return etm_mps_error(shim,
                           "kernel '%s': the tensor %#llx bound to [[buffer(%d)]] was deleted "
                           "before the dispatch (use after free)",
                           f->name, (unsigned long long)(uintptr_t)f->tensor[i], i);
  }
  unsigned __int128 all = 1;
  for (int d = 0; d < n; ++d) {
    if (t[d] > 0xFFFFFFFFULL)
      return etm_mps_error(shim, "kernel '%s': grid size %llu in dimension %d exceeds 2^32-1",
                           f->name, (unsigned long long)t[d], d);
    all *= t[d];
  }
  if (all > etm_mps_launch_limit) {
    char grid[80], count[48];
    etm_tuple(threads, n, grid, sizeof(grid));
    etm_u128(all, count);
    return etm_mps_error(shim,
                         "kernel '%s': a grid of %s is %s threads, more than the launch limit of "
                         "%llu (set ETMETAL_MPS_MAX_THREADS to raise it)",
                         f->name, grid, count, (unsigned long long)etm_mps_launch_limit);
  }
  f->encoding = false;  // upstream drops the encoder after a dispatch
  if (all == 0) return 0;  // an empty grid runs no thread
  for (int i = 0; i < f->nslots; ++i) {
    if (((f->expected >> i) & 1u) && !f->args[i])  // an empty tensor's NULL, as msl.py refuses
      return etm_mps_error(shim, "kernel '%s': kernel '%s': argument %d is not an address: 0",
                           f->name, f->name, i);
  }
  char err[600] = {0};
  if (f->run(f->entry, f->loop, f->args, t, g, etm_mps_workers, err, sizeof(err)) != 0)
    return etm_mps_error(shim, "kernel '%s': kernel '%s': %s", f->name, f->name, err);
  __atomic_fetch_add(&etm_mps_dispatches, 1, __ATOMIC_RELAXED);
  return 0;
}

// upstream's threadgroup when the wrapper gives none (mps_kernels._default_group)
static void etm_mps_default_group(const uint64_t* t, int n, uint64_t limit, uint64_t* g) {
  if (n == 1) {
    g[0] = t[0] < limit ? t[0] : limit;
  } else if (n == 2) {
    g[0] = t[0] < 32 ? t[0] : 32;
    g[1] = limit / (g[0] ? g[0] : 1);
  } else {
    g[0] = t[0] < 8 ? t[0] : 8;
    g[1] = t[1] < 8 ? t[1] : 8;
    uint64_t xy = g[0] * g[1];
    g[2] = limit / (xy ? xy : 1);
  }
}

static int32_t etm_mps_grid(const char* shim, const char* what, const void* p, size_t n,
                            uint64_t* out) {
  if (n < 1 || n > 3)
    return etm_mps_error(shim, "%s has %zu entries; a Metal grid has 1 to 3 dimensions", what, n);
  if (!p) return etm_mps_error(shim, "%s is NULL", what);
  for (size_t i = 0; i < n; ++i) out[i] = ((const uint64_t*)p)[i];
  return 0;
}

static int32_t etm_mps_dispatch_array(etm_mps_fn* f, const char* shim, const char* call,
                                      const void* length, size_t n, const void* group,
                                      size_t gn) {
  uint64_t t[3], g[3], given[3];
  if (etm_mps_encoding(f, shim, call) || etm_mps_grid(shim, "length", length, n, t)) return 1;
  if (group && gn) {
    if (etm_mps_grid(shim, "group_size", group, gn, given)) return 1;
    if (n == 1) {
      g[0] = given[0] < f->limit ? given[0] : f->limit;
    } else if (gn < n) {  // upstream then keeps its default
      etm_mps_default_group(t, (int)n, f->limit, g);
    } else {
      for (size_t d = 0; d < n; ++d) g[d] = given[d] < t[d] ? given[d] : t[d];
    }
  } else {
    etm_mps_default_group(t, (int)n, f->limit, g);
  }
  return etm_mps_launch(f, shim, (int)n, t, g);
}

static int32_t etm_mps_dispatch_single(etm_mps_fn* f, const char* shim, const char* call,
                                       uint64_t length, uint64_t group_size) {
  if (etm_mps_encoding(f, shim, call)) return 1;
  uint64_t g;
  if (group_size > 0) {
    g = group_size < f->limit ? group_size : f->limit;
  } else {
    etm_mps_default_group(&length, 1, f->limit, &g);
  }
  return etm_mps_launch(f, shim, 1, &length, &g);
}

// run_command_block of a known function: the emulated queue is synchronous, so the block's
// dispatches have run when this returns
static int32_t etm_mps_run_block(etm_mps_fn*, void* func, void* callback, void* user_data) {
  if (!callback) return etm_mps_error("aoti_torch_mps_run_command_block", "callback is NULL");
  ((etm_mps_block_callback)callback)((AOTIMetalKernelFunctionOpaque*)func, user_data);
  return 0;
}
