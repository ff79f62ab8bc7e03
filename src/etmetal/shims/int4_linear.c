/* torchao's int4 weight-only linear (fpa4w) computed from the packed weights.

   out[m][n] = sum_k a[m][k] * (q[n][k] * s[n][g] + z[n][g]),  g = k / group_size

   q is stored packed along K, two values a byte, the even column in the low nibble
   (etmetal.common.lowbit). The reference dequantizes the whole [N, K] matrix to float32
   and runs one matmul. For a few rows of A (decode-shaped calls) etm_int4_linear_f32
   dequantizes each weight group into a small buffer that stays in L1 while every row of
   A uses it, so a call touches the packed bytes once and never materializes the float
   matrix; for many rows the caller runs a float32 matmul over tiles of rows that
   etm_int4_dequantize_rows dequantizes, one tile at a time. The weights are dequantized exactly as the
   reference does (q * s + z in float32); the dot products are summed in double and
   rounded once, so the result is the float32 rounding of the exact product of A and
   the dequantized weights (a float32 matmul, the reference's, is within its own
   summation error of that). */

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#define ETM_INT4_MAX_GROUP 256 /* largest group size torchao packs (lowbit.GROUP_SIZES) */
#define LANES 8                /* independent partial sums: the compiler vectorizes them */

int etm_int4_max_group(void) { return ETM_INT4_MAX_GROUP; }

/* the dot product of len floats, len a multiple of LANES, summed in double: a float
   product is exact in double, so the result is the exact dot product to well below
   float32's resolution, whatever the summation order */
static double dot(const float* x, const float* w, int64_t len) {
  double part[LANES] = {0};
  for (int64_t j = 0; j < len; j += LANES) {
    for (int l = 0; l < LANES; ++l) part[l] += (double)x[j + l] * (double)w[j + l];
  }
  double sum = 0.0;
  for (int l = 0; l < LANES; ++l) sum += part[l];
  return sum;
}

/* a: [m, k] contiguous; packed: [n, k / 2] contiguous; s, z: [n, ld_sz] contiguous with
   ld_sz >= ceil(k / group_size); out: [m, n] contiguous. k is a multiple of 8 and
   group_size a multiple of 8 no larger than ETM_INT4_MAX_GROUP (the caller checked the
   operator's arguments). Returns 0, or -1 for arguments outside those limits or when
   the scratch row cannot be allocated. */
int etm_int4_linear_f32(const float* a, const uint8_t* packed, const float* s, const float* z,
                        int64_t m, int64_t k, int64_t n, int64_t group_size, int64_t ld_sz,
                        float* out) {
  if (m < 0 || n < 0 || k < 0 || k % LANES || group_size <= 0 || group_size % LANES ||
      group_size > ETM_INT4_MAX_GROUP || ld_sz * group_size < k) {
    return -1;
  }
  if (m == 0 || n == 0) return 0;
  double* acc = (double*)malloc((size_t)m * sizeof(double));
  if (acc == NULL) return -1;
  float w[ETM_INT4_MAX_GROUP];
  const int64_t row_bytes = k / 2;
  for (int64_t row = 0; row < n; ++row) {
    const uint8_t* q = packed + row * row_bytes;
    const float* srow = s + row * ld_sz;
    const float* zrow = z + row * ld_sz;
    for (int64_t i = 0; i < m; ++i) acc[i] = 0.0;
    for (int64_t k0 = 0, g = 0; k0 < k; k0 += group_size, ++g) {
      const int64_t len = k - k0 < group_size ? k - k0 : group_size;
      const float scale = srow[g], zero = zrow[g];
      const uint8_t* bytes = q + k0 / 2;
      for (int64_t j = 0; j < len / 2; ++j) {
        w[2 * j] = (float)(bytes[j] & 0x0F) * scale + zero;
        w[2 * j + 1] = (float)(bytes[j] >> 4) * scale + zero;
      }
      for (int64_t i = 0; i < m; ++i) acc[i] += dot(a + i * k + k0, w, len);
    }
    for (int64_t i = 0; i < m; ++i) out[i * n + row] = (float)acc[i];
  }
  free(acc);
  return 0;
}

/* rows [row0, row0 + rows) of the dequantized weight matrix into out ([rows, k]
   contiguous): q * s + z in float32, as the reference computes it. Used tile by tile for
   many-row activations, where a float32 matmul over a tile beats the dot products above.
   Same limits and return value as etm_int4_linear_f32. */
int etm_int4_dequantize_rows(const uint8_t* packed, const float* s, const float* z, int64_t row0,
                             int64_t rows, int64_t k, int64_t group_size, int64_t ld_sz,
                             float* out) {
  if (row0 < 0 || rows < 0 || k < 0 || k % LANES || group_size <= 0 || group_size % LANES ||
      group_size > ETM_INT4_MAX_GROUP || ld_sz * group_size < k) {
    return -1;
  }
  const int64_t row_bytes = k / 2;
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t row = row0 + r;
    const uint8_t* q = packed + row * row_bytes;
    float* w = out + r * k;
    for (int64_t k0 = 0, g = 0; k0 < k; k0 += group_size, ++g) {
      const int64_t len = k - k0 < group_size ? k - k0 : group_size;
      const float scale = s[row * ld_sz + g], zero = z[row * ld_sz + g];
      for (int64_t j = 0; j < len / 2; ++j) {
        const uint8_t byte = q[k0 / 2 + j];
        w[k0 + 2 * j] = (float)(byte & 0x0F) * scale + zero;
        w[k0 + 2 * j + 1] = (float)(byte >> 4) * scale + zero;
      }
    }
  }
  return 0;
}
