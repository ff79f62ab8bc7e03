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

#define ETM_MSL_ABI_VERSION 2
#define ETM_MSL_SIMD_WIDTH 32
// One SIMD lane's exchange slot: the widest value a SIMD operation moves (data + fill of a
// 4-component 64-bit vector).
#define ETM_MSL_SLOT_BYTES 64
// The most threadgroups a batch entry runs at once (etm_msl_batch below).
#define ETM_MSL_BATCH 8

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
// A kernel that never synchronises also has `void loop(void* const* args, const
// etm_msl_thread* group)`: it runs every thread of one threadgroup, whose fields `group`
// carries (tg_id, tg_size, dispatch_tg_size, grid_size, tgs_per_grid and the per-group
// counts), as one loop.
typedef void (*etm_msl_loop)(void* const* args, const etm_msl_thread* group);
// A split kernel whose only synchronising statement is c10's threadgroup_welford_reduce also
// has `void batch(void* const* args, const etm_msl_thread* groups, uint32_t count)`: the
// `count` (at most ETM_MSL_BATCH) threadgroups `groups` describe, run together. The library
// registers it for its loop entry when it is loaded (etm_msl_register_batch) and withdraws it
// when it is unloaded; the dispatcher then runs that loop entry's grid in batches.
typedef void (*etm_msl_batch)(void* const* args, const etm_msl_thread* groups, uint32_t count);
void etm_msl_register_batch(etm_msl_loop loop, etm_msl_batch batch);
void etm_msl_unregister_batch(etm_msl_loop loop);

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

// Called by a split kernel's entry (msl_split.py), which runs a threadgroup as loops over its
// threads between the statements that synchronise: runs one such statement for every thread of
// the threadgroup `group` describes as fibers, each calling `entry(closure, thread)`. A failure
// (a deadlock, divergent SIMD operations) ends the whole threadgroup with its message.
void etm_msl_fiber_phase(const etm_msl_thread* group, etm_msl_entry entry, void* const* closure);

// A split kernel's SIMD operations with the lanes in lockstep (msl_split.h's lockstep): until
// etm_msl_lockstep_end, this OS thread's SIMD operations do not block. Operation j of the call
// is answered with every lane's operand if j < pass (each recorded in pass j), records the
// caller's operand as lane `lane`'s if j == pass, and answers as if the lane were alone after;
// `active` are the lanes taking part. _end returns the operations the call made, or
// UINT32_MAX if an answer was not exact (an operation not every active lane recorded, lanes
// at operations of different kinds, more than 8 of them).
void etm_msl_lockstep(uint32_t pass, uint32_t lane, uint32_t active);
uint32_t etm_msl_lockstep_end(void);

// Called from Python: runs `entry` over the grid. threads/group are 3 sizes each.
// Returns 0, or nonzero with a message in err.
int etm_msl_dispatch(etm_msl_entry entry, void* const* args, const uint64_t* threads,
                     const uint64_t* group, char* err, uint64_t err_len);
// The same, with the kernel's loop entry (or NULL: fibers) and threadgroups spread over up to
// `workers` OS threads (the calling one included; 1: all on the calling thread).
int etm_msl_launch(etm_msl_entry entry, etm_msl_loop loop, void* const* args,
                   const uint64_t* threads, const uint64_t* group, uint32_t workers, char* err,
                   uint64_t err_len);
int etm_msl_abi_version(void);

// ---- the checker (ETMETAL_METAL_CHECK; msl_check.h, msl_check.cpp) -------------------------
// Only a checked build of a library calls these: its subscripts of device and threadgroup
// memory go through them. An unchecked library never references them.
#define ETM_MSL_READ 1u
#define ETM_MSL_WRITE 2u
// An access of `size` bytes at `addr` through [[buffer(buffer)]] (buffer < 0: a device pointer
// whose binding is found by address). Returns addr, or scratch memory when the access is
// outside the binding (the fault is recorded; the access touches nothing of the program).
void* etm_msl_check_device(const void* addr, uint32_t size, int32_t buffer, uint32_t flags,
                           uint32_t site);
// `array` (or NULL for a pointer): the declared array the subscript names, whose bounds the
// access must keep (an overrun could otherwise land in a neighbouring array).
void* etm_msl_check_threadgroup(const void* addr, uint32_t size, const void* array,
                                uint32_t flags, uint32_t site);
// A threadgroup array's declaration ran: its bytes get a shadow for this threadgroup.
void etm_msl_declare_threadgroup(const void* base, uint64_t size, uint32_t site);

enum etm_msl_fault_kind {
  ETM_FAULT_OOB_READ = 1,
  ETM_FAULT_OOB_WRITE,
  ETM_FAULT_TG_OOB_READ,
  ETM_FAULT_TG_OOB_WRITE,
  ETM_FAULT_UNINIT_READ,      // threadgroup bytes no thread of the threadgroup wrote
  ETM_FAULT_RACE_RAW,         // read of bytes another thread wrote since the last barrier
  ETM_FAULT_RACE_WAR,         // write of bytes another thread read since the last barrier
  ETM_FAULT_RACE_WAW,         // write of bytes another thread wrote since the last barrier
  ETM_FAULT_ALIAS,            // two bindings overlap in different ranges, one written
};

typedef struct etm_msl_fault {
  uint32_t kind;
  int32_t buffer;        // [[buffer(i)]]; threadgroup faults: -1 (the site names the array)
  int64_t offset;        // bytes from the start of the buffer / threadgroup array
  uint64_t extent;       // its size in bytes
  uint32_t size;         // the access's bytes (alias: 0, see overlap)
  uint32_t site;         // the access site (the library's site table)
  uint32_t tg[3];        // threadgroup_position_in_grid of the faulting thread
  uint32_t thread[3];    // its thread_position_in_threadgroup
  uint32_t other[3];     // races: the other thread; alias: [other buffer, 0, 0]
  uint32_t other_known;  // 0: several other threads (a race with more than one reader)
  uint32_t array_site;   // threadgroup faults: the array's declaration site
  uint64_t overlap;      // alias: overlapping bytes
  uint64_t count;        // faults of the same kind, memory and site (this is the first)
} etm_msl_fault;

typedef struct etm_msl_check_run {
  const uint64_t* extents;  // bytes of each args[i] (UINT64_MAX: unknown, not checked)
  uint32_t nargs;
  uint32_t max_faults;
  etm_msl_fault* faults;
  uint32_t nfaults;    // out: distinct faults recorded
  uint64_t dropped;    // out: faults not recorded (the table was full)
  uint64_t accesses;   // out: checked accesses
} etm_msl_check_run;

// etm_msl_dispatch with the checker on (the entry must come from a checked build).
int etm_msl_dispatch_checked(etm_msl_entry entry, void* const* args, const uint64_t* threads,
                             const uint64_t* group, etm_msl_check_run* run, char* err,
                             uint64_t err_len);
// Checked accesses this process has made (an unchecked dispatch adds none).
uint64_t etm_msl_checked_accesses(void);

#ifdef __cplusplus
}
#endif
