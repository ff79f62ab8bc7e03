// The C API of libetmetal_stock.so, for a program that links it (a Python-free runner):
// loading the library registers "MetalBackend" with libexecutorch; configure it once,
// set the trust policy, then load programs with ExecuTorch's own Program / Method.
#ifndef ETMETAL_STOCK_H
#define ETMETAL_STOCK_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

// 0 when "MetalBackend" was registered as the library was loaded (else ExecuTorch's Error)
int32_t etm_stock_registration(void);
// set up the native shims: dtype sizes, limits, libtorch's C shims from the libtorch_cpu
// at `libtorch` (torch's lib/libtorch_cpu.so; its SLEEF serves the .so's vector math);
// 0, or 1 with the reason in etm_stock_last_error
int32_t etm_stock_configure(const char* libtorch);
// trust every delegate's native code, or only those whose delegate digest (or, for a host
// delegate without an extern-node table, .so digest) is in `hashes` (comma-separated);
// ETMETAL_TRUST_NATIVE_CODE and ETMETAL_TRUSTED_BLOBS are read at each init as well
void etm_stock_set_policy(int32_t trust_native_code, const char* hashes);
// the message of the last failure ("" if none)
const char* etm_stock_last_error(void);

#ifdef __cplusplus
}  // extern "C"
#endif

#endif  // ETMETAL_STOCK_H
