// The native half of the emulated Metal device's command blocks (shims/emulated_mps/mps_kernels.py)
// for a function the native launch path (mps_encoder.cpp) does not know.
// Compiled as part of the generated bridge source, inside its extern "C" block, after the
// bridge's globals (etm_calls, etm_last_unbound).
//
// The Metal wrapper passes a C++ std::function through void* and asks the runtime to call
// it back: aoti_torch_mps_run_command_block(fn, aoti_torch_mps_shared_callback, &wrapper).
// Both calls stay in C++ so the std::function (and any exception it throws) never crosses
// Python frames; Python only validates the function handle first.

struct AOTIMetalKernelFunctionOpaque;
typedef void (*etm_mps_block_callback)(AOTIMetalKernelFunctionOpaque*, void*);
typedef int32_t (*etm_mps_block_validate)(void*, void*, void*);

// the trampoline's body for aoti_torch_mps_run_command_block (see bridge_source.NATIVE_PATHS)
static int32_t etm_mps_run_command_block(void* func, void* callback, void* user_data,
                                         etm_mps_block_validate validate) {
  if (!validate) {
    etm_last_unbound = "aoti_torch_mps_run_command_block";
    return 1;
  }
  int32_t rc = validate(func, callback, user_data);  // Python: a live function, a callback
  if (rc != 0) return rc;
  // the emulated queue is synchronous: the block's dispatches have run when this returns
  ((etm_mps_block_callback)callback)((AOTIMetalKernelFunctionOpaque*)func, user_data);
  return 0;
}

// what the Metal wrapper passes as the callback: user_data is its std::function
ETM_EXPORT void aoti_torch_mps_shared_callback(AOTIMetalKernelFunctionOpaque* func,
                                               void* user_data) {
  __atomic_fetch_add(&etm_calls, 1, __ATOMIC_RELAXED);
  auto* wrapper = static_cast<std::function<void(AOTIMetalKernelFunctionOpaque*)>*>(user_data);
  if (wrapper && *wrapper) (*wrapper)(func);
}
