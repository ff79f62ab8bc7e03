/* A strided copy dst[i] = src[i] for two same-shape tensors of any strides
 * (loaded by etmetal/runtime/kernels/strided_copy.py, which explains the design).
 *
 * Dims contiguous on both sides are merged; the dims fastest on each side become a tiled
 * (cache-blocked) transpose, vector tiles first (transpose_kernels.c), scalar tiles for
 * the rows they leave, so both reads and writes stream.
 */
#include <stdint.h>
#include <string.h>

#include "transpose_kernels.h"

#define MAXD 16 /* strided_copy.MAX_DIMS */

typedef struct { int64_t n, s, d; } dim_t; /* size, src stride, dst stride (elements) */

/* drop size-1 dims, merge neighbours that are contiguous on both sides; -1 if empty */
static int simplify(int nd, const int64_t* sz, const int64_t* ss, const int64_t* ds, dim_t* o) {
  int m = 0;
  for (int i = 0; i < nd; ++i) {
    if (sz[i] == 0) return -1;
    if (sz[i] == 1) continue;
    if (m > 0 && o[m - 1].s == ss[i] * sz[i] && o[m - 1].d == ds[i] * sz[i]) {
      o[m - 1].n *= sz[i]; o[m - 1].s = ss[i]; o[m - 1].d = ds[i];
    } else {
      o[m].n = sz[i]; o[m].s = ss[i]; o[m].d = ds[i]; ++m;
    }
  }
  return m;
}

static int64_t iabs(int64_t v) { return v < 0 ? -v : v; }

#define DEFINE_COPY(T, TILE)                                                              \
static void copy_##T(T* dst, const T* src, int m, dim_t* dm, int stream) {                         \
  /* inner a: fastest on dst; inner b: fastest on src (if another dim) */                \
  int a = m - 1, b = m - 1;                                                            \
  for (int i = 0; i < m; ++i) {                                                        \
    if (iabs(dm[i].d) < iabs(dm[a].d)) a = i;                                          \
  }                                                                                    \
  b = a;                                                                               \
  for (int i = 0; i < m; ++i) {                                                        \
    if (i != a && iabs(dm[i].s) < iabs(dm[b].s)) b = i;                                \
  }                                                                                    \
  if (iabs(dm[a].s) <= iabs(dm[b].s)) b = a; /* a is fastest on both: one inner dim */ \
  dim_t A = dm[a], B = dm[b];                                                          \
  dim_t outer[MAXD]; int no = 0;                                                       \
  for (int i = 0; i < m; ++i) if (i != a && i != b) outer[no++] = dm[i];               \
  int64_t idx[MAXD] = {0};                                                             \
  int64_t total = 1;                                                                   \
  for (int i = 0; i < no; ++i) total *= outer[i].n;                                    \
  const int64_t as = A.s, ad = A.d, an = A.n;                                          \
  for (int64_t it = 0; it < total; ++it) {                                             \
    int64_t so = 0, dof = 0;                                                           \
    for (int i = 0; i < no; ++i) { so += idx[i] * outer[i].s; dof += idx[i] * outer[i].d; } \
    const T* s0 = src + so; T* d0 = dst + dof;                                         \
    if (b == a) {                                                                      \
      if (as == 1 && ad == 1) memcpy(d0, s0, (size_t)an * sizeof(T));                  \
      else for (int64_t j = 0; j < an; ++j) d0[j * ad] = s0[j * as];                   \
    } else {                                                                           \
      const int64_t bs = B.s, bd = B.d, bn = B.n;                                      \
      /* vector tiles take what they can; scalar tiles do the remaining rows */       \
      int64_t done = ad == 1 && bs == 1                                                \
          ? etm_transpose_tiles(d0, s0, sizeof(T), bn, an, bd, as, stream) : 0;            \
      for (int64_t i0 = done; i0 < bn; i0 += TILE) {                                   \
        int64_t i1 = i0 + TILE < bn ? i0 + TILE : bn;                                  \
        for (int64_t j0 = 0; j0 < an; j0 += TILE) {                                    \
          int64_t j1 = j0 + TILE < an ? j0 + TILE : an;                                \
          for (int64_t i = i0; i < i1; ++i) {                                          \
            const T* sr = s0 + i * bs; T* dr = d0 + i * bd;                            \
            for (int64_t j = j0; j < j1; ++j) dr[j * ad] = sr[j * as];                 \
          }                                                                            \
        }                                                                              \
      }                                                                                \
    }                                                                                  \
    for (int i = no - 1; i >= 0; --i) { if (++idx[i] < outer[i].n) break; idx[i] = 0; } \
  }                                                                                    \
}

