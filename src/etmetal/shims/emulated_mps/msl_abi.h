// The boundary between a compiled MSL library and the dispatcher (msl_dispatch.cpp).
//
// A library exports one entry per kernel, `void entry(void* const* args, const etm_msl_thread*)`:
// it unpacks the [[buffer(i)]] arguments from `args` and the thread-position attributes from
// the thread record, and calls the kernel once, for one thread. The dispatcher runs those
// entries as the threads of each threadgroup (fibers switched at barriers and SIMD operations);
// the library reaches back into it only through the three functions declared here.
#pragma once
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define ETM_MSL_ABI_VERSION 1
#define ETM_MSL_SIMD_WIDTH 32
// One SIMD lane's exchange slot: the widest value a SIMD operation moves (data + fill of a
// 4-component 64-bit vector).
#define ETM_MSL_SLOT_BYTES 64

typedef struct etm_msl_thread {
  uint32_t grid_pos[3];          // thread_position_in_grid
  uint32_t tg_pos[3];            // thread_position_in_threadgroup
  uint32_t tg_id[3];             // threadgroup_position_in_grid
  uint32_t tg_size[3];           // threads_per_threadgroup (the actual, possibly partial, size)
  uint32_t dispatch_tg_size[3];  // dispatch_threads_per_threadgroup (the requested size)
  uint32_t grid_size[3];         // threads_per_grid
  uint32_t tgs_per_grid[3];      // threadgroups_per_grid
  uint32_t index_in_tg;          // thread_index_in_threadgroup
  uint32_t lane;                 // thread_index_in_simdgroup
  uint32_t simd_index;           // simdgroup_index_in_threadgroup
  uint32_t simds_per_tg;         // simdgroups_per_threadgroup
  uint32_t simd_size;            // threads_per_simdgroup (32)
  uint32_t dispatch_simds_per_tg;  // dispatch_simdgroups_per_threadgroup
  uint32_t quad_index;           // quadgroup_index_in_threadgroup
  uint32_t lane_in_quad;         // thread_index_in_quadgroup
  uint32_t quads_per_tg;         // quadgroups_per_threadgroup
} etm_msl_thread;

typedef void (*etm_msl_entry)(void* const* args, const etm_msl_thread* thread);

// What a SIMD operation sees once every participating lane has arrived: the slots of all 32
// lanes (ETM_MSL_SLOT_BYTES apart) and which of them took part.
typedef struct etm_msl_exchange {
  const unsigned char* slots;
  uint32_t active;  // bit i: lane i took part
  uint32_t lane;    // the caller's lane
} etm_msl_exchange;

// Called by a kernel thread (inside the dispatcher's fibers).
void etm_msl_threadgroup_barrier(void);
// Publishes `size` bytes from `value` as this lane's slot and waits for the SIMD group's
// operation `key` (an operation kind and operand size; lanes of one group that meet at
// different keys are a divergence error).
etm_msl_exchange etm_msl_simd_exchange(const void* value, uint32_t size, uint32_t key);

// Called from Python: runs `entry` over the grid. threads/group are 3 sizes each.
// Returns 0, or nonzero with a message in err.
int etm_msl_dispatch(etm_msl_entry entry, void* const* args, const uint64_t* threads,
                     const uint64_t* group, char* err, uint64_t err_len);
int etm_msl_abi_version(void);

#ifdef __cplusplus
}
#endif
