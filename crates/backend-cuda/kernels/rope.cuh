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
