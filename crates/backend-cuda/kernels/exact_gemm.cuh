// Exact-numerics twins of two more CPU matmul orders, one output per call: llamafile's
// tinyBLAS (crates/quant/src/dot/tinyblas/scalar.rs) and ggml's REPACK gemv/gemm
// (crates/quant/src/dot/ggml_repack/{q4_0,iq4_nl,q4_k,q2_k}.rs). Each function performs the
// float operations of its Rust twin in the same order, type and rounding, so the result is the
// same bits; the shared pieces (lanes, block values, Q8_K fields, byte readers) are
// exact_dot.cuh's, under its rules. Weights are plain GGUF rows: the CPU's repacked layout
// changes where the bytes sit, not the arithmetic, which is what these reproduce. Names
// follow the Rust ones (exact::tinyblas::q0_dot is scalar.rs's q0_dot).
#pragma once
#include "exact_dot.cuh"

namespace exact {
namespace tinyblas {

// Bytes of one block of a prepared Q8_0 unit (tinyblas/mod.rs Q0_BLOCK_BYTES): the quants of
// tokens 2u and 2u + 1, 32 each, XOR 0x80, then sixteen f32 scales (the first token's d eight
// times, then the second's). A missing second token has quants 0x80 and scales 0.
constexpr u32 Q0_BLOCK_BYTES = 128;

// scalar.rs float_dot: F32 or F16 weights (elements of BYTES bytes read by Element) against
// f32 activations (for F16 weights, f16-rounded ones: round_f16); lane i % 16 collects
// fma(w[i], x[i]), then reduce16.
template <u32 BYTES, float (*Element)(const u8*)>
__device__ float float_dot(u32 n, const u8* weight_row, const u8* activation_row) {
    float lanes[16];
#pragma unroll
    for (int q = 0; q < 16; q++) lanes[q] = 0.0f;
    for (u32 i = 0; i < n; i++)
        lanes[i % 16] = __fmaf_rn(Element(weight_row + (u64)BYTES * i), read_f32(activation_row + 4 * (u64)i),
                                  lanes[i % 16]);
    return reduce16(lanes);
}

// scalar.rs bf16_dot: BF16 weights against bf16 activations, 32-element steps in which lane
// q takes elements 2q + 1, then 2q (dpbf16_lane), then reduce16.
__device__ float bf16_dot(u32 n, const u8* weight_row, const u8* activation_row) {
    float lanes[16];
#pragma unroll
    for (int q = 0; q < 16; q++) lanes[q] = 0.0f;
    for (u32 step = 0; step < n; step += 32) {
#pragma unroll
        for (int q = 0; q < 16; q++) {
            const u64 even = 2 * (u64)(step + 2 * q), odd = even + 2;
            lanes[q] = dpbf16_lane(lanes[q], read_bf16(weight_row + even), read_bf16(weight_row + odd),
                                   read_bf16(activation_row + even), read_bf16(activation_row + odd));
        }
    }
    return reduce16(lanes);
}

// scalar.rs q0_dot: a Q8_0, Q4_0, Q5_0 or IQ4_NL weight row (blocks of BYTES, element values
// from Values) against token `half` (0 or 1) of a prepared unit: per block
// fma_lanes(d_w * d_x, lane_sums(w, x)), then hsum8.
template <u32 BYTES, void (*Values)(const u8*, int*)>
__device__ float q0_dot(u32 n, const u8* weight_row, const u8* unit, u32 half) {
    float acc[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
    for (u32 i = 0; i < n / 32; i++) {
        const u8* block = weight_row + (u64)i * BYTES;
        const u8* prepared = unit + (u64)i * Q0_BLOCK_BYTES;
        int w[32], sums[8];
        u8 x[32];
        Values(block, w);
        for (int j = 0; j < 32; j++) x[j] = prepared[32 * half + j] ^ 0x80;
        lane_sums(w, x, sums);
        fma_lanes(acc, read_half(block) * read_f32(prepared + 64 + 32 * half), sums);
    }
    return hsum8(acc);
}

// The f32 a tinyBLAS F16 activation becomes (tinyblas/mod.rs prepare):
// half::f16::from_f32(v).to_f32(). A NaN comes back with its sign and top ten payload bits,
// made quiet, as half does it; widening f16_bits' NaN with cvt.f32.f16 need not.
__device__ __forceinline__ float round_f16(float v) {
    const u32 bits = __float_as_uint(v);
    if ((bits & 0x7fffffffu) > 0x7f800000u) return __uint_as_float((bits | 0x00400000u) & 0xffffe000u);
    return half_to_float(f16_bits(v));
}

}  // namespace tinyblas

namespace repack {

// repacked.rs gemm_rows: activation rows 0..gemm_rows(..) take the gemm order, the rest the
// gemv order. A 2-D weight (MUL_MAT) takes whole groups of four rows as gemm; one expert of
// a 3-D weight (MUL_MAT_ID), and any weight in a pass whose rows are computed as if alone,
// takes gemv for every row (gemv_only).
__device__ __forceinline__ u32 gemm_rows(u32 tokens, bool gemv_only) { return gemv_only ? 0 : tokens - tokens % 4; }

// q4_0.rs dot_q4_0 and iq4_nl.rs dot_iq4_nl (Values: q4_0_values / iq4_nl_values) against a
// Q8_0 row: one scalar accumulator, acc = fma(isum, d_w * d_a, acc) per block. Their gemv and
// gemm orders are the same.
template <u32 BYTES, void (*Values)(const u8*, int*)>
__device__ float q8_0_blocks_dot(u32 n, const u8* weight_row, const u8* activation_row) {
    float acc = 0.0f;
    for (u32 i = 0; i < n / 32; i++) {
        const u8* x = weight_row + (u64)i * BYTES;
        const u8* y = activation_row + (u64)i * Q8_0_BYTES;
        int w[32];
        Values(x, w);
        int isum = 0;
        for (int j = 0; j < 32; j++) isum += w[j] * (int)(i8)y[2 + j];
        acc = __fmaf_rn((float)isum, read_half(x) * read_half(y), acc);
    }
    return acc;
}

// q4_k.rs dot_q4_k: one fma pair per `chunks_per_fma` 64-element chunks of a super-block
// (4: gemv, 1: gemm); chunk c holds sub-blocks 2c (low nibbles of qs[32c..32c+32]) and 2c + 1
// (high nibbles). Q4_K block: f16 d, f16 dmin, scales[12], qs[128].
__device__ float q4_k_dot(u32 n, const u8* weight_row, const u8* activation_row, int chunks_per_fma) {
    float acc = 0.0f, acc_min = 0.0f;
    for (u32 i = 0; i < n / 256; i++) {
        const u8* x = weight_row + (u64)i * Q4_K::BYTES;
        const u8* y = activation_row + (u64)i * Q8_K_BYTES;
        const i8* y_qs = (const i8*)q8_k_quants(y);
        const float scale = read_half(x) * q8_k_d(y);
        const float scale_min = read_half(x + 2) * q8_k_d(y);
        int isum = 0, imin = 0;
        for (int chunk = 0; chunk < 4; chunk++) {
            const u8* packed = x + 16 + 32 * chunk;
            for (int half = 0; half < 2; half++) {
                const int sub = 2 * chunk + half;
                int sub_scale, sub_min;
                scale_min_k4(sub, x + 4, &sub_scale, &sub_min);
                int dot = 0;
                for (int l = 0; l < 32; l++) dot += ((packed[l] >> (4 * half)) & 15) * (int)y_qs[32 * sub + l];
                isum += sub_scale * dot;
                imin += sub_min * (q8_k_bsum(y, 2 * sub) + q8_k_bsum(y, 2 * sub + 1));
            }
            if ((chunk + 1) % chunks_per_fma == 0) {
                acc = __fmaf_rn((float)isum, scale, acc);
                acc_min = __fmaf_rn((float)imin, scale_min, acc_min);
                isum = 0;
                imin = 0;
            }
        }
    }
    return __fsub_rn(acc, acc_min);
}

// q2_k.rs dot_q2_k: one fma pair per `halves_per_fma` 128-element halves of a super-block
// (2: gemv, 1: gemm). Element 128 h + 32 j + l is bits 2j..2j+2 of qs[32 h + l]; its
// 16-element sub-block k = 8 h + 2 j + l / 16 has scale scales[k] & 15, minimum scales[k] >> 4.
// Q2_K block: scales[16], qs[64], f16 d, f16 dmin.
__device__ float q2_k_dot(u32 n, const u8* weight_row, const u8* activation_row, int halves_per_fma) {
    float acc = 0.0f, acc_min = 0.0f;
    for (u32 i = 0; i < n / 256; i++) {
        const u8* x = weight_row + (u64)i * Q2_K::BYTES;
        const u8* y = activation_row + (u64)i * Q8_K_BYTES;
        const u8* scales = x;
        const u8* qs = x + 16;
        const i8* y_qs = (const i8*)q8_k_quants(y);
        const float scale = read_half(x + 80) * q8_k_d(y);
        const float scale_min = read_half(x + 82) * q8_k_d(y);
        int isum = 0, imin = 0;
        for (int half = 0; half < 2; half++) {
            for (int shift = 0; shift < 4; shift++) {
                for (int part = 0; part < 2; part++) {
                    const int k = 8 * half + 2 * shift + part;
                    int dot = 0;
                    for (int l = 16 * part; l < 16 * part + 16; l++)
                        dot += ((qs[32 * half + l] >> (2 * shift)) & 3) * (int)y_qs[128 * half + 32 * shift + l];
                    isum += (scales[k] & 15) * dot;
                    imin += (scales[k] >> 4) * q8_k_bsum(y, k);
                }
            }
            if ((half + 1) % halves_per_fma == 0) {
                acc = __fmaf_rn((float)isum, scale, acc);
                acc_min = __fmaf_rn((float)imin, scale_min, acc_min);
                isum = 0;
                imin = 0;
            }
        }
    }
    return __fsub_rn(acc, acc_min);
}

}  // namespace repack
}  // namespace exact

// The twins whose activation is one row, with the Dot signature of exact_matmul.cu:
// exact_dot_<type>_tinyblas (tinyBLAS float types), exact_dot_<type>_repack (one order for
// gemv and gemm), exact_dot_<type>_gemv / _gemm (the K-quants).
__device__ float exact_dot_f32_tinyblas(unsigned n, const u8* w_row, const u8* a_row) {
    return exact::tinyblas::float_dot<4, exact::read_f32>(n, w_row, a_row);
}
__device__ float exact_dot_f16_tinyblas(unsigned n, const u8* w_row, const u8* a_row) {
    return exact::tinyblas::float_dot<2, exact::read_half>(n, w_row, a_row);
}
__device__ float exact_dot_bf16_tinyblas(unsigned n, const u8* w_row, const u8* a_row) {
    return exact::tinyblas::bf16_dot(n, w_row, a_row);
}
__device__ float exact_dot_q4_0_repack(unsigned n, const u8* w_row, const u8* a_row) {
    return exact::repack::q8_0_blocks_dot<Q4_0::BYTES, exact::q4_0_values>(n, w_row, a_row);
}
__device__ float exact_dot_iq4_nl_repack(unsigned n, const u8* w_row, const u8* a_row) {
    return exact::repack::q8_0_blocks_dot<IQ4_NL::BYTES, exact::iq4_nl_values>(n, w_row, a_row);
}
__device__ float exact_dot_q4_k_gemv(unsigned n, const u8* w_row, const u8* a_row) {
    return exact::repack::q4_k_dot(n, w_row, a_row, 4);
}
__device__ float exact_dot_q4_k_gemm(unsigned n, const u8* w_row, const u8* a_row) {
    return exact::repack::q4_k_dot(n, w_row, a_row, 1);
}
__device__ float exact_dot_q2_k_gemv(unsigned n, const u8* w_row, const u8* a_row) {
    return exact::repack::q2_k_dot(n, w_row, a_row, 2);
}
__device__ float exact_dot_q2_k_gemm(unsigned n, const u8* w_row, const u8* a_row) {
    return exact::repack::q2_k_dot(n, w_row, a_row, 1);
}
