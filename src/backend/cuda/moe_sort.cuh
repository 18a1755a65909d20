/*
 * moe_sort.cuh - the pairs of a matmul by expert id grouped by expert on
 * the device, shared by moe.cu's prepare launch and moe_mma.cu's plan:
 * one block counts the (row, slot) pairs per expert in shared memory,
 * thread 0 scans the counts (a few hundred experts) and lists what its
 * caller wants of them, then each pair is placed at its expert's cursor.
 * The order within an expert follows the atomics; no result depends on
 * it, since each pair is computed on its own.  Header-only device code.
 */
#ifndef PETREL_MOE_SORT_CUH
#define PETREL_MOE_SORT_CUH

#include "backend/cuda/cu_common.cuh"

/* order[pairs] (pairs by expert), first[E + 1] (each expert's first
 * place); with used, used[0] = the experts chosen and used[1..] their ids;
 * with tiles, *ntiles = the tiles of `tile` pairs and tiles[2 i], [2 i + 1]
 * = tile i's expert and first place.  cnt: 2 E ints of shared memory.
 * Every thread of the block calls it; ids out of range are left out. */
__device__ __forceinline__ void moe_sort_pairs(int32_t *order, int32_t *first, int32_t *used,
                                               int32_t *tiles, int32_t *ntiles, int tile,
                                               int32_t *cnt, const int32_t *ids, int pairs,
                                               int E) {
    int32_t *cur = cnt + E;
    for (int e = threadIdx.x; e < E; e += blockDim.x) cnt[e] = 0;
    __syncthreads();
    for (int i = threadIdx.x; i < pairs; i += blockDim.x) {
        int e = ids[i];
        if (e >= 0 && e < E) atomicAdd(&cnt[e], 1);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        int32_t run = 0, nu = 0, nt = 0;
        for (int e = 0; e < E; e++) {
            first[e] = run, cur[e] = run;
            if (used && cnt[e]) used[1 + nu++] = e;
            if (tiles)
                for (int p = 0; p < cnt[e]; p += tile) tiles[2 * nt] = e, tiles[2 * nt + 1] = run + p, nt++;
            run += cnt[e];
        }
        first[E] = run;
        if (used) used[0] = nu;
        if (ntiles) *ntiles = nt;
    }
    __syncthreads();
    for (int i = threadIdx.x; i < pairs; i += blockDim.x) {
        int e = ids[i];
        if (e >= 0 && e < E) order[atomicAdd(&cur[e], 1)] = i;
    }
}

#endif
