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
 * Copies of a quarter of the last-level cache or more store non-temporally (8 rows at a
 * time: few write-combining buffers) when the destination rows are 16-byte aligned: a
 * cached store first reads each destination line (read-for-ownership), a third of the
 * traffic of a copy that misses the cache anyway.
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

/* copies of at least this many bytes store non-temporally: a quarter of the last-level
   cache, past which (source + destination, a shared cache) the output would not stay
   cached anyway; measured here, it lifts 8-64 MiB transposes from ~0.68 to ~0.85 of a
   contiguous copy's bandwidth */
static int64_t stream_bytes = -1; /* -1: not measured yet */
int64_t etm_stream_threshold(void) {
  if (stream_bytes < 0) {
    int64_t l3 = l3_bytes();
    stream_bytes = (l3 > 0 ? l3 : ((int64_t)32 << 20)) / 4;
  }
  return stream_bytes;
}

#if defined(ETM_X86)
/* ---- micro-tiles: D[r*LDD + c] = S[c*LDS + r] for r, c < M ---- */

#define T8_PS(D, S, LDD, LDS, STORE)                                                     \
  {                                                                                      \
    float* d_ = (float*)(D);                                                             \
    const float* s_ = (const float*)(S);                                                 \
    const int64_t ld_ = (LDD), ls_ = (LDS);                                              \
    __m256 r0 = _mm256_loadu_ps(s_ + 0 * ls_), r1 = _mm256_loadu_ps(s_ + 1 * ls_);      \
    __m256 r2 = _mm256_loadu_ps(s_ + 2 * ls_), r3 = _mm256_loadu_ps(s_ + 3 * ls_);      \
    __m256 r4 = _mm256_loadu_ps(s_ + 4 * ls_), r5 = _mm256_loadu_ps(s_ + 5 * ls_);      \
    __m256 r6 = _mm256_loadu_ps(s_ + 6 * ls_), r7 = _mm256_loadu_ps(s_ + 7 * ls_);      \
    __m256 t0 = _mm256_unpacklo_ps(r0, r1), t1 = _mm256_unpackhi_ps(r0, r1);            \
    __m256 t2 = _mm256_unpacklo_ps(r2, r3), t3 = _mm256_unpackhi_ps(r2, r3);            \
    __m256 t4 = _mm256_unpacklo_ps(r4, r5), t5 = _mm256_unpackhi_ps(r4, r5);            \
    __m256 t6 = _mm256_unpacklo_ps(r6, r7), t7 = _mm256_unpackhi_ps(r6, r7);            \
    __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xEE);  \
    __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xEE);  \
    __m256 u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xEE);  \
    __m256 u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xEE);  \
    STORE(d_ + 0 * ld_, _mm256_permute2f128_ps(u0, u4, 0x20));                          \
    STORE(d_ + 1 * ld_, _mm256_permute2f128_ps(u1, u5, 0x20));                          \
    STORE(d_ + 2 * ld_, _mm256_permute2f128_ps(u2, u6, 0x20));                          \
    STORE(d_ + 3 * ld_, _mm256_permute2f128_ps(u3, u7, 0x20));                          \
    STORE(d_ + 4 * ld_, _mm256_permute2f128_ps(u0, u4, 0x31));                          \
    STORE(d_ + 5 * ld_, _mm256_permute2f128_ps(u1, u5, 0x31));                          \
    STORE(d_ + 6 * ld_, _mm256_permute2f128_ps(u2, u6, 0x31));                          \
    STORE(d_ + 7 * ld_, _mm256_permute2f128_ps(u3, u7, 0x31));                          \
  }
#define ST_PS(p, v) _mm256_storeu_ps(p, v)

/* SSE 4x4: the last 4..7 rows of a 4-byte transpose */
#define T4_PS(D, S, LDD, LDS, STORE)                                                     \
  {                                                                                      \
    float* d_ = (float*)(D);                                                             \
    const float* s_ = (const float*)(S);                                                 \
    const int64_t ld_ = (LDD), ls_ = (LDS);                                              \
    __m128 r0 = _mm_loadu_ps(s_ + 0 * ls_), r1 = _mm_loadu_ps(s_ + 1 * ls_);            \
    __m128 r2 = _mm_loadu_ps(s_ + 2 * ls_), r3 = _mm_loadu_ps(s_ + 3 * ls_);            \
    _MM_TRANSPOSE4_PS(r0, r1, r2, r3);                                                   \
    STORE(d_ + 0 * ld_, r0);                                                             \
    STORE(d_ + 1 * ld_, r1);                                                             \
    STORE(d_ + 2 * ld_, r2);                                                             \
    STORE(d_ + 3 * ld_, r3);                                                             \
  }
