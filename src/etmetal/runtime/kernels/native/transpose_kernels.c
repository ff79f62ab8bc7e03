/* The vector transposes behind the native strided copy (see transpose_kernels.h).
 *
 * Micro-tiles are register transposes (shuffles only, so every bit, NaN payloads included,
 * is preserved): 8x8 of 4-byte and 4x4 of 8-byte elements with AVX2, chosen at run time
 * (__builtin_cpu_supports) so one build runs on any x86-64; 8x8 of 2-byte and 16x16 or 8x8
 * of 1-byte elements with the baseline SSE2. Tiles (128 bytes of each source row by a few
 * hundred destination columns) keep the source block in L1 or L2 while 8 or 16 destination
 * rows fill whole cache lines side by side; 8 when the destination rows' stride is near a
 * multiple of 4 KiB, where 16 rows would share L1 sets.
 *
 * Large copies with enough rows store non-temporally instead (transpose_stream.c): a cached
 * store first reads each destination line (read-for-ownership), a third of the traffic of a
 * copy that misses the cache anyway.
 */
#define _GNU_SOURCE /* sysconf(_SC_LEVEL3_CACHE_SIZE) */
#include "transpose_kernels.h"

#include <stdio.h>
#include <unistd.h>
#if defined(__x86_64__) && defined(__GNUC__)
#define ETM_X86 1
#include <immintrin.h>
#endif
/* ---- cache geometry ---- */

/* last-level cache bytes: sysfs first (what lscpu shows; under a hypervisor sysconf may
   report the host's cache, 12x larger on the CI VM), then sysconf; 0 if unknown */
static int64_t l3_bytes(void) {
  char path[64];
  for (int k = 0; k < 8; ++k) {
    snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/level", k);
    FILE* f = fopen(path, "r");
    if (!f) break;
    int level = 0;
    int ok = fscanf(f, "%d", &level) == 1;
    fclose(f);
    if (!ok || level != 3) continue;
    snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu0/cache/index%d/size", k);
    f = fopen(path, "r");
    if (!f) break;
    long long v = 0;
    char unit = 0;
    int got = fscanf(f, "%lld%c", &v, &unit);
    fclose(f);
    if (got >= 1 && v > 0) return (int64_t)v << (unit == 'M' ? 20 : unit == 'K' ? 10 : 0);
  }
#if defined(_SC_LEVEL3_CACHE_SIZE)
  long l3 = sysconf(_SC_LEVEL3_CACHE_SIZE);
  if (l3 > 0) return l3;
#endif
  return 0;
}

/* Streaming pays only where the rows span at least two source lines per column (bn * item
   >= 128 bytes: 32 float channels). Measured on a 2-core KVM guest (AMD EPYC, 32 MiB L3,
   other jobs running): a channels-last [1, C, H, W] -> contiguous view_copy against torch's
   contiguous copy of the same bytes, each arm with its own tensors, arms interleaved in one
   process in alternating order, medians of 16 (30 to re-check close calls), 8-64 MiB:
     rows >= 128 bytes (float32 C = 32..512, float64 C = 16..128, float16 C = 64, 128):
       streamed ahead in 18 of 26 (float32 C = 32: 0.91-1.51 of a contiguous copy against
       0.64-1.41 cached), within 5% in 6, behind in 2 (float64 C = 16: 7% and 9%; with
       30 rounds at 8, 16 and 32 MiB it came out 3-25% ahead)
     rows < 128 bytes: float32 C = 4, 8 behind in all 8 (0.22-0.60 against 0.74-1.21: the
       cached tiles then write few destination rows at once, which cached stores handle
       well); float32 C = 16, 24, float64 C = 8, float16 C = 16, 32: behind or even in 12
       of 14 */
#define STREAM_MIN_ROWS_BYTES 128

/* copies of at least this many bytes may store non-temporally: a quarter of the last-level
   cache, past which (source + destination, a shared cache) the output would not stay
   cached anyway. At 8 MiB here (float32, C = 32..512) streaming already gave 0.33-1.00 of
   a contiguous copy against 0.27-0.64 cached */
static int64_t stream_bytes = -1; /* -1: not measured yet */
int64_t etm_stream_threshold(void) {
  if (stream_bytes < 0) {
    int64_t l3 = l3_bytes();
    stream_bytes = (l3 > 0 ? l3 : ((int64_t)32 << 20)) / 4;
  }
  return stream_bytes;
}

#if defined(ETM_X86)
#include "transpose_micro.h"

/* ---- tiles ---- */

/* rows [0, bn) of d, bn a multiple of M; GROUP destination rows (a multiple of M) are
   filled side by side; BJ destination columns per tile */