DEFINE_COPY(uint8_t, 64)
DEFINE_COPY(uint16_t, 64)
DEFINE_COPY(uint32_t, 32)
DEFINE_COPY(uint64_t, 16)

/* byte range [lo, hi) a tensor touches */
static void extent(const char* p, int nd, const int64_t* sz, const int64_t* st, int64_t item,
                   const char** lo, const char** hi) {
  int64_t a = 0, b = 0;
  for (int i = 0; i < nd; ++i) {
    int64_t span = (sz[i] - 1) * st[i];
    if (span < 0) a += span; else b += span;
  }
  *lo = p + a * item;
  *hi = p + (b + 1) * item;
}

static int copy_impl(void* dst, const void* src, int nd, const int64_t* sizes,
                     const int64_t* src_strides, const int64_t* dst_strides, int64_t itemsize) {
  int64_t total = itemsize;
  for (int i = 0; i < nd; ++i) {
    if (sizes[i] == 0) return 0;
    total *= sizes[i];
  }
  const char *dl, *dh, *sl, *sh;
  extent((const char*)dst, nd, sizes, dst_strides, itemsize, &dl, &dh);
  extent((const char*)src, nd, sizes, src_strides, itemsize, &sl, &sh);
  if (dl < sh && sl < dh) return 1;
  dim_t dm[MAXD];
  int m = simplify(nd, sizes, src_strides, dst_strides, dm);
  if (m < 0) return 0;
  if (m == 0) { memcpy(dst, src, (size_t)itemsize); return 0; }
  int stream = total >= etm_stream_threshold();
  switch (itemsize) {
    case 1: copy_uint8_t((uint8_t*)dst, (const uint8_t*)src, m, dm, stream); return 0;
    case 2: copy_uint16_t((uint16_t*)dst, (const uint16_t*)src, m, dm, stream); return 0;
    case 4: copy_uint32_t((uint32_t*)dst, (const uint32_t*)src, m, dm, stream); return 0;
    case 8: copy_uint64_t((uint64_t*)dst, (const uint64_t*)src, m, dm, stream); return 0;
    default: return 1;
  }
}

/* geom: sizes[nd], src strides[nd], dst strides[nd] (elements).
   0: copied; 1: unsupported or overlapping (caller falls back) */
int etm_strided_copy(void* dst, const void* src, int nd, const int64_t* geom, int64_t itemsize) {
  if (nd < 0 || nd > MAXD) return 1;
  return copy_impl(dst, src, nd, geom, geom + nd, geom + 2 * nd, itemsize);
}

/* the same into a dense row-major dst of the same sizes: geom is sizes[nd], src strides[nd] */
int etm_gather_contiguous(void* dst, const void* src, int nd, const int64_t* geom,
                          int64_t itemsize) {
  if (nd < 0 || nd > MAXD) return 1;
  int64_t dst_strides[MAXD], step = 1;
  for (int i = nd - 1; i >= 0; --i) { dst_strides[i] = step; step *= geom[i]; }
  return copy_impl(dst, src, nd, geom, geom + nd, dst_strides, itemsize);
}

/* the Python loader checks its MAX_DIMS against this at load */
int etm_strided_copy_max_dims(void) { return MAXD; }
