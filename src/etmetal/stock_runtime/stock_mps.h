// The emulated Metal device's load-time shims in C, for the stock runtime (stock_mps.cpp):
// shader libraries from the stock shader index (shims/emulated_mps/stock_msl.py), kernel
// functions registered with the bridge's launch path (mps_encoder.cpp), and the sticky
// device error the Metal wrapper cannot see.
#ifndef ETMETAL_STOCK_MPS_H
#define ETMETAL_STOCK_MPS_H

#include <stdint.h>

#ifdef __cplusplus
#include <string>
extern "C" {
#endif

// the bodies of the trampoline's aoti_torch_mps_{create,delete}_shader_library and
// aoti_torch_mps_get_kernel_function (build.py); 0 or 1 (the message is the sticky error)
int32_t etm_stock_mps_create_library(const char* source, void** library);
int32_t etm_stock_mps_delete_library(void* library);
int32_t etm_stock_mps_kernel_function(void* library, const char* name, void** function);
// etm_mps_fail: the first failure of an execute is kept (the wrapper ignores return codes)
void etm_stock_mps_fail(const char* shim, const char* message);
// where compiled libraries are found (the etmetal cache root), what built them (the
// toolchain digest, stock_msl.toolchain_digest) and the Python that compiles a missing one
// ("" or NULL: none, a miss is an error); threadgroups run over `workers` OS threads
int32_t etm_stock_configure_msl(const char* cache_root, const char* toolchain,
                                const char* python, uint32_t workers);
// shader libraries this process loaded, and compiles it ran (tests)
int64_t etm_stock_mps_libraries(void);
int64_t etm_stock_mps_compiles(void);

#ifdef __cplusplus
}  // extern "C"

namespace etm_stock {
// the sticky error since the last take ("" if none), cleared
std::string take_mps_error();
// the device's settings for the stock runtime (called by etm_stock_configure)
void configure_mps_device();
}  // namespace etm_stock
#endif

#endif  // ETMETAL_STOCK_MPS_H
