// Rotary position embedding in place on x ([tokens, heads, head_dim]), as the CPU reference
// (ggml's rope) computes it: the angle of pair i at position p is
// freq_scale * (θᵢ / factor[i]) with θ₀ = p and θᵢ₊₁ = θᵢ * theta_scale rounded to f32 at
// every step (theta_scale = base^(-2/rotary_dim), computed on the host), mixed with the
// unscaled angle by YaRN's ramp (weight ext_factor, ends ramp_low/ramp_high; ext_factor 0:
// none) and cos and sin multiplied by magnitude (runit_backend::RopeCorrections). Normal style
// rotates (x[2i], x[2i+1]), NEOX style (x[i], x[i + rotary_dim/2]); dims past rotary_dim
// are left alone. Positions come from the step buffer.
//
// Launch: one block per token, any block size; dynamic shared memory holds rotary_dim floats
// (cos and sin of each pair).
#include "common.cuh"

extern "C" __global__ void rope_f32(float* x, const i32* step, const float* factors, u32 has_factors, u32 heads,
                                    u32 head_dim, u32 rotary_dim, float theta_scale, float freq_scale, float ext_factor,
                                    float magnitude, float ramp_low, float ramp_high, u32 neox,
                                    u32 tokens) { pdl_start();
    extern __shared__ float angles[];  // [pairs][2]: cos, sin
    const StepHeader* h = (const StepHeader*)step;
    const u32 token = blockIdx.x;
    if (token >= tokens || (i32)token >= h->tokens) return;
    const u32 pairs = rotary_dim / 2;
    const float position = (float)(u32)step[h->positions + token];
    for (u32 pair = threadIdx.x; pair < pairs; pair += blockDim.x) {
        float theta = position;
        for (u32 i = 0; i < pair; ++i) theta = __fmul_rn(theta, theta_scale);
        const float factor = has_factors ? factors[pair] : 1.0f;
        const float extrapolated = __fdiv_rn(theta, factor);
        float angle = __fmul_rn(freq_scale, extrapolated);
        if (ext_factor != 0.0f) {
            const float y = __fdiv_rn((float)pair - ramp_low, fmaxf(0.001f, ramp_high - ramp_low));
            const float mix = __fmul_rn(1.0f - fminf(1.0f, fmaxf(0.0f, y)), ext_factor);
            angle = fmaf(angle, 1.0f - mix, __fmul_rn(extrapolated, mix));
        }
        float s, c;
        sincosf(angle, &s, &c);
        angles[2 * pair] = __fmul_rn(c, magnitude);
        angles[2 * pair + 1] = __fmul_rn(s, magnitude);
    }
    __syncthreads();
    float* row = x + (u64)token * heads * head_dim;
    for (u32 index = threadIdx.x; index < heads * pairs; index += blockDim.x) {
        const u32 head = index / pairs, pair = index % pairs;
        float* values = row + (u64)head * head_dim;
        const u32 first = neox ? pair : 2 * pair;
        const u32 second = neox ? pair + pairs : 2 * pair + 1;
        const float x0 = values[first], x1 = values[second];
        const float c = angles[2 * pair], s = angles[2 * pair + 1];
        // The CPU fuses the first product of each output into a multiply-add (as gcc does).
        values[first] = fmaf(x0, c, -__fmul_rn(x1, s));
        values[second] = fmaf(x0, s, __fmul_rn(x1, c));
    }
}