#define ST_PS4(p, v) _mm_storeu_ps(p, v)
/* 16-byte halves: _mm_stream_ps needs 16-byte alignment, rows need not have 32 */
#define ST_PS_NT(p, v)                                                                   \
  do {                                                                                   \
    _mm_stream_ps(p, _mm256_castps256_ps128(v));                                         \
    _mm_stream_ps((p) + 4, _mm256_extractf128_ps(v, 1));                                 \
  } while (0)

#define T4_PD(D, S, LDD, LDS, STORE)                                                     \
  {                                                                                      \
    double* d_ = (double*)(D);                                                           \
    const double* s_ = (const double*)(S);                                               \
    const int64_t ld_ = (LDD), ls_ = (LDS);                                              \
    __m256d r0 = _mm256_loadu_pd(s_ + 0 * ls_), r1 = _mm256_loadu_pd(s_ + 1 * ls_);     \
    __m256d r2 = _mm256_loadu_pd(s_ + 2 * ls_), r3 = _mm256_loadu_pd(s_ + 3 * ls_);     \
    __m256d t0 = _mm256_unpacklo_pd(r0, r1), t1 = _mm256_unpackhi_pd(r0, r1);           \
    __m256d t2 = _mm256_unpacklo_pd(r2, r3), t3 = _mm256_unpackhi_pd(r2, r3);           \
    STORE(d_ + 0 * ld_, _mm256_permute2f128_pd(t0, t2, 0x20));                          \
    STORE(d_ + 1 * ld_, _mm256_permute2f128_pd(t1, t3, 0x20));                          \
    STORE(d_ + 2 * ld_, _mm256_permute2f128_pd(t0, t2, 0x31));                          \
    STORE(d_ + 3 * ld_, _mm256_permute2f128_pd(t1, t3, 0x31));                          \
  }
#define ST_PD(p, v) _mm256_storeu_pd(p, v)
#define ST_PD_NT(p, v)                                                                   \
  do {                                                                                   \
    _mm_stream_pd(p, _mm256_castpd256_pd128(v));                                         \
    _mm_stream_pd((p) + 2, _mm256_extractf128_pd(v, 1));                                 \
  } while (0)

#define LD16(p) _mm_loadu_si128((const __m128i*)(p))
#define T8_EPI16(D, S, LDD, LDS, STORE)                                                  \
  {                                                                                      \
    uint16_t* d_ = (uint16_t*)(D);                                                       \
    const uint16_t* s_ = (const uint16_t*)(S);                                           \
    const int64_t ld_ = (LDD), ls_ = (LDS);                                              \
    __m128i r0 = LD16(s_ + 0 * ls_), r1 = LD16(s_ + 1 * ls_), r2 = LD16(s_ + 2 * ls_);   \
    __m128i r3 = LD16(s_ + 3 * ls_), r4 = LD16(s_ + 4 * ls_), r5 = LD16(s_ + 5 * ls_);   \
    __m128i r6 = LD16(s_ + 6 * ls_), r7 = LD16(s_ + 7 * ls_);                            \
    __m128i a0 = _mm_unpacklo_epi16(r0, r1), a1 = _mm_unpackhi_epi16(r0, r1);           \
    __m128i a2 = _mm_unpacklo_epi16(r2, r3), a3 = _mm_unpackhi_epi16(r2, r3);           \
    __m128i a4 = _mm_unpacklo_epi16(r4, r5), a5 = _mm_unpackhi_epi16(r4, r5);           \
    __m128i a6 = _mm_unpacklo_epi16(r6, r7), a7 = _mm_unpackhi_epi16(r6, r7);           \
    __m128i b0 = _mm_unpacklo_epi32(a0, a2), b1 = _mm_unpackhi_epi32(a0, a2);           \
    __m128i b2 = _mm_unpacklo_epi32(a1, a3), b3 = _mm_unpackhi_epi32(a1, a3);           \
    __m128i b4 = _mm_unpacklo_epi32(a4, a6), b5 = _mm_unpackhi_epi32(a4, a6);           \
    __m128i b6 = _mm_unpacklo_epi32(a5, a7), b7 = _mm_unpackhi_epi32(a5, a7);           \
    STORE(d_ + 0 * ld_, _mm_unpacklo_epi64(b0, b4));                                     \
    STORE(d_ + 1 * ld_, _mm_unpackhi_epi64(b0, b4));                                     \
    STORE(d_ + 2 * ld_, _mm_unpacklo_epi64(b1, b5));                                     \
    STORE(d_ + 3 * ld_, _mm_unpackhi_epi64(b1, b5));                                     \
    STORE(d_ + 4 * ld_, _mm_unpacklo_epi64(b2, b6));                                     \
    STORE(d_ + 5 * ld_, _mm_unpackhi_epi64(b2, b6));                                     \
    STORE(d_ + 6 * ld_, _mm_unpacklo_epi64(b3, b7));                                     \
    STORE(d_ + 7 * ld_, _mm_unpackhi_epi64(b3, b7));                                     \
  }
