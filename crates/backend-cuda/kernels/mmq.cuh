// What the batched decode kernels (mmq.cu: f16 tensor cores, mmq8.cu: int8) share: the
// block shape (4 warps of 32 weight rows, tiles of 8 NT token rows) and the end of a kernel
// (the accumulators written, or merged across ranges of the rows' length).
#pragma once
#include "dequant.cuh"
#include "mma.cuh"
#include "mmqp_slots.cuh"  // MMQ_BLOCK_ROWS

#define MMQ_THREADS 128
#define MMQ_WARP_ROWS 32

// The block's weight bytes never come from an earlier kernel: asks for them in L2 (whole
// 128-byte lines of each of the block's rows over k_begin..k_end) while that kernel ends,
// then waits for it. Every thread of the block calls it.
__device__ __forceinline__ void mmq_prefetch_then_wait(const u8* w, u64 row_bytes, u32 n_in, u32 n_out, u32 k_begin,
                                                       u32 k_end) {
    pdl_launch_dependents();
    const u64 first = (u64)k_begin * row_bytes / n_in, last = ((u64)k_end * row_bytes + n_in - 1) / n_in;
    const u64 lines = (last - (first & ~127ull) + 127) / 128;
    const u32 block_row0 = blockIdx.x * MMQ_BLOCK_ROWS;
    for (u64 i = threadIdx.x; i < MMQ_BLOCK_ROWS * lines; i += MMQ_THREADS) {
        const u32 row = min(block_row0 + (u32)(i / lines), n_out - 1);
        asm volatile("prefetch.global.L2 [%0];" ::"l"(w + row * row_bytes + (first & ~127ull) + 128 * (i % lines)));
    }
    pdl_wait();
}

// Knob (RUNIT_CUDA_DEFINES): each warp asks L1 for its rows' bytes of the next chunk while
// it works on this one, so the unpacking loads of the next chunk hit L1 instead of waiting
// on L2. Measured on the H200 (docs/perf-cuda.md, session 26): +3% for the int8 kernels at
// 64 rows, nothing for the f16 kernels at 16 rows (which do not call it).
#ifndef MMQ_PREFETCH_L1
#define MMQ_PREFETCH_L1 1
#endif

// The bytes of elements k0 .. k0 + len of the warp's MMQ_WARP_ROWS rows from row0, in
// L1 (whole 128-byte lines). Every lane of the warp calls it.
__device__ __forceinline__ void mmq_prefetch_rows_l1(const u8* w, u64 row_bytes, u32 n_in, u32 n_out, u32 row0,
                                                     u32 k0, u32 len) {
#if MMQ_PREFETCH_L1
    const int lane = threadIdx.x & 31;
    const u64 first = (u64)k0 * row_bytes / n_in, last = ((u64)(k0 + len) * row_bytes + n_in - 1) / n_in;
    const u32 lines = (u32)((last - (first & ~127ull) + 127) / 128);
    for (u32 i = lane; i < MMQ_WARP_ROWS * lines; i += 32) {
        const u32 row = min(row0 + i / lines, n_out - 1);
        asm volatile("prefetch.global.L1 [%0];" ::"l"(w + row * row_bytes + (first & ~127ull) + 128 * (i % lines)));
    }
#endif
}

// Writes the accumulators (C fragments: rows g and g + 8 of each m16 tile, tokens 2t and
// 2t + 1 of each 8-token tile) to target[token][row], plus bias[row] when given.
template <int NT>
__device__ __forceinline__ void mmq_store(const float (&acc)[2][NT][4], float* target, const float* bias, u32 row0,
                                          u32 token0, u32 tokens, u32 n_out, int g, int t) {
#pragma unroll
    for (int m = 0; m < 2; m++) {
#pragma unroll
        for (int half = 0; half < 2; half++) {
            const u32 row = row0 + 16 * m + 8 * half + g;
            if (row >= n_out) continue;
            const float add = bias != nullptr ? bias[row] : 0.0f;
#pragma unroll
            for (int n = 0; n < NT; n++) {
#pragma unroll
                for (int c = 0; c < 2; c++) {
                    const u32 token = token0 + 8 * n + 2 * t + c;
                    if (token < tokens) target[(u64)token * n_out + row] = acc[m][n][2 * half + c] + add;
                }
            }
        }
    }
}

// The end of a batched kernel: with one range the block writes its sums (plus `bias`); with
// several it writes its range's partial sums, which `mmq_merge` (mmq.cu, launched next) adds
// in range order over the whole device, so results do not depend on timing.
template <int NT>
__device__ __forceinline__ void mmq_finish(const float (&acc)[2][NT][4], float* __restrict__ out,
                                           const float* __restrict__ bias, float* __restrict__ partial, u32 row0,
                                           u32 token0, u32 tokens, u32 n_out, int g, int t) {
    if (gridDim.z == 1) {
        mmq_store<NT>(acc, out, bias, row0, token0, tokens, n_out, g, t);
    } else {
        const u64 values = (u64)tokens * n_out;
        mmq_store<NT>(acc, partial + blockIdx.z * values, nullptr, row0, token0, tokens, n_out, g, t);
    }
}
