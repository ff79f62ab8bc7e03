/* Transposes that store non-temporally, whole cache lines at a time (transpose_kernels.h).
 *
 * A micro-tile writes 16 or 32 bytes into each of 8 or 16 destination rows. Streamed
 * straight from the tile, that keeps up to 16 write-combining lines partly filled at once,
 * and a CPU that evicts partial WC lines early turns each into a read-modify-write at
 * memory (a KVM guest here: 2-4 GB/s against 10-11 for a plain copy of 16 MiB). So the
 * tiles go into a staging buffer (a block of 64 rows x 512 bytes of columns), and each
 * destination row's chunk then leaves it as consecutive 64-byte lines, written back to
 * back. Bytes of a line a row covers only partly (row starts and ends that are not 64-byte
 * aligned) take ordinary stores, so no line is ever written both ways. A row's last line in
 * a chunk usually straddles into the next chunk: it goes out with the next chunk, which
 * stages the columns of that line again.
 *
 * Measured here (float32, 16 and 32 MiB, each variant on its own buffers, interleaved in
 * alternating order): streaming each row's 8 lines right after a whole block is staged,
 * with the next block's source prefetched meanwhile, ran at 5.1-6.2 GB/s; without the
 * prefetch 1-13% slower with 32 channels and 8-46% slower with 128. Staging one line of
 * columns at a time and streaming one line per row after each (32 rows in turn) ran at
 * about half the speed of the cached tiles.
 */
#include "transpose_kernels.h"

#include <string.h>
#if defined(__x86_64__) && defined(__GNUC__)
#define ETM_X86 1
#include <immintrin.h>
#endif

#if defined(ETM_X86)
#include "transpose_micro.h"

#define LINE 64
#define BLOCK_ROWS 64   /* destination rows per block */
#define CHUNK_BYTES 512 /* bytes of each destination row per block: 8 lines */
#define SROW (LINE + CHUNK_BYTES) /* a row of the staging: the line before the chunk, the chunk */

/* st[g*sld + (j - j0)] = s[j*as + g] for g < rows, j0 <= j < j1: micro-tiles for whole
   groups of M rows and M columns, scalar moves for the rest (any row count, even < M) */
#define DEFINE_FILL(NAME, T, M, MICRO, STORE, ATTR)                                          \
ATTR static void NAME(void* stv, int64_t sld, const void* sv, int64_t rows, int64_t j0,      \
                      int64_t j1, int64_t as) {                                              \
  T* st = (T*)stv; /* column j at st[j - j0] */                                              \
  const T* s = (const T*)sv;                                                                 \
  const int64_t gm = rows - rows % M;                                                        \
  int64_t j = j0;                                                                            \
  for (; j + M <= j1; j += M) {                                                              \
    T* sc = st + (j - j0);                                                                   \
    for (int64_t g = 0; g < gm; g += M) MICRO(sc + g * sld, s + j * as + g, sld, as, STORE)  \
    for (int64_t g = gm; g < rows; ++g)                                                      \
      for (int k = 0; k < M; ++k) sc[g * sld + k] = s[(j + k) * as + g];                     \
  }                                                                                          \
  for (; j < j1; ++j)                                                                        \
    for (int64_t g = 0; g < rows; ++g) st[g * sld + (j - j0)] = s[j * as + g];               \
}
DEFINE_FILL(fill_u8, uint8_t, 16, T16_EPI8, ST_SI, )
DEFINE_FILL(fill_u16, uint16_t, 8, T8_EPI16, ST_SI, )
DEFINE_FILL(fill_u32, uint32_t, 8, T8_PS, ST_PS, AVX2)
DEFINE_FILL(fill_u32_sse, uint32_t, 4, T4_PS, ST_PS4, )
DEFINE_FILL(fill_u64, uint64_t, 4, T4_PD, ST_PD, AVX2)

typedef void fill_fn(void*, int64_t, const void*, int64_t, int64_t, int64_t, int64_t);

static uintptr_t line_down(uintptr_t a) { return a & ~(uintptr_t)(LINE - 1); }

/* Streams the part of one destination row that chunk [x0, x1) (row bytes) is responsible for;
   staged[LINE + x - x0] holds row byte x for x in [x0 - LINE, x1) (the LINE bytes before x0
   only after the first chunk). Each chunk ends where a line ends (the row's end for the last
   chunk), so the chunks cut every row into runs of whole lines plus the row's partial first
   and last lines, which take ordinary stores. */
