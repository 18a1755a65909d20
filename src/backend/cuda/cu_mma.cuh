/*
 * cu_mma.cuh - the tensor cores' f16 step and its shared-memory loads, for
 * the quantized GEMMs (qmma.cu, moe_mma.cu).  Header-only device code.
 */
#ifndef PETREL_CU_MMA_CUH
#define PETREL_CU_MMA_CUH

#include "backend/cuda/cu_common.cuh"

/* The tensor cores' m16n8k16 step, f16 in, f32 sums (qmma.cu, moe_mma.cu):
 * a the A fragment (16 rows x 16 columns), b0 b1 the B fragment. */
__device__ __forceinline__ void cu_mma_f16(float c[4], const uint32_t a[4], uint32_t b0,
                                           uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, "
                 "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* Four 8x8 tiles of 16-bit values from shared memory (a lane's row address). */
__device__ __forceinline__ void cu_ldmatrix4(uint32_t r[4], const void *smem) {
    unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(s));
}

#endif
