/* A native object that calls SLEEF's vector exp the way Inductor's vectorized CPU kernels
 * do (softmax, GELU, SiLU), and leaves the symbol undefined, as a link_libtorch=False
 * AOTI .so does. The test loads it through AotiModel's link group and compares with torch. */
#include <stdint.h>

#if defined(__x86_64__)
#include <immintrin.h>
__m256 Sleef_expf8_u10(__m256 x);

/* AVX only inside this function: the file itself builds for any x86-64 */
__attribute__((target("avx"))) static void exp8(const float* in, float* out) {
  _mm256_storeu_ps(out, Sleef_expf8_u10(_mm256_loadu_ps(in)));
}
#define LANES 8
static int vector_unit(void) { return __builtin_cpu_supports("avx"); }
#elif defined(__aarch64__)
#include <arm_neon.h>
float32x4_t Sleef_expf4_u10(float32x4_t x);

static void exp8(const float* in, float* out) {
  vst1q_f32(out, Sleef_expf4_u10(vld1q_f32(in)));
  vst1q_f32(out + 4, Sleef_expf4_u10(vld1q_f32(in + 4)));
}
#define LANES 8
static int vector_unit(void) { return 1; }
#else
#error "sleef_exp.c: no SLEEF vector exp for this architecture"
#endif

/* exp of in[0:n] into out; n a multiple of 8. Returns 0, or -1 without a vector unit. */
int32_t etm_sleef_exp(const float* in, float* out, int64_t n) {
  if (!vector_unit() || n % LANES != 0) return -1;
  for (int64_t i = 0; i < n; i += LANES) exp8(in + i, out + i);
  return 0;
}