static void emit_row(char* row, int64_t row_bytes, const char* staged, int64_t x0, int64_t x1) {
  const int64_t to_staged = LINE - x0; /* row byte x is staged[x + to_staged] */
  const uintptr_t base = (uintptr_t)row;
  int64_t p = x0 == 0 ? 0 : (int64_t)(line_down(base + (uintptr_t)x0) - base);
  const int64_t q = x1 == row_bytes ? x1 : (int64_t)(line_down(base + (uintptr_t)x1) - base);
  if (p < 0) p = 0;
  if (q <= p) return; /* no line of the row ends in this chunk: it goes with the next */
  const int64_t a = (int64_t)(line_down(base + (uintptr_t)p + LINE - 1) - base);
  const int64_t b = (int64_t)(line_down(base + (uintptr_t)q) - base);
  if (a >= b) { /* no whole line */
    memcpy(row + p, staged + (p + to_staged), (size_t)(q - p));
    return;
  }
  if (a > p) memcpy(row + p, staged + (p + to_staged), (size_t)(a - p));
  for (int64_t x = a; x < b; x += LINE) {
    const __m128i* src = (const __m128i*)(staged + (x + to_staged));
    __m128i* dst = (__m128i*)(row + x);
    __m128i v0 = _mm_loadu_si128(src), v1 = _mm_loadu_si128(src + 1);
    __m128i v2 = _mm_loadu_si128(src + 2), v3 = _mm_loadu_si128(src + 3);
    _mm_stream_si128(dst, v0);
    _mm_stream_si128(dst + 1, v1);
    _mm_stream_si128(dst + 2, v2);
    _mm_stream_si128(dst + 3, v3);
  }
  if (q > b) memcpy(row + b, staged + (b + to_staged), (size_t)(q - b));
}

/* a block of the transpose: rows [i0, i0 + rows) x columns [j0, j1) */
typedef struct { int64_t i0, rows, j0, j1; } block_t;

typedef struct {
  char* d;
  const char* s;
  int64_t item, bn, an, bd, as;
  fill_fn* fill;
} job_t;

/* Fills block b into the staging and streams its rows out. The columns of the line before j0
   are filled again (still cached), so the line each row's previous chunk left open can be
   completed. While the rows stream out, the source of the next block (nrows 0: none) is
   prefetched a slice per row: with the core stalled on stores, the hardware prefetcher
   would not fetch ahead, and reading the next block would not overlap writing this one. */
static void stage_block(const job_t* t, char* stage, block_t b, block_t next) {
  const int64_t item = t->item, js = b.j0 > 0 ? b.j0 - LINE / item : 0;
  t->fill(stage + LINE - (b.j0 - js) * item, SROW / item, t->s + b.i0 * item, b.rows, js,
          b.j1, t->as);
  int64_t pj = next.j0;
  const int64_t per_row = (next.j1 - next.j0 + b.rows - 1) / b.rows, span = next.rows * item;
  for (int64_t g = 0; g < b.rows; ++g) {
    emit_row(t->d + (b.i0 + g) * t->bd * item, t->an * item, stage + g * SROW, b.j0 * item,
             b.j1 * item);
    const int64_t pe = pj + per_row < next.j1 ? pj + per_row : next.j1;
    for (; pj < pe; ++pj) {
      /* addresses, not pointers: the last line may lie past the source (a prefetch never
         faults) */
      const uintptr_t p = (uintptr_t)(t->s + (pj * t->as + next.i0) * item);
      for (int64_t o = 0; o < span + LINE - 1; o += LINE)
        _mm_prefetch((const char*)(p + (uintptr_t)o), _MM_HINT_T0);
    }
  }
}

/* blocks go down the rows of a chunk of columns, then to the next chunk: a chunk's source
   (its columns, all rows) stays in L2 while its row blocks take their slices */
static block_t next_block(const job_t* t, block_t b) {
  block_t n = b;
  n.i0 = b.i0 + BLOCK_ROWS;
  if (n.i0 >= t->bn) {
    n.i0 = 0;
    n.j0 = b.j1;
    n.j1 = b.j1 + CHUNK_BYTES / t->item < t->an ? b.j1 + CHUNK_BYTES / t->item : t->an;
  }
  n.rows = n.j0 >= t->an ? 0 : t->bn - n.i0 < BLOCK_ROWS ? t->bn - n.i0 : BLOCK_ROWS;
  return n;
}

int64_t etm_transpose_streamed(void* d, const void* s, size_t item, int64_t bn, int64_t an,
                               int64_t bd, int64_t as, int avx2) {
  fill_fn* fill;
  switch (item) {
    case 1: fill = fill_u8; break;
    case 2: fill = fill_u16; break;
    case 4: fill = avx2 ? fill_u32 : fill_u32_sse; break;
    case 8:
      if (!avx2) return 0;
      fill = fill_u64;
      break;
    default: return 0;
  }
  if (bn <= 0 || an <= 0) return 0;
  const job_t t = {(char*)d, (const char*)s, (int64_t)item, bn, an, bd, as, fill};
  _Alignas(LINE) char stage[BLOCK_ROWS * SROW]; /* 36 KiB: L1 and L2 hold it */
  block_t b = {0, bn < BLOCK_ROWS ? bn : BLOCK_ROWS, 0,
               CHUNK_BYTES / t.item < an ? CHUNK_BYTES / t.item : an};
  while (b.rows > 0) {
    const block_t n = next_block(&t, b);
    stage_block(&t, stage, b, n);
    b = n;
  }
  _mm_sfence(); /* order the streamed lines before whatever the caller does next */
  return bn;
}
#else
int64_t etm_transpose_streamed(void* d, const void* s, size_t item, int64_t bn, int64_t an,
                               int64_t bd, int64_t as, int avx2) {
  (void)d; (void)s; (void)item; (void)bn; (void)an; (void)bd; (void)as; (void)avx2;
  return 0;
}
#endif
