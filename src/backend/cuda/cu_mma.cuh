/*
 * cu_mma.cuh - the tensor cores' m16n8k16 step (mma.sync, f32 sums,
 * sm_80+), its operands and its shared-memory loads, for the kernels that
 * use them (attention.cu, attn_kvq.cu, qmma.cu, moe_mma.cu).  Header-only
 * device code.
 */
#ifndef PETREL_CU_MMA_CUH
#define PETREL_CU_MMA_CUH

#include "backend/cuda/cu_common.cuh"

/* Operands are 16-bit (T = CU_F16 or CU_BF16); a kernel that needs f32
 * accuracy splits x into a 16-bit high part and the remainder (x = hi +
 * lo) and multiplies both.  Fragment layouts (PTX ISA, m16n8k16), with
 * g = lane / 4 and t = lane % 4: A (16x16, row-major) regs a[0] = row g,
 * cols 2t..2t+1; a[1] = row g + 8, same cols; a[2] = row g, cols 2t+8..
 * 2t+9; a[3] = row g + 8, cols 2t+8..2t+9.  B (16x8): b0 = rows 2t..2t+1,
 * col g; b1 = rows 2t+8..2t+9, col g.  C (16x8 f32): c[0..1] = row g, cols
 * 2t..2t+1; c[2..3] = row g + 8, same cols.  The lower index sits in a
 * register's low 16 bits. */
template <int T> __device__ __forceinline__ uint32_t pack2(float a, float b) {
    if (T == CU_BF16) {
        __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
        return *(uint32_t *)&h;
    }
    __half2 h = __floats2half2_rn(a, b);
    return *(uint32_t *)&h;
}

/* hi = (a, b) rounded to 16 bits; lo = what rounding left out. */
template <int T> __device__ __forceinline__ void split2(float a, float b, uint32_t &hi, uint32_t &lo) {
    hi = pack2<T>(a, b);
    float ha, hb;
    if (T == CU_BF16) {
        ha = __uint_as_float(hi << 16);
        hb = __uint_as_float(hi & 0xffff0000u);
    } else {
        float2 f = __half22float2(*(__half2 *)&hi);
        ha = f.x, hb = f.y;
    }
    lo = pack2<T>(a - ha, b - hb);
}

/* c += a b on the tensor cores: a the A fragment, b0 b1 the B fragment. */
template <int T>
__device__ __forceinline__ void mma16816(float *c, const uint32_t *a, uint32_t b0, uint32_t b1) {
    if (T == CU_BF16)
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, "
                     "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    else
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
