/* The vector transposes behind the native strided copy (strided_copy.c).
 *
 * etm_transpose_tiles(d, s, item, bn, an, bd, as, stream) moves d[i*bd + j] = s[j*as + i]
 * (i < bn, j < an) for 1-, 2-, 4- and 8-byte elements through register micro-tiles and
 * returns how many leading rows it did; the caller walks the rest (all of them off x86-64).
 */
#ifndef ETMETAL_TRANSPOSE_KERNELS_H
#define ETMETAL_TRANSPOSE_KERNELS_H

#include <stddef.h>
#include <stdint.h>

int64_t etm_transpose_tiles(void* d, const void* s, size_t item, int64_t bn, int64_t an,
                            int64_t bd, int64_t as, int stream);

/* the same storing non-temporally, whole 64-byte lines at a time (transpose_stream.c);
   returns bn, or 0 when the element size is not supported here */
int64_t etm_transpose_streamed(void* d, const void* s, size_t item, int64_t bn, int64_t an,
                               int64_t bd, int64_t as, int avx2);

/* bytes from which copies store non-temporally (a quarter of the last-level cache) */
int64_t etm_stream_threshold(void);
/* transposes stream only when their rows span this many bytes of each source column */
int64_t etm_stream_min_rows_bytes(void);
/* the tests move the threshold to reach the streaming path with small tensors */
void etm_set_stream_threshold(int64_t bytes);

#endif
