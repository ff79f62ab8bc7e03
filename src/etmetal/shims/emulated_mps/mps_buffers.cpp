// The emulated Metal device's raw buffers served in C: aoti_torch_mps_malloc / free and the
// copies between them (mps_device.py is the reference). Compiled as part of the generated
// bridge source, inside its extern "C" block, after mps_encoder.cpp (etm_mps_native).
//
// A native table of the live buffers and their extents answers the copies' range checks.
// C serves what it can prove: a copy whose destination and source both lie in buffers of
// this table. Anything else goes on to Python's shim, which asks this table too
// (etm_mps_buffer_holds) beside the memory only it knows (the loading model's weights blob,
// lent regions, live tensors), and reports every error by name.

static std::map<uintptr_t, uint64_t>& etm_mps_buffers() {
  static auto* table = new std::map<uintptr_t, uint64_t>();  // never destroyed: models'
  return *table;  // static destructors may still free their buffers
}

ETM_EXPORT int64_t etm_mps_buffer_count = 0, etm_mps_buffer_bytes = 0;

// 1 if [p, p + n) lies inside one live buffer of the table
ETM_EXPORT int32_t etm_mps_buffer_holds(uint64_t p, uint64_t n) {
  auto& bufs = etm_mps_buffers();
  auto it = bufs.upper_bound((uintptr_t)p);  // live buffers never overlap: the one starting
  if (it == bufs.begin()) return 0;          // last at or before p is the only candidate
  --it;
  uint64_t end;
  if (__builtin_add_overflow(p, n, &end)) return 0;
  return end <= it->first + it->second;
}

static const uint64_t etm_mps_max_bytes = 1ULL << 48;  // mps_device._check_size

// memory a copy may read besides the buffers: the weights blob of the container loading
// its constants, set by a host that has no Python to ask (the stock runtime's backend) for
// the length of that load; [0, 0) otherwise
ETM_EXPORT uint64_t etm_mps_lent_start = 0, etm_mps_lent_bytes = 0;

static int etm_mps_lent_holds(uint64_t p, uint64_t n) {
  uint64_t end;
  return etm_mps_lent_bytes && p >= etm_mps_lent_start && !__builtin_add_overflow(p, n, &end) &&
         end <= etm_mps_lent_start + etm_mps_lent_bytes;
}

// served: 1 (with *rc); 0: Python's shim decides
static int etm_mps_malloc(void** buffer, size_t n, int32_t* rc) {
  if (!etm_mps_native || !etm_native_fallbacks || !buffer || n > etm_mps_max_bytes) return 0;
  if (n == 0) {  // as upstream: no buffer, a NULL contents pointer
    *buffer = nullptr;
    *rc = 0;
    return 1;
  }
  void* p = std::aligned_alloc(64, (n + 63) & ~(size_t)63);  // MpsAllocator's alignment
  if (!p) return 0;  // Python reports the failed allocation
  etm_mps_buffers()[(uintptr_t)p] = n;
  etm_mps_buffer_count += 1;
  etm_mps_buffer_bytes += (int64_t)n;
  *buffer = p;
  *rc = 0;
  return 1;
}

static int etm_mps_free(void* ptr, int32_t* rc) {
  auto& bufs = etm_mps_buffers();
  auto it = bufs.find((uintptr_t)ptr);
  if (!ptr || it == bufs.end()) return 0;  // NULL, Python's buffers and errors: Python's
  etm_mps_buffer_count -= 1;
  etm_mps_buffer_bytes -= (int64_t)it->second;
  bufs.erase(it);
  std::free(ptr);
  *rc = 0;
  return 1;
}

// copy n bytes from src + src_off to dst + dst_off when every byte lies in the table
static int etm_mps_copy(void* dst, size_t dst_off, const void* src, size_t src_off, size_t n,
                        int32_t* rc) {
  if (!etm_mps_native || !etm_native_fallbacks || !dst || !src || n == 0) return 0;
  if (dst_off > etm_mps_max_bytes || src_off > etm_mps_max_bytes || n > etm_mps_max_bytes)
    return 0;
  uint64_t d = (uint64_t)(uintptr_t)dst + dst_off, s = (uint64_t)(uintptr_t)src + src_off;
  if (!etm_mps_buffer_holds(d, n) || !(etm_mps_buffer_holds(s, n) || etm_mps_lent_holds(s, n)))
    return 0;
  std::memmove((void*)(uintptr_t)d, (const void*)(uintptr_t)s, n);
  *rc = 0;
  return 1;
}
