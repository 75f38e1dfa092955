// Activation quantization of the decode matvec, rounded exactly as ggml-cpu's x86 build
// quantizes the activation side of a matmul, so integer dot products equal the CPU's:
//   mode 0 (weights paired with Q8_0: Q4_0, Q5_0, Q8_0, IQ4_NL): q = round_even(x * 127 / amax),
//          d = f16(amax / 127), s = d * sum(q);
//   mode 1 (Q8_1: Q4_1, Q5_1): as mode 0, but s = f16(amax / 127 * sum(q)) (unrounded d);
//   mode 2 (Q8_K: K-quants, IQ4_XS): one scale per 256 values, d = max / -127 with max the
//          signed value of largest magnitude, q = min(127, round_even(x * -127 / max)), written
//          into each of the 8 blocks of 32 with s = d * sum(q of that block).
// Layout: aq [n] int8 and ads [n / 32] (d, s) pairs. Used by quantize_q8_cpu (convert.cu) and
// by the matvec kernels that quantize their input into shared memory (matvec.cuh).
#pragma once
#include "dequant.cuh"

// The Q8_K scale search of quantize_row_q8_K over 256 values held by one warp, lane l's
// values l*8 .. l*8+7 in v: every lane gets the signed value of largest magnitude (the first
// of equal magnitudes, as on the CPU), or 0 when all are 0.
__device__ __forceinline__ float q8k_max_of(const float (&v)[8], int lane) {
    float amax = 0.0f, max = 0.0f;
    int index = 1 << 30;
#pragma unroll
    for (int k = 0; k < 8; k++) {
        if (fabsf(v[k]) > amax) {
            amax = fabsf(v[k]);
            max = v[k];
            index = lane * 8 + k;
        }
    }
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) {
        const float other_amax = __shfl_xor_sync(0xffffffffu, amax, offset);
        const float other_max = __shfl_xor_sync(0xffffffffu, max, offset);
        const int other_index = __shfl_xor_sync(0xffffffffu, index, offset);
        if (other_amax > amax || (other_amax == amax && other_index < index)) {
            amax = other_amax;
            max = other_max;
            index = other_index;
        }
    }
    return max;
}

// quantize_row_q8_K of 256 values held by one warp (v as in q8k_max_of): lane l's quants of
// values l*8 .. l*8+7 into q, the block scale d returned (0 with zero quants for an all-zero
// group).
__device__ __forceinline__ float q8k_quants_of(const float (&v)[8], int lane, int q[8]) {
    const float max = q8k_max_of(v, lane);
    const float iscale = max != 0.0f ? -127.0f / max : 0.0f;
#pragma unroll
    for (int k = 0; k < 8; k++) q[k] = max != 0.0f ? min(127, __float2int_rn(iscale * v[k])) : 0;
    return max != 0.0f ? 1.0f / iscale : 0.0f;
}

// q8k_quants_of the 256 values at src (lane l loads values l*8 .. l*8+7).
__device__ __forceinline__ float q8k_group_quants(const float* __restrict__ src, int lane, int q[8]) {
    float v[8];
#pragma unroll
    for (int k = 0; k < 8; k++) v[k] = src[lane * 8 + k];
    return q8k_quants_of(v, lane, q);
}

// Values [0, n) of x (n a multiple of 32, of 256 for mode 2), by warps warp_id, warp_id +
// warps, ...: each warp takes whole blocks of 32 (mode 0/1) or groups of 256 (mode 2). Every
// lane of a participating warp must call it.
__device__ __forceinline__ void quantize_q8_cpu_range(const float* __restrict__ x, i8* __restrict__ aq,
                                                      float2* __restrict__ ads, u64 n, u32 mode, u64 warp_id,
                                                      u64 warps) {
    const int lane = threadIdx.x & 31;
    if (mode < 2) {
        for (u64 block = warp_id; block < n / 32; block += warps) {
            const float v = x[block * 32 + lane];
            const float amax = warp_max(fabsf(v));
            const float d = amax / 127.0f;
            const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
            const int q = __float2int_rn(v * id);
            aq[block * 32 + lane] = (i8)q;
            int sum = q;
#pragma unroll
            for (int offset = 16; offset > 0; offset >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
            if (lane == 0) {
                const float d16 = half_to_float(float_to_half(d));
                const float s = mode == 0 ? d16 * (float)sum : half_to_float(float_to_half(d * (float)sum));
                ads[block] = make_float2(d16, s);
            }
        }
        return;
    }
    for (u64 group = warp_id; group < n / 256; group += warps) {
        int q[8];
        const float d = q8k_group_quants(x + group * 256, lane, q);
        int sum = 0;
#pragma unroll
        for (int k = 0; k < 8; k++) {
            aq[group * 256 + lane * 8 + k] = (i8)q[k];
            sum += q[k];
        }
        // Lanes 4b .. 4b+3 hold block b of 32.
        sum += __shfl_xor_sync(0xffffffffu, sum, 1);
        sum += __shfl_xor_sync(0xffffffffu, sum, 2);
        if ((lane & 3) == 0) ads[group * 8 + lane / 4] = make_float2(d, d * (float)sum);
    }
}

// One warp's unit of activation_f16_cpu (convert.cu; also written by fused.cu's add + norm) in the q8 modes (0, 1: 32 values; 2: 256 values):
// values unit * 32 (or 256) .. of x to out.
__device__ __forceinline__ void activation_f16_unit(const float* x, u16* __restrict__ out, u64 unit, u32 mode,
                                                    int lane) {
    if (mode < 2) {
        const float v = x[unit * 32 + lane];
        const float amax = warp_max(fabsf(v));
        const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
        const float d16 = half_to_float(float_to_half(amax / 127.0f));
        out[unit * 32 + lane] = float_to_half(d16 * (float)__float2int_rn(v * id));
        return;
    }
    int q[8];
    const float d = q8k_group_quants(x + unit * 256, lane, q);
#pragma unroll
    for (int k = 0; k < 8; k++) out[unit * 256 + lane * 8 + k] = float_to_half(d * (float)q[k]);
}

// activation_f16_cpu's conversion (q8 modes 0-2) of 256 values held by one warp, lane l's
// values l*8 .. l*8+7 in v, into h: in mode 2 the group is one Q8_K block; in modes 0 and 1
// lanes 4b .. 4b+3 hold block b of 32 (activation_f16_unit's values, bit for bit).
__device__ __forceinline__ void activation_f16_lane8(const float (&v)[8], int lane, u32 mode, u16 (&h)[8]) {
    if (mode == 2) {
        int q[8];
        const float d = q8k_quants_of(v, lane, q);
#pragma unroll
        for (int k = 0; k < 8; k++) h[k] = float_to_half(d * (float)q[k]);
        return;
    }
    float amax = fabsf(v[0]);
#pragma unroll
    for (int k = 1; k < 8; k++) amax = fmaxf(amax, fabsf(v[k]));
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 1));
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 2));
    const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
    const float d16 = half_to_float(float_to_half(amax / 127.0f));
#pragma unroll
    for (int k = 0; k < 8; k++) h[k] = float_to_half(d16 * (float)__float2int_rn(v[k] * id));
}
