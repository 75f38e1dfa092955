// Greedy picks from logits (Backend::greedy_pick): per row of `width` logits, the index of the
// largest value (the first among equals; NaNs never win; 0 when every value is NaN) and that
// choice's log-probability -ln(sum(exp(l - max))) over the non-NaN values, so that greedy decoding downloads two
// numbers per row instead of the row. Two phases: slices of the row in parallel, then one warp per row.
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

// The warp's best candidate (as `better` orders them), in every lane.
__device__ __forceinline__ void warp_best(float& value, u32& index) {
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) {
        const float other_value = __shfl_xor_sync(0xffffffffu, value, offset);
        const u32 other_index = __shfl_xor_sync(0xffffffffu, index, offset);
        better(value, index, other_value, other_index);
    }
}

// Phase 1: block (part, row) scans its slice of `chunk` logits of the row and writes the
// slice's pick (value, index: the first largest, NaNs never win; (-inf, none) for a slice of
// NaNs) and the slice's sum of exp(l - slice max) over its non-NaN values to
// partials[row][part] = {value, index bits, sum}. Many blocks per row: one block per row was
// latency-bound (95 us for a 151936-wide row on an H200).
extern "C" __global__ void greedy_pick_partial_f32(const float* __restrict__ logits, u32 width, u32 rows, u32 parts,
                                                   u32 chunk, float* __restrict__ partials) { pdl_start();
    __shared__ float values[32];
    __shared__ u32 indices[32];
    __shared__ float scratch[32];
    const u32 part = blockIdx.x, row = blockIdx.y;
    if (row >= rows || part >= parts) return;
    const float* l = logits + (u64)row * width;
    const u32 begin = part * chunk;
    const u32 end = min(width, begin + chunk);
    float best = PICK_NEG_INF;
    u32 index = 0xffffffffu;
    for (u32 i = begin + threadIdx.x; i < end; i += blockDim.x) {
        const float v = l[i];
        if (v > best || (index == 0xffffffffu && v == best)) {
            best = v;
            index = i;
        }
    }
    warp_best(best, index);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) {
        values[warp] = best;
        indices[warp] = index;
    }
    __syncthreads();
    const int warps = (blockDim.x + 31) >> 5;
    best = lane < warps ? values[lane] : PICK_NEG_INF;
    index = lane < warps ? indices[lane] : 0xffffffffu;
    warp_best(best, index);
    float sum = 0.0f;
    if (isfinite(best)) {
        for (u32 i = begin + threadIdx.x; i < end; i += blockDim.x) {
            const float v = l[i];
            if (v == v) sum += expf(v - best);  // a NaN adds nothing, as on the host
        }
    }
    sum = block_sum(sum, scratch);
    if (threadIdx.x == 0) {
        float* out = partials + ((u64)row * parts + part) * 3;
        out[0] = best;
        out[1] = __int_as_float((int)index);
        out[2] = sum;
    }
}

// Phase 2: one warp per row combines the row's parts: the first largest value wins (parts
// cover increasing index ranges), and the log-probability is -ln(sum_p s_p * exp(m_p - max))
// over the parts with a finite maximum (NaN when the row's maximum is not finite). The row's
// id is 0 when every logit is NaN.
extern "C" __global__ void greedy_pick_combine_f32(const float* __restrict__ partials, u32 parts, u32 rows,
                                                   u32* __restrict__ ids, float* __restrict__ logprobs) { pdl_start();
    const u32 row = blockIdx.x;
    if (row >= rows) return;
    const float* p = partials + (u64)row * parts * 3;
    float best = PICK_NEG_INF;
    u32 index = 0xffffffffu;
    for (u32 i = threadIdx.x; i < parts; i += 32) {
        const float v = p[3 * i];
        const u32 at = (u32)__float_as_int(p[3 * i + 1]);
        if (at != 0xffffffffu) better(best, index, v, at);
    }
    warp_best(best, index);
    float sum = 0.0f;
    if (isfinite(best)) {
        for (u32 i = threadIdx.x; i < parts; i += 32) {
            const float m = p[3 * i];
            if (isfinite(m)) sum += p[3 * i + 2] * expf(m - best);
        }
    }
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
    if (threadIdx.x == 0) {
        ids[row] = index == 0xffffffffu ? 0u : index;
        logprobs[row] = isfinite(best) ? -logf(sum) : PICK_NAN;
    }
}
