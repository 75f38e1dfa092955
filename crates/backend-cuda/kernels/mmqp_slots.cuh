// Where the pipelined batched matmuls (mmqp.cu) leave their sums, for them and for the kernels
// that read their outputs unmerged (the batched SwiGLU in mmqp.cu, the add + norm in fused.cu).
//
// A matmul's row blocks (MMQ_BLOCK_ROWS rows) are walked in stages, row block by row block,
// as units of work: block b of the grid takes units b share .. (b + 1) share (stream-K). A row
// block whose stages one grid block takes whole is written to `out` (plus the bias) by that
// block; one shared by several grid blocks gets their partial sums, in slot (grid block - the
// row block's first grid block) of `partial` (`values` = tokens n_out floats a slot), added
// in slot order (so results do not depend on timing).
#pragma once
#include "common.cuh"

#define MMQ_BLOCK_ROWS 128

__device__ __forceinline__ u32 mmqp_first_block(u32 row_block, u32 n_stages, u32 share) {
    return row_block * n_stages / share;
}
__device__ __forceinline__ u32 mmqp_last_block(u32 row_block, u32 n_stages, u32 share) {
    return ((row_block + 1) * n_stages - 1) / share;
}

// The grid blocks that share row `row`'s row block (1: it was written whole).
__device__ __forceinline__ u32 mmqp_slots(u32 row, u32 n_stages, u32 share) {
    const u32 row_block = row / MMQ_BLOCK_ROWS;
    return mmqp_last_block(row_block, n_stages, share) - mmqp_first_block(row_block, n_stages, share) + 1;
}

// Value i (of output row `row`) of a row block cut into `slots`: its partial sums in slot
// order plus bias[row] (nullptr: + 0, so -0 becomes +0 as with a bias), as mmqp_merge writes it.
__device__ __forceinline__ float mmqp_slot_sum(const float* __restrict__ partial, u64 values, u64 i, u32 slots,
                                               const float* __restrict__ bias, u32 row) {
    float sum = 0.0f;
    for (u32 s = 0; s < slots; s++) sum += __ldcg(partial + s * values + i);
    return __fadd_rn(sum, bias != nullptr ? bias[row] : 0.0f);
}

// Value i (of output row `row`) of a pipelined matmul whose merge has not run: `out` where the
// row block was written whole, else mmqp_slot_sum.
__device__ __forceinline__ float mmqp_merged(const float* out, const float* __restrict__ partial, u64 values, u64 i,
                                             u32 row, u32 n_stages, u32 share, const float* __restrict__ bias) {
    const u32 slots = mmqp_slots(row, n_stages, share);
    return slots == 1 ? out[i] : mmqp_slot_sum(partial, values, i, slots, bias, row);
}