#define DEFINE_TILES(NAME, T, M, GROUP, BJ, MICRO, STORE, ATTR)                           \
ATTR static void NAME(T* du, const T* su, int64_t bn, int64_t an, int64_t bd, int64_t as) { \
  const int64_t bi = 128 / sizeof(T); /* source columns per tile: 128 bytes of a row */    \
  for (int64_t i0 = 0; i0 < bn; i0 += bi) {                                              \
    int64_t i1 = i0 + bi < bn ? i0 + bi : bn;                                            \
    for (int64_t j0 = 0; j0 < an; j0 += BJ) {                                            \
      int64_t j1 = j0 + BJ < an ? j0 + BJ : an;                                          \
      int64_t i = i0;                                                                    \
      for (; i + GROUP <= i1; i += GROUP) {                                              \
        int64_t j = j0;                                                                  \
        for (; j + M <= j1; j += M)                                                      \
          for (int g = 0; g < GROUP; g += M)                                             \
            MICRO(du + (i + g) * bd + j, su + j * as + i + g, bd, as, STORE)             \
        for (; j < j1; ++j)                                                              \
          for (int k = 0; k < GROUP; ++k) du[(i + k) * bd + j] = su[j * as + i + k];     \
      }                                                                                  \
      for (; i < i1; i += M) {                                                           \
        int64_t j = j0;                                                                  \
        for (; j + M <= j1; j += M) MICRO(du + i * bd + j, su + j * as + i, bd, as, STORE) \
        for (; j < j1; ++j)                                                              \
          for (int k = 0; k < M; ++k) du[(i + k) * bd + j] = su[j * as + i + k];         \
      }                                                                                  \
    }                                                                                    \
  }                                                                                      \
}
/* 16 rows side by side use each 64-byte source line in one pass, but only when the rows
   spread over L1 sets (see set_crowding). Block sizes measured (etmetal bench overhead and a
   sweep over channel counts 3-512 and plane sizes) */
DEFINE_TILES(t_u32, uint32_t, 8, 8, 256, T8_PS, ST_PS, AVX2)
DEFINE_TILES(t_u32_x16, uint32_t, 8, 16, 1024, T8_PS, ST_PS, AVX2)
DEFINE_TILES(t_u32_x4, uint32_t, 4, 4, 256, T4_PS, ST_PS4, )
DEFINE_TILES(t_u64, uint64_t, 4, 8, 128, T4_PD, ST_PD, AVX2)
DEFINE_TILES(t_u16, uint16_t, 8, 8, 256, T8_EPI16, ST_SI, )
DEFINE_TILES(t_u8, uint8_t, 16, 16, 256, T16_EPI8, ST_SI, )
DEFINE_TILES(t_u8_x8, uint8_t, 8, 8, 256, T8_EPI8, ST_8B, )

/* most of 16 consecutive destination rows that share one of L1's 64 sets: rows whose
   stride is near a multiple of 4 KiB (channels-last planes of 32760 bytes, say) collide */
static int set_crowding(int64_t row_bytes) {
  int count[64] = {0}, most = 0;
  for (int64_t r = 0; r < 16; ++r) {
    int set = (int)(((uint64_t)(r * row_bytes) & 4095) >> 6);
    if (++count[set] > most) most = count[set];
  }
  return most;
}

static int have_avx2(void) {
  static int known = -1;
  if (known < 0) {
    __builtin_cpu_init();
    known = __builtin_cpu_supports("avx2") ? 1 : 0;
  }
  return known;
}

/* the rows [0, returned) go through vector tiles; the caller walks the rest */
int64_t etm_transpose_tiles(void* d, const void* s, size_t item, int64_t bn, int64_t an,
                            int64_t bd, int64_t as, int stream) {
  int avx2 = have_avx2();
  if ((item == 8 && !avx2) || an < 16) return 0;
  if (stream && bn * (int64_t)item >= STREAM_MIN_ROWS_BYTES)
    return etm_transpose_streamed(d, s, item, bn, an, bd, as, avx2);
  int crowded = set_crowding(bd * (int64_t)item) > 3;
  int64_t m = item == 8 ? 4 : item == 1 && !crowded ? 16 : 8;
  int64_t rows = bn < m || (item == 4 && !avx2) ? 0 : bn - bn % m;
  if (rows) {
    switch (item) {
      case 1:
        if (crowded) t_u8_x8((uint8_t*)d, (const uint8_t*)s, rows, an, bd, as);
        else t_u8((uint8_t*)d, (const uint8_t*)s, rows, an, bd, as);
        break;
      case 2: t_u16((uint16_t*)d, (const uint16_t*)s, rows, an, bd, as); break;
      case 4:
        if (crowded) t_u32((uint32_t*)d, (const uint32_t*)s, rows, an, bd, as);
        else t_u32_x16((uint32_t*)d, (const uint32_t*)s, rows, an, bd, as);
        break;
      case 8: t_u64((uint64_t*)d, (const uint64_t*)s, rows, an, bd, as); break;
      default: return 0;
    }
  }
  if (item == 4 && bn - rows >= 4) { /* SSE 4x4 for the rest (all of it without AVX2) */
    int64_t more = (bn - rows) & ~(int64_t)3;
    t_u32_x4((uint32_t*)d + rows * bd, (const uint32_t*)s + rows, more, an, bd, as);
    rows += more;
  }
  if (item == 1 && bn - rows >= 8) { /* 8 rows at a time after the 16s */
    int64_t more = (bn - rows) & ~(int64_t)7;
    t_u8_x8((uint8_t*)d + rows * bd, (const uint8_t*)s + rows, more, an, bd, as);
    rows += more;
  }
  return rows;
}
#else
int64_t etm_transpose_tiles(void* d, const void* s, size_t item, int64_t bn, int64_t an,
                            int64_t bd, int64_t as, int stream) {
  (void)d; (void)s; (void)item; (void)bn; (void)an; (void)bd; (void)as; (void)stream;
  return 0;
}
#endif

void etm_set_stream_threshold(int64_t bytes) { stream_bytes = bytes; }

int64_t etm_stream_min_rows_bytes(void) { return STREAM_MIN_ROWS_BYTES; }
