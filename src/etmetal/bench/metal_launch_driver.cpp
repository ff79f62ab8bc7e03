// `etmetal bench metal` (etmetal.bench.metal): one Metal kernel launched N times
// through the shims, from native code, exactly as Inductor's Metal wrapper launches each one:
//
//   aoti_torch_mps_run_command_block(fn, aoti_torch_mps_shared_callback, &std::function{
//     start_encoding(fn); set_arg_tensor(fn, 0, out); set_arg_tensor(fn, 1, in);
//     set_arg_int(fn, 2, n); dispatch_single(fn, n); })
//
// The driver is linked against the bridge by path (like a model's link wrapper), so these
// calls bind to etmetal's shims.
#include <stdint.h>
#include <time.h>

#include <functional>

struct AOTIMetalKernelFunctionOpaque;
struct AOTIMetalShaderLibraryOpaque;
using Fn = AOTIMetalKernelFunctionOpaque*;
using Lib = AOTIMetalShaderLibraryOpaque*;
using Tensor = void*;

extern "C" {
int32_t aoti_torch_mps_create_shader_library(const char*, Lib*);
int32_t aoti_torch_mps_delete_shader_library(Lib);
int32_t aoti_torch_mps_get_kernel_function(Lib, const char*, Fn*);
int32_t aoti_torch_mps_start_encoding(Fn);
int32_t aoti_torch_mps_set_arg_tensor(Fn, unsigned, Tensor);
int32_t aoti_torch_mps_set_arg_int(Fn, unsigned, int64_t);
int32_t aoti_torch_mps_dispatch_single(Fn, uint64_t);
void aoti_torch_mps_shared_callback(Fn, void*);
int32_t aoti_torch_mps_run_command_block(Fn, void (*)(Fn, void*), void*);
int32_t aoti_torch_empty_strided(int64_t, const int64_t*, const int64_t*, int32_t, int32_t,
                                 int32_t, Tensor*);
int32_t aoti_torch_delete_tensor_object(Tensor);
int32_t aoti_torch_get_data_ptr(Tensor, void**);
int32_t aoti_torch_dtype_float32(void);
int32_t aoti_torch_device_type_mps(void);

static double now_ns() {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1e9 + t.tv_nsec;
}

// ns per launch of `kernel` in `source` over n floats (out[i] from in[i]), `launches` times;
// `in` is filled with 0..n-1 and `out` copied to `result` (n floats) for the caller to check.
// Negative on a failed call: -(1 + the step that failed).
double etm_bench_metal_launch(const char* source, const char* kernel, int64_t n,
                              int64_t launches, float* result) {
  Lib lib = nullptr;
  Fn fn = nullptr;
  Tensor in = nullptr, out = nullptr;
  const int64_t stride = 1;
  const int32_t f32 = aoti_torch_dtype_float32(), mps = aoti_torch_device_type_mps();
  if (aoti_torch_mps_create_shader_library(source, &lib)) return -1;
  if (aoti_torch_mps_get_kernel_function(lib, kernel, &fn)) return -2;
  if (aoti_torch_empty_strided(1, &n, &stride, f32, mps, 0, &in)) return -3;
  if (aoti_torch_empty_strided(1, &n, &stride, f32, mps, 0, &out)) return -3;
  float *pin = nullptr, *pout = nullptr;
  aoti_torch_get_data_ptr(in, (void**)&pin);
  aoti_torch_get_data_ptr(out, (void**)&pout);
  for (int64_t i = 0; i < n; ++i) pin[i] = (float)i;
  int32_t failed = 0;
  std::function<void(Fn)> encode = [&](Fn f) {
    failed |= aoti_torch_mps_start_encoding(f);
    failed |= aoti_torch_mps_set_arg_tensor(f, 0, out);
    failed |= aoti_torch_mps_set_arg_tensor(f, 1, in);
    failed |= aoti_torch_mps_set_arg_int(f, 2, n);
    failed |= aoti_torch_mps_dispatch_single(f, (uint64_t)n);
  };
  double t0 = now_ns();
  for (int64_t i = 0; i < launches && !failed; ++i) {
    failed |= aoti_torch_mps_run_command_block(fn, aoti_torch_mps_shared_callback, &encode);
  }
  double dt = now_ns() - t0;
  for (int64_t i = 0; i < n; ++i) result[i] = pout[i];
  aoti_torch_delete_tensor_object(in);
  aoti_torch_delete_tensor_object(out);
  aoti_torch_mps_delete_shader_library(lib);
  return failed ? -4 : dt / (double)launches;
}

// ns per dispatch of the same kernel made straight on the MSL executor's entry from native
// code (no shim), `launches` times over `args` (the kernel's bound addresses), a 1-D grid of
// n threads in groups of `group`. Negative if a dispatch failed.
// etm_msl_launch (msl_abi.h): entry, loop entry (NULL: fibers), args, grid, group, workers
typedef int (*Dispatch)(void*, void*, void* const*, const uint64_t*, const uint64_t*, uint32_t,
                        char*, uint64_t);
double etm_bench_metal_executor(void* dispatch, void* entry, void* loop, void* const* args,
                                int64_t n, int64_t group, int64_t launches) {
  const uint64_t threads[3] = {(uint64_t)n, 1, 1}, g[3] = {(uint64_t)group, 1, 1};
  char err[600];
  double t0 = now_ns();
  for (int64_t i = 0; i < launches; ++i) {
    if (((Dispatch)dispatch)(entry, loop, args, threads, g, 1, err, sizeof(err)) != 0) return -1;
  }
  return (now_ns() - t0) / (double)launches;
}
}
