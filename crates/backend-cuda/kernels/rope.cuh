// One rotary pair rotated in place as rope_f32 (rope.cu) rotates it without YaRN's corrections
// (ext_factor 0, magnitude 1), the angle computed by the calling thread: pair `pair` of the
// head at `values`, at `position`. Shared by the fused kernels that rotate queries and keys
// before writing the cache (fused.cu's rope_kv_write_*, turbo.cu's rope_kv_write_turbo).
// Every product and multiply-add is explicit, so modules compiled with --fmad=false (turbo.cu)
// rotate alike.
#pragma once
#include "common.cuh"

__device__ __forceinline__ void rope_pair(float* values, u32 pair, float position, const float* factors,
                                          u32 has_factors, u32 rotary_dim, float theta_scale, float freq_scale,
                                          u32 neox) {
    const u32 pairs = rotary_dim / 2;
    float theta = position;
    for (u32 i = 0; i < pair; ++i) theta = __fmul_rn(theta, theta_scale);
    const float factor = has_factors ? factors[pair] : 1.0f;
    const float angle = __fmul_rn(freq_scale, __fdiv_rn(theta, factor));
    float s, c;
    sincosf(angle, &s, &c);
    const u32 first = neox ? pair : 2 * pair;
    const u32 second = neox ? pair + pairs : 2 * pair + 1;
    const float x0 = values[first], x1 = values[second];
    // The CPU fuses the first product of each output into a multiply-add (as gcc does).
    values[first] = fmaf(x0, c, -__fmul_rn(x1, s));
    values[second] = fmaf(x0, s, __fmul_rn(x1, c));
}

// The rotation part of the one-launch RoPE + cache write kernels over caches written a row at a
// time (turbo.cu's rope_kv_write_turbo, kv.cu's rope_kv_write_blocks): grid.x = rows,
// grid.y = q_heads + 2. Block y < q_heads rotates head y of row x of q ([tokens, q_heads,
// head_dim]) and returns true: it is done. Block q_heads rotates every head of row x of k
// ([tokens, width]) in place, synchronized so that the block then reads the rotated row; block
// q_heads + 1 rotates nothing. Rows past `tokens` are not rotated. Uniform over the block.
__device__ __forceinline__ bool rope_qk_rows(float* q, float* k, const i32* step, const float* factors,
                                             u32 has_factors, u32 q_heads, u32 k_heads, u32 head_dim,
                                             u32 rotary_dim, float theta_scale, float freq_scale, u32 neox,
                                             u32 tokens, u32 width) {
    const StepHeader* h = (const StepHeader*)step;
    const u32 token = blockIdx.x, slot = blockIdx.y, pairs = rotary_dim / 2;
    const bool rotate = token < tokens && (i32)token < h->tokens;
    const float position = rotate ? (float)(u32)step[h->positions + token] : 0.0f;
    if (slot < q_heads) {
        if (!rotate) return true;
        float* values = q + ((u64)token * q_heads + slot) * head_dim;
        for (u32 pair = threadIdx.x; pair < pairs; pair += blockDim.x)
            rope_pair(values, pair, position, factors, has_factors, rotary_dim, theta_scale, freq_scale, neox);
        return true;
    }
    if (slot == q_heads && rotate) {
        float* row = k + (u64)token * width;
        for (u32 i = threadIdx.x; i < k_heads * pairs; i += blockDim.x)
            rope_pair(row + (u64)(i / pairs) * head_dim, i % pairs, position, factors, has_factors, rotary_dim,
                      theta_scale, freq_scale, neox);
        __syncthreads();  // the rotated row, written by this block's threads, is read next
    }
    return false;
}
