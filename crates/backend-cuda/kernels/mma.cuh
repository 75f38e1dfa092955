// Tensor-core helpers shared by the mma.sync kernels (attention_mma.cu, mmq.cu).
#pragma once
#include "common.cuh"

// Four 8x8 b16 matrices from shared memory: lanes 8q .. 8q + 7 give the 16-byte rows of
// matrix q; lane 4 r + c receives elements (r, 2c .. 2c + 1) of each matrix.
__device__ __forceinline__ void load_matrix_x4(u32 (&r)[4], u32 address) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(address));
}

// load_matrix_x4 with each matrix transposed.
__device__ __forceinline__ void load_matrix_x4_trans(u32 (&r)[4], u32 address) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(address));
}

// Two floats as f16x2: `low` in bits 0..15.
__device__ __forceinline__ u32 pack_half2(float low, float high) {
    u32 packed;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(packed) : "f"(high), "f"(low));
    return packed;
}

// c += a · b for one 16x8x16 tile (a: 4 regs of f16x2, row-major; b: 2 regs, column-major).
// Fragment layout (lane = 4 g + t): a0 = (row g, k 2t..2t+1), a1 = (row g + 8, k 2t..2t+1),
// a2 = (row g, k 2t+8..2t+9), a3 = (row g + 8, k 2t+8..2t+9); b0 = (k 2t..2t+1, col g),
// b1 = (k 2t+8..2t+9, col g); c0..c1 = (row g, cols 2t, 2t+1), c2..c3 = (row g + 8, same).
__device__ __forceinline__ void mma_16816(float (&c)[4], const u32 (&a)[4], u32 b0, u32 b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
