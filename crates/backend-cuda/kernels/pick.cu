// Greedy picks from logits (Backend::greedy_pick): per row of `width` logits, the index of the
// largest value (the first among equals; NaNs never win; 0 when every value is NaN) and that
// choice's log-probability -ln(sum(exp(l - max))) over the non-NaN values, so that greedy decoding downloads two
// numbers per row instead of the row. One block of up to 1024 threads per row.
#include "common.cuh"

#define PICK_NEG_INF (-__int_as_float(0x7f800000))
#define PICK_NAN __int_as_float(0x7fc00000)

// (value, index) of the better of two candidates: the larger value, the lower index among
// equal values. A thread with no candidate yet holds (-inf, 0xffffffff).
__device__ __forceinline__ void better(float& value, u32& index, float other_value, u32 other_index) {
    if (other_value > value || (other_value == value && other_index < index)) {
        value = other_value;
        index = other_index;
    }
}

extern "C" __global__ void greedy_pick_f32(const float* __restrict__ logits, u32 width, u32 rows,
                                           u32* __restrict__ ids, float* __restrict__ logprobs) {
    __shared__ float values[32];
    __shared__ u32 indices[32];
    __shared__ float scratch[32];
    const u32 row = blockIdx.x;
    if (row >= rows) return;
    const float* l = logits + (u64)row * width;
    float best = PICK_NEG_INF;
    u32 index = 0xffffffffu;
    for (u32 i = threadIdx.x; i < width; i += blockDim.x) {
        const float v = l[i];
        if (v > best || (index == 0xffffffffu && v == best)) {
            best = v;
            index = i;
        }
    }
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) {
        const float other_value = __shfl_xor_sync(0xffffffffu, best, offset);
        const u32 other_index = __shfl_xor_sync(0xffffffffu, index, offset);
        better(best, index, other_value, other_index);
    }
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) {
        values[warp] = best;
        indices[warp] = index;
    }
    __syncthreads();
    const int warps = (blockDim.x + 31) >> 5;
    best = lane < warps ? values[lane] : PICK_NEG_INF;
    index = lane < warps ? indices[lane] : 0xffffffffu;
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) {
        const float other_value = __shfl_xor_sync(0xffffffffu, best, offset);
        const u32 other_index = __shfl_xor_sync(0xffffffffu, index, offset);
        better(best, index, other_value, other_index);
    }
    // Every thread now holds the row's pick.
    float sum = 0.0f;
    if (isfinite(best)) {
        for (u32 i = threadIdx.x; i < width; i += blockDim.x) {
            const float v = l[i];
            if (v == v) sum += expf(v - best);  // a NaN adds nothing, as on the host
        }
    }
    sum = block_sum(sum, scratch);
    if (threadIdx.x == 0) {
        ids[row] = index == 0xffffffffu ? 0u : index;
        logprobs[row] = isfinite(best) ? -logf(sum) : PICK_NAN;
    }
}