#define ST_SI(p, v) _mm_storeu_si128((__m128i*)(p), v)
#define ST_SI_NT(p, v) _mm_stream_si128((__m128i*)(p), v)

/* 16x16 bytes: four rounds of interleaving (8, 16, 32, 64-bit units) */
#define T16_EPI8(D, S, LDD, LDS, STORE)                                                  \
  {                                                                                      \
    uint8_t* d_ = (uint8_t*)(D);                                                         \
    const uint8_t* s_ = (const uint8_t*)(S);                                             \
    const int64_t ld_ = (LDD), ls_ = (LDS);                                              \
    __m128i x[16], y[16];                                                                \
    for (int k = 0; k < 16; ++k) x[k] = LD16(s_ + k * ls_);                              \
    for (int k = 0; k < 8; ++k) {                                                        \
      y[k] = _mm_unpacklo_epi8(x[2 * k], x[2 * k + 1]);                                  \
      y[k + 8] = _mm_unpackhi_epi8(x[2 * k], x[2 * k + 1]);                              \
    }                                                                                    \
    for (int k = 0; k < 8; ++k) {                                                        \
      x[k] = _mm_unpacklo_epi16(y[2 * k], y[2 * k + 1]);                                 \
      x[k + 8] = _mm_unpackhi_epi16(y[2 * k], y[2 * k + 1]);                             \
    }                                                                                    \
    for (int k = 0; k < 8; ++k) {                                                        \
      y[k] = _mm_unpacklo_epi32(x[2 * k], x[2 * k + 1]);                                 \
      y[k + 8] = _mm_unpackhi_epi32(x[2 * k], x[2 * k + 1]);                             \
    }                                                                                    \
    for (int k = 0; k < 8; ++k) {                                                        \
      x[k] = _mm_unpacklo_epi64(y[2 * k], y[2 * k + 1]);                                 \
      x[k + 8] = _mm_unpackhi_epi64(y[2 * k], y[2 * k + 1]);                             \
    }                                                                                    \
    /* x[k] now holds source column T16_ROW[k], the destination row it goes to */       \
    for (int k = 0; k < 16; ++k) STORE(d_ + T16_ROW[k] * ld_, x[k]);                     \
  }
/* each round sends the low halves to the first 8 registers and the high halves to the
   last 8, so register k ends up with the column whose 4 bits are k's bits reversed */
static const int T16_ROW[16] = {0, 8, 4, 12, 2, 10, 6, 14, 1, 9, 5, 13, 3, 11, 7, 15};

/* 8x8 bytes, 8-byte stores: for destination rows that crowd L1 sets (16 would thrash) */
#define LD8(p) _mm_loadl_epi64((const __m128i*)(p))
#define HI8(v) _mm_unpackhi_epi64(v, v)
#define T8_EPI8(D, S, LDD, LDS, STORE)                                                   \
  {                                                                                      \
    uint8_t* d_ = (uint8_t*)(D);                                                         \
    const uint8_t* s_ = (const uint8_t*)(S);                                             \
    const int64_t ld_ = (LDD), ls_ = (LDS);                                              \
    __m128i a0 = _mm_unpacklo_epi8(LD8(s_ + 0 * ls_), LD8(s_ + 1 * ls_));                \
    __m128i a1 = _mm_unpacklo_epi8(LD8(s_ + 2 * ls_), LD8(s_ + 3 * ls_));                \
    __m128i a2 = _mm_unpacklo_epi8(LD8(s_ + 4 * ls_), LD8(s_ + 5 * ls_));                \
    __m128i a3 = _mm_unpacklo_epi8(LD8(s_ + 6 * ls_), LD8(s_ + 7 * ls_));                \
    __m128i b0 = _mm_unpacklo_epi16(a0, a1), b1 = _mm_unpackhi_epi16(a0, a1);           \
    __m128i b2 = _mm_unpacklo_epi16(a2, a3), b3 = _mm_unpackhi_epi16(a2, a3);           \
    __m128i c0 = _mm_unpacklo_epi32(b0, b2), c1 = _mm_unpackhi_epi32(b0, b2);           \
    __m128i c2 = _mm_unpacklo_epi32(b1, b3), c3 = _mm_unpackhi_epi32(b1, b3);           \
    STORE(d_ + 0 * ld_, c0);                                                             \
    STORE(d_ + 1 * ld_, HI8(c0));                                                        \
    STORE(d_ + 2 * ld_, c1);                                                             \
    STORE(d_ + 3 * ld_, HI8(c1));                                                        \
    STORE(d_ + 4 * ld_, c2);                                                             \
    STORE(d_ + 5 * ld_, HI8(c2));                                                        \
    STORE(d_ + 6 * ld_, c3);                                                             \
    STORE(d_ + 7 * ld_, HI8(c3));                                                        \
  }
