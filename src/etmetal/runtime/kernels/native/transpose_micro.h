/* Register micro-tiles of the vector transposes (transpose_kernels.c, transpose_stream.c):
 * MICRO(D, S, LDD, LDS, STORE) moves D[r*LDD + c] = S[c*LDS + r] for r, c < M with shuffles
 * only (every bit, NaN payloads included, is preserved); STORE(p, v) writes one row of the
 * tile. x86-64 only: the including file has checked ETM_X86 and included <immintrin.h>.
 */
#ifndef ETMETAL_TRANSPOSE_MICRO_H
#define ETMETAL_TRANSPOSE_MICRO_H

#define AVX2 __attribute__((target("avx2")))

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

#endif