#define ST_8B(p, v) _mm_storel_epi64((__m128i*)(p), v)
#define ST_8B_NT(p, v) _mm_stream_si64((long long*)(p), _mm_cvtsi128_si64(v))

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
#define AVX2 __attribute__((target("avx2")))
/* 16 rows side by side use each 64-byte source line in one pass, but only when the rows
   spread over L1 sets (see set_crowding); streaming stores keep 8 (few write-combining
   buffers) with longer row runs. Block sizes measured here (etmetal bench overhead and a
   sweep over channel counts 3-512 and plane sizes) */
DEFINE_TILES(t_u32, uint32_t, 8, 8, 256, T8_PS, ST_PS, AVX2)
DEFINE_TILES(t_u32_x16, uint32_t, 8, 16, 1024, T8_PS, ST_PS, AVX2)
DEFINE_TILES(t_u32_nt, uint32_t, 8, 8, 1024, T8_PS, ST_PS_NT, AVX2)
DEFINE_TILES(t_u32_x4, uint32_t, 4, 4, 256, T4_PS, ST_PS4, )
DEFINE_TILES(t_u64, uint64_t, 4, 8, 128, T4_PD, ST_PD, AVX2)
DEFINE_TILES(t_u64_nt, uint64_t, 4, 8, 512, T4_PD, ST_PD_NT, AVX2)
DEFINE_TILES(t_u16, uint16_t, 8, 8, 256, T8_EPI16, ST_SI, )
DEFINE_TILES(t_u16_nt, uint16_t, 8, 8, 2048, T8_EPI16, ST_SI_NT, )
DEFINE_TILES(t_u8, uint8_t, 16, 16, 256, T16_EPI8, ST_SI, )
DEFINE_TILES(t_u8_nt, uint8_t, 8, 8, 1024, T8_EPI8, ST_8B_NT, )
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
  /* streaming stores need 16-byte aligned destination rows */
  int nt = stream && ((uintptr_t)d & 15) == 0 && ((bd * (int64_t)item) & 15) == 0;
  int crowded = !nt && set_crowding(bd * (int64_t)item) > 3;
  int64_t m = item == 8 ? 4 : item == 1 && !crowded && !nt ? 16 : 8;
  int64_t rows = bn < m || (item == 4 && !avx2) ? 0 : bn - bn % m;
  nt = nt && rows;
  if (rows) {
    switch (item) {
      case 1:
        if (nt) t_u8_nt((uint8_t*)d, (const uint8_t*)s, rows, an, bd, as);
        else if (crowded) t_u8_x8((uint8_t*)d, (const uint8_t*)s, rows, an, bd, as);
        else t_u8((uint8_t*)d, (const uint8_t*)s, rows, an, bd, as);
        break;
      case 2: (nt ? t_u16_nt : t_u16)((uint16_t*)d, (const uint16_t*)s, rows, an, bd, as); break;
      case 4:
        if (nt) t_u32_nt((uint32_t*)d, (const uint32_t*)s, rows, an, bd, as);
        else if (crowded) t_u32((uint32_t*)d, (const uint32_t*)s, rows, an, bd, as);
        else t_u32_x16((uint32_t*)d, (const uint32_t*)s, rows, an, bd, as);
        break;
      case 8: (nt ? t_u64_nt : t_u64)((uint64_t*)d, (const uint64_t*)s, rows, an, bd, as); break;
      default: return 0;
    }
  }
  if (nt) _mm_sfence(); /* order the streamed lines before whatever the caller does next */
  if (item == 4 && bn - rows >= 4) { /* SSE 4x4 for the rest (all of it without AVX2) */
    int64_t more = (bn - rows) & ~(int64_t)3;
    t_u32_x4((uint32_t*)d + rows * bd, (const uint32_t*)s + rows, more, an, bd, as);
    rows += more;
  }
  if (item == 1 && !nt && bn - rows >= 8) { /* 8 rows at a time after the 16s */
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
