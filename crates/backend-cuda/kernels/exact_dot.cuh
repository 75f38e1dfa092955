// Exact-numerics twins of the CPU's plain vec_dot and of its activation quantizers: one dot
// product of a packed weight row with an activation row (crates/quant/src/dot/{legacy,kquants,
// float,half_arith}.rs scalar twins) and one activation row quantized (dot/mod.rs
// quantize_activation, quantize/q8.rs). Each function performs the Rust twin's float
// operations in the same order, type and rounding, so results are the same bits. The one
// exception is the Q8_0 / Q8_1 activation block, which follows q8.rs's x86 kernel where that
// kernel and its scalar twin disagree (non-finite scaled values, see quantize_q8_block).
//
// Rules kept throughout: every Rust `mul_add` is __fmaf_rn; a product that feeds an addition
// is written __fmul_rn / __fadd_rn, so nothing depends on --fmad=false (which the module is
// compiled with anyway); divisions are __fdiv_rn (IEEE, denormals kept, as in Rust); integer
// sums are exact in i32 as in Rust. Rows are read byte by byte, so no row or block needs any
// alignment (Q5_0's qh, for one, is only 2-byte aligned).
//
// Activation formats (dot/mod.rs activation_format): Q8_0 for Q4_0/Q5_0/Q8_0/IQ4_NL, Q8_1 for
// Q4_1/Q5_1, Q8_K for Q2_K..Q6_K and IQ4_XS, and the weight's own type for F32/F16/BF16.
#pragma once
#include "dequant.cuh"

namespace exact {

// Block bytes of the activation formats (blocks.rs BlockQ8_0 / BlockQ8_1 / BlockQ8K).
constexpr u32 Q8_0_BYTES = 34;  // f16 d, 32 i8 quants
constexpr u32 Q8_1_BYTES = 36;  // f16 d, f16 s = d * sum(q), 32 i8 quants
constexpr u32 Q8_K_BYTES = 292; // f32 d, 256 i8 quants, 16 i16 sums of 16 quants

// Little-endian reads and writes at any alignment.
__device__ __forceinline__ u32 read_u16(const u8* p) { return (u32)p[0] | ((u32)p[1] << 8); }
__device__ __forceinline__ u32 read_u32(const u8* p) {
    return (u32)p[0] | ((u32)p[1] << 8) | ((u32)p[2] << 16) | ((u32)p[3] << 24);
}
__device__ __forceinline__ float read_half(const u8* p) { return half_to_float((u16)read_u16(p)); }
__device__ __forceinline__ float read_f32(const u8* p) { return __uint_as_float(read_u32(p)); }
__device__ __forceinline__ float read_bf16(const u8* p) { return bf16_to_float((u16)read_u16(p)); }
__device__ __forceinline__ void write_u16(u8* p, u32 v) {
    p[0] = (u8)v;
    p[1] = (u8)(v >> 8);
}
__device__ __forceinline__ void write_u32(u8* p, u32 v) {
    write_u16(p, v);
    write_u16(p + 2, v >> 16);
}

// ---------------------------------------------------------------------------------------------
// Lanes (dot/lanes.rs): lane k of eight collects elements 4k..4k+4 of every 32-element group.

// hsum8 (ggml's hsum_float_8): upper half onto lower half, then (0 + 2) + (1 + 3).
__device__ __forceinline__ float hsum8(const float* lanes) {
    const float q0 = lanes[0] + lanes[4], q1 = lanes[1] + lanes[5];
    const float q2 = lanes[2] + lanes[6], q3 = lanes[3] + lanes[7];
    return (q0 + q2) + (q1 + q3);
}

// fma_lanes: acc[k] = fma(scale, sums[k], acc[k]).
__device__ __forceinline__ void fma_lanes(float* acc, float scale, const int* sums) {
#pragma unroll
    for (int k = 0; k < 8; k++) acc[k] = __fmaf_rn(scale, (float)sums[k], acc[k]);
}

// lane_sums of one 32-element block: w against the 32 i8 activations at a.
__device__ __forceinline__ void lane_sums(const int* w, const u8* a, int* sums) {
#pragma unroll
    for (int k = 0; k < 8; k++) {
        int sum = 0;
#pragma unroll
        for (int j = 4 * k; j < 4 * k + 4; j++) sum += w[j] * (int)(i8)a[j];
        sums[k] = sum;
    }
}

// kquants.rs scaled_lane_sums: sum of scales[e / 16] * q[e] * a[e] over the 256 elements of a
// super-block, element e in lane (e % 32) / 4.
__device__ __forceinline__ void scaled_lane_sums(const i8* q, const int* scales, const u8* a, int* sums) {
#pragma unroll
    for (int k = 0; k < 8; k++) sums[k] = 0;
    for (int e = 0; e < 256; e++) sums[(e % 32) / 4] += scales[e / 16] * (int)q[e] * (int)(i8)a[e];
}

// ---------------------------------------------------------------------------------------------
// 32-element weight blocks (dot/legacy.rs): the integer value of each element.

// unpack_nibbles: byte j holds element j (low nibble) and element j + 16 (high nibble).
__device__ __forceinline__ void unpack_nibbles(const u8* qs, int* q) {
#pragma unroll
    for (int j = 0; j < 16; j++) {
        q[j] = qs[j] & 0x0f;
        q[j + 16] = qs[j] >> 4;
    }
}

// Q4_0 (d, qs[16]): q - 8.
__device__ __forceinline__ void q4_0_values(const u8* block, int* q) {
    unpack_nibbles(block + 2, q);
#pragma unroll
    for (int j = 0; j < 32; j++) q[j] -= 8;
}

// Q5_0 (d, qh[4], qs[16]): the fifth bit of element j is bit j of qh; value q - 16.
__device__ __forceinline__ void q5_0_values(const u8* block, int* q) {
    const u32 high = read_u32(block + 2);
    unpack_nibbles(block + 6, q);
#pragma unroll
    for (int j = 0; j < 32; j++) q[j] = (q[j] | (int)((high >> j) & 1) << 4) - 16;
}

// Q8_0 (d, qs[32] i8).
__device__ __forceinline__ void q8_0_values(const u8* block, int* q) {
#pragma unroll
    for (int j = 0; j < 32; j++) q[j] = (i8)block[2 + j];
}

// Q4_1 (d, m, qs[16]): unsigned nibbles.
__device__ __forceinline__ void q4_1_values(const u8* block, int* q) { unpack_nibbles(block + 4, q); }

// Q5_1 (d, m, qh[4], qs[16]): unsigned five-bit values.
__device__ __forceinline__ void q5_1_values(const u8* block, int* q) {
    const u32 high = read_u32(block + 4);
    unpack_nibbles(block + 8, q);
#pragma unroll
    for (int j = 0; j < 32; j++) q[j] |= (int)((high >> j) & 1) << 4;
}

// IQ4_NL (d, qs[16]): nibbles looked up in KVALUES_IQ4NL.
__device__ __forceinline__ void iq4_nl_values(const u8* block, int* q) {
    unpack_nibbles(block + 2, q);
#pragma unroll
    for (int j = 0; j < 32; j++) q[j] = IQ4_NL_VALUES[q[j]];
}

// legacy.rs symmetric: per block fma_lanes(d_w * d_a, lane_sums), then hsum8. The weight's f16
// d is its first two bytes.
template <u32 BYTES, void (*Values)(const u8*, int*)>
__device__ float symmetric_dot(u32 n, const u8* weight_row, const u8* activation_row) {
    float acc[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
    for (u32 i = 0; i < n / 32; i++) {
        const u8* block = weight_row + (u64)i * BYTES;
        const u8* act = activation_row + (u64)i * Q8_0_BYTES;
        int q[32], sums[8];
        Values(block, q);
        lane_sums(q, act + 2, sums);
        fma_lanes(acc, read_half(block) * read_half(act), sums);
    }
    return hsum8(acc);
}

// legacy.rs with_minimum: as symmetric against Q8_1, plus fma(m, s_a, minimums) per block in
// a scalar added after hsum8. The weight block starts with f16 d, f16 m.
template <u32 BYTES, void (*Values)(const u8*, int*)>
__device__ float with_minimum_dot(u32 n, const u8* weight_row, const u8* activation_row) {
    float acc[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
    float minimums = 0.0f;
    for (u32 i = 0; i < n / 32; i++) {
        const u8* block = weight_row + (u64)i * BYTES;
        const u8* act = activation_row + (u64)i * Q8_1_BYTES;
        int q[32], sums[8];
        Values(block, q);
        lane_sums(q, act + 4, sums);
        minimums = __fmaf_rn(read_half(block + 2), read_half(act + 2), minimums);
        fma_lanes(acc, read_half(block) * read_half(act), sums);
    }
    return hsum8(acc) + minimums;
}

// ---------------------------------------------------------------------------------------------
// Q8_K activation blocks.

__device__ __forceinline__ float q8_k_d(const u8* y) { return read_f32(y); }
__device__ __forceinline__ const u8* q8_k_quants(const u8* y) { return y + 4; }
__device__ __forceinline__ int q8_k_bsum(const u8* y, int j) { return (short)read_u16(y + 260 + 2 * j); }

// kquants.rs scales_and_mins: the Q4_K / Q5_K six-bit scale of each 16 elements (each of the
// eight 32-element sub-blocks twice) and the minimum of each sub-block.
__device__ __forceinline__ void scales_and_mins(const u8* packed, int* scales, int* mins) {
#pragma unroll
    for (int j = 0; j < 8; j++) {
        int scale, min;
        scale_min_k4(j, packed, &scale, &min);
        scales[2 * j] = scale;
        scales[2 * j + 1] = scale;
        mins[j] = min;
    }
}

// kquants.rs sums_of_32: the activation sums of each 32 elements.
__device__ __forceinline__ void sums_of_32(const u8* y, int* sums) {
#pragma unroll
    for (int m = 0; m < 8; m++) sums[m] = q8_k_bsum(y, 2 * m) + q8_k_bsum(y, 2 * m + 1);
}

// ---------------------------------------------------------------------------------------------
// Float rows (dot/float.rs).

// reduce16 (_mm512_reduce_add_ps as gcc expands it): lanes q + (q + 8), then hsum8.
__device__ __forceinline__ float reduce16(const float* lanes) {
    float eight[8];
#pragma unroll
    for (int q = 0; q < 8; q++) eight[q] = lanes[q] + lanes[q + 8];
    return hsum8(eight);
}

// reduce_four: acc0 += acc2, acc1 += acc3, acc0 += acc1, then reduce16.
__device__ __forceinline__ float reduce_four(const float (*acc)[16]) {
    float first[16];
#pragma unroll
    for (int q = 0; q < 16; q++) {
        const float second = acc[1][q] + acc[3][q];
        first[q] = acc[0][q] + acc[2][q];
        first[q] = first[q] + second;
    }
    return reduce16(first);
}

// flush_denormal: a subnormal becomes the zero of its sign (vdpbf16ps's DAZ and FTZ; NVRTC
// keeps denormals everywhere else, as Rust does).
__device__ __forceinline__ float flush_denormal(float x) {
    const u32 bits = __float_as_uint(x);
    return (bits & 0x7f800000u) == 0 ? __uint_as_float(bits & 0x80000000u) : x;
}

// dpbf16_lane: acc + w_odd * x_odd, then + w_even * x_even, each fused, inputs and results
// flushed.
__device__ __forceinline__ float dpbf16_lane(float acc, float w_even, float w_odd, float x_even, float x_odd) {
    const float first = flush_denormal(__fmaf_rn(flush_denormal(w_odd), flush_denormal(x_odd), flush_denormal(acc)));
    return flush_denormal(__fmaf_rn(flush_denormal(w_even), flush_denormal(x_even), first));
}

// Native f16 arithmetic (half_arith.rs fma / add): the Rust twins compute the correctly
// rounded f16 (nearest even, subnormals kept, overflow to infinity) of the exact result,
// which is what the PTX instructions with an explicit .rn do. The explicit rounding also keeps
// ptxas from fusing an add into an fma.
__device__ __forceinline__ u16 half_fma(u16 a, u16 b, u16 c) {
    u16 r;
    asm("fma.rn.f16 %0, %1, %2, %3;" : "=h"(r) : "h"(a), "h"(b), "h"(c));
    return r;
}
__device__ __forceinline__ u16 half_add(u16 a, u16 b) {
    u16 r;
    asm("add.rn.f16 %0, %1, %2;" : "=h"(r) : "h"(a), "h"(b));
    return r;
}

// Elements per step of the native f16 path (half_arith.rs HALF_STEP, GGML_F16_STEP with
// AVX512-FP16) and of the f32 / bf16 kernels (float.rs FLOAT_STEP).
constexpr u32 HALF_STEP = 128;
constexpr u32 FLOAT_STEP = 64;

// half_arith.rs dot_body_scalar over the first `body` (a multiple of 128) elements: lane
// i % 128 takes fma(w[i], a[i]) in f16; registers of 32 lanes are summed 0 + 2, 1 + 3, then
// together, then reduce_add (16 + 16, 8 + 8, j + (j + 4), (0 + 2) + (1 + 3)), all in f16.
__device__ u16 half_dot_body(u32 body, const u8* weight_row, const u8* activation_row) {
    u16 acc[HALF_STEP];
    for (u32 lane = 0; lane < HALF_STEP; lane++) acc[lane] = 0;
    for (u32 step = 0; step < body; step += HALF_STEP)
        for (u32 lane = 0; lane < HALF_STEP; lane++) {
            const u64 offset = 2 * (u64)(step + lane);
            acc[lane] = half_fma((u16)read_u16(weight_row + offset), (u16)read_u16(activation_row + offset), acc[lane]);
        }
    u16 first[32];
    for (int q = 0; q < 32; q++) {
        const u16 second = half_add(acc[32 + q], acc[96 + q]);
        first[q] = half_add(acc[q], acc[64 + q]);
        first[q] = half_add(first[q], second);
    }
    for (int width = 16; width >= 4; width /= 2)
        for (int j = 0; j < width; j++) first[j] = half_add(first[j], first[j + width]);
    return half_add(half_add(first[0], first[2]), half_add(first[1], first[3]));
}

// float.rs f64_tail for f16 or bf16 elements: the f32 products summed in f64 from `sum`,
// rounded to f32 at the end.
template <float (*Element)(const u8*)>
__device__ __forceinline__ float f64_tail(double sum, u32 start, u32 n, const u8* weight_row,
                                          const u8* activation_row) {
    for (u32 i = start; i < n; i++) {
        const u64 offset = 2 * (u64)i;
        sum = __dadd_rn(sum, (double)__fmul_rn(Element(weight_row + offset), Element(activation_row + offset)));
    }
    return __double2float_rn(sum);
}

// ---------------------------------------------------------------------------------------------
// Activation quantization (quantize/q8.rs and dot/mod.rs quantize_activation).

// half::f16::from_f32 (and F16C's vcvtps2ph): nearest even; a NaN keeps its sign and top ten
// payload bits and is made quiet, where cvt.rn.f16.f32 alone would give the canonical NaN.
__device__ __forceinline__ u16 f16_bits(float v) {
    const u32 bits = __float_as_uint(v);
    if ((bits & 0x7fffffffu) > 0x7f800000u) return (u16)(((bits >> 16) & 0x8000u) | 0x7e00u | ((bits >> 13) & 0x03ffu));
    return float_to_half(v);
}

// half::bf16::from_f32: nearest even by the low 16 bits (a carry out of the largest finite
// value gives infinity); a NaN keeps its top bits and is made quiet.
__device__ __forceinline__ u16 bf16_bits(float v) {
    const u32 bits = __float_as_uint(v);
    if ((bits & 0x7fffffffu) > 0x7f800000u) return (u16)((bits >> 16) | 0x0040u);
    const u32 truncated = bits >> 16;
    return (u16)((bits & 0x8000u) != 0 && (bits & 0x17fffu) != 0 ? truncated + 1 : truncated);
}

// The Q8_0 / Q8_1 activation block as q8.rs's x86 kernel quantizes it
// (x86::quantize_activation_block, ggml's AVX2 quantize_row_q8_0): what quantize_activation
// runs on the x86 reference machine. Its scalar twin (quantize_activation_block_scalar) gives
// the same bytes whenever every x * (127 / amax) is finite, and other bytes when one is not:
// an infinite or NaN input, or a block whose amax is below 127 / FLT_MAX (about 3.7e-37), where
// 127 / amax is infinite. There the x86 kernel's conversion gives -128 (see avx2_quant) where
// the scalar `as i8` gives 127, -128 or 0; this follows the x86 kernel.
//
// x86 NaN rules, where a NaN reaches the stored bytes: an operation on a NaN returns that NaN
// made quiet, one that creates a NaN (0 * infinity) returns 0xffc00000; the GPU's canonical
// NaN is neither.
__device__ __forceinline__ float quiet(float nan) { return __uint_as_float(__float_as_uint(nan) | 0x00400000u); }
constexpr u32 X86_DEFAULT_NAN = 0xffc00000u;

// _mm256_max_ps / _mm_max_ps / _mm_max_ss: the first operand when it compares greater, else
// the second (so a NaN in either place gives the second, unchanged).
__device__ __forceinline__ float x86_max(float a, float b) { return a > b ? a : b; }

// |v| by clearing the sign bit (vandnps), a NaN's payload untouched.
__device__ __forceinline__ float magnitude(float v) { return __uint_as_float(__float_as_uint(v) & 0x7fffffffu); }

// vroundps to nearest even, vcvtps2dq (a NaN or a value outside the i32 range becomes
// INT_MIN), then the two saturating packs to i8.
__device__ __forceinline__ int avx2_quant(float scaled) {
    if (scaled != scaled) return -128;
    const float rounded = rintf(scaled);
    if (rounded >= 2147483648.0f || rounded < -2147483648.0f) return -128;
    return max(-128, min(127, (int)rounded));
}

// The 32 quants of x into q (bytes), returning the f32 scale amax / 127. amax is the maximum
// of |x| (sign bit cleared) in the kernel's order: lane k of eight folds x[k], x[k + 8],
// x[k + 16], x[k + 24], then lanes k + 4 onto k, 2 and 3 onto 0 and 1, 1 onto 0. The order
// matters only for NaN inputs, which x86_max keeps or drops by position.
__device__ __forceinline__ float quantize_q8_block(const float* x, u8* q) {
    float lanes[8];
    for (int k = 0; k < 8; k++) {
        lanes[k] = magnitude(x[k]);
        for (int i = 1; i < 4; i++) lanes[k] = x86_max(lanes[k], magnitude(x[8 * i + k]));
    }
    float quad[4];
    for (int j = 0; j < 4; j++) quad[j] = x86_max(lanes[j + 4], lanes[j]);
    const float amax = x86_max(x86_max(quad[0], quad[2]), x86_max(quad[1], quad[3]));
    const float d = amax != amax ? quiet(amax) : __fdiv_rn(amax, 127.0f);
    const float id = amax != 0.0f ? __fdiv_rn(127.0f, amax) : 0.0f;
    for (int j = 0; j < 32; j++) q[j] = (u8)avx2_quant(__fmul_rn(x[j], id));
    return d;
}

// d * sum(q) of a Q8_1 block: a NaN d passes through unchanged, as on x86. No NaN arises
// otherwise: d is infinite only when amax is, and then every quant is 0 or -128 (an infinite
// input times 127 / amax = 0), with one -128 at least, so the sum is not 0.
__device__ __forceinline__ float q8_1_sum(float d, int sum) { return d != d ? d : __fmul_rn(d, (float)sum); }

// search.rs nearest_int(iscale * value): the low 23 bits of product + 1.5 * 2^23, less 2^22.
// A NaN product takes its bits by the x86 rules above (iscale is never a NaN): `value` made
// quiet when it is the NaN, else (0 * infinity, or infinity * 0) the default NaN, giving 0.
__device__ __forceinline__ int q8_k_nearest(float iscale, float value) {
    const float product = __fmul_rn(iscale, value);
    u32 bits;
    if (product != product)
        bits = value != value ? __float_as_uint(quiet(value)) : X86_DEFAULT_NAN;
    else
        bits = __float_as_uint(__fadd_rn(product, 12582912.0f));
    return (int)(bits & 0x007fffffu) - 0x00400000;
}

}  // namespace exact

// =============================================================================================
// Dot products: exact_dot_<type>(n, weight row, activation row in the paired format), n a
// whole number of the weight's blocks.

// legacy.rs dot_q4_0.
__device__ float exact_dot_q4_0(unsigned n, const u8* w_row, const u8* a_row) {
    return exact::symmetric_dot<18, exact::q4_0_values>(n, w_row, a_row);
}

// legacy.rs dot_q5_0.
__device__ float exact_dot_q5_0(unsigned n, const u8* w_row, const u8* a_row) {
    return exact::symmetric_dot<22, exact::q5_0_values>(n, w_row, a_row);
}

// legacy.rs dot_q8_0.
__device__ float exact_dot_q8_0(unsigned n, const u8* w_row, const u8* a_row) {
    return exact::symmetric_dot<34, exact::q8_0_values>(n, w_row, a_row);
}

// legacy.rs dot_q4_1.
__device__ float exact_dot_q4_1(unsigned n, const u8* w_row, const u8* a_row) {
    return exact::with_minimum_dot<20, exact::q4_1_values>(n, w_row, a_row);
}

// legacy.rs dot_q5_1.
__device__ float exact_dot_q5_1(unsigned n, const u8* w_row, const u8* a_row) {
    return exact::with_minimum_dot<24, exact::q5_1_values>(n, w_row, a_row);
}

// legacy.rs dot_iq4_nl: blocks in pairs, even blocks in one set of lanes and odd blocks in
// another, the two added lane by lane before hsum8; an odd last block is added with one fma of
// its whole integer sum.
__device__ float exact_dot_iq4_nl(unsigned n, const u8* w_row, const u8* a_row) {
    const u32 blocks = n / 32;
    float lanes[2][8];
    for (int k = 0; k < 8; k++) lanes[0][k] = lanes[1][k] = 0.0f;
    float scale;
    int sums[8];
    auto contribution = [&](u32 i) {
        const u8* block = w_row + (u64)i * 18;
        const u8* act = a_row + (u64)i * exact::Q8_0_BYTES;
        int q[32];
        exact::iq4_nl_values(block, q);
        exact::lane_sums(q, act + 2, sums);
        scale = exact::read_half(act) * exact::read_half(block);
    };
    for (u32 i = 0; i < blocks - blocks % 2; i++) {
        contribution(i);
        exact::fma_lanes(lanes[i % 2], scale, sums);
    }
    float both[8];
    for (int k = 0; k < 8; k++) both[k] = lanes[0][k] + lanes[1][k];
    float sum = exact::hsum8(both);
    if (blocks % 2 == 1) {
        contribution(blocks - 1);
        int total = 0;
        for (int k = 0; k < 8; k++) total += sums[k];
        sum = __fmaf_rn(scale, (float)total, sum);
    }
    return sum;
}

// kquants.rs dot_q2_k: per super-block the minimum correction goes into the lanes first
// (lane k: scale-high-nibble * bsum of sub-blocks 2k and 2k + 1, times -d_a * dmin), then the
// scaled quants times d_a * d.
__device__ float exact_dot_q2_k(unsigned n, const u8* w_row, const u8* a_row) {
    float acc[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
    for (u32 i = 0; i < n / 256; i++) {
        // scales[16] (low nibble scale, high nibble min), qs[64], f16 d, f16 dmin.
        const u8* x = w_row + (u64)i * 84;
        const u8* y = a_row + (u64)i * exact::Q8_K_BYTES;
        const float d = exact::q8_k_d(y) * exact::read_half(x + 80);
        const float dmin = -exact::q8_k_d(y) * exact::read_half(x + 82);
        int mins[8];
        for (int k = 0; k < 8; k++)
            mins[k] = (x[2 * k] >> 4) * exact::q8_k_bsum(y, 2 * k) +
                      (x[2 * k + 1] >> 4) * exact::q8_k_bsum(y, 2 * k + 1);
        exact::fma_lanes(acc, dmin, mins);
        int scales[16];
        for (int j = 0; j < 16; j++) scales[j] = x[j] & 0x0f;
        // Element 128 h + 32 s + l is bits 2s..2s+2 of qs[32 h + l].
        i8 q[256];
        for (int e = 0; e < 256; e++) q[e] = (x[16 + 32 * (e / 128) + e % 32] >> (2 * ((e / 32) % 4))) & 3;
        int sums[8];
        exact::scaled_lane_sums(q, scales, exact::q8_k_quants(y), sums);
        exact::fma_lanes(acc, d, sums);
    }
    return exact::hsum8(acc);
}

// kquants.rs dot_q3_k.
__device__ float exact_dot_q3_k(unsigned n, const u8* w_row, const u8* a_row) {
    float acc[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
    for (u32 i = 0; i < n / 256; i++) {
        // hmask[32], qs[64], scales[12], f16 d.
        const u8* x = w_row + (u64)i * 110;
        const u8* y = a_row + (u64)i * exact::Q8_K_BYTES;
        const float d = exact::q8_k_d(y) * exact::read_half(x + 108);
        int scales[16];
        for (int j = 0; j < 16; j++) scales[j] = q3_k_scale(j, x + 96);
        // Element 128 h + 32 s + l: bits 2s..2s+2 of qs[32 h + l], less 4 unless bit 4h + s of
        // hmask[l] is set.
        i8 q[256];
        for (int e = 0; e < 256; e++) {
            const int half = e / 128, shift = (e / 32) % 4, l = e % 32;
            const int low = (x[32 + 32 * half + l] >> (2 * shift)) & 3;
            const bool high_set = ((x[l] >> (4 * half + shift)) & 1) == 1;
            q[e] = (i8)(low - (high_set ? 0 : 4));
        }
        int sums[8];
        exact::scaled_lane_sums(q, scales, exact::q8_k_quants(y), sums);
        exact::fma_lanes(acc, d, sums);
    }
    return exact::hsum8(acc);
}

// kquants.rs dot_q4_k: the minimum correction in four extra lanes (lane k: sub-blocks 2k and
// 2k + 1), added as (0 + 2) + (1 + 3) after hsum8 of the main lanes.
__device__ float exact_dot_q4_k(unsigned n, const u8* w_row, const u8* a_row) {
    float acc[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
    float acc_mins[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (u32 i = 0; i < n / 256; i++) {
        // f16 d, f16 dmin, scales[12], qs[128].
        const u8* x = w_row + (u64)i * 144;
        const u8* y = a_row + (u64)i * exact::Q8_K_BYTES;
        const float d = exact::q8_k_d(y) * exact::read_half(x);
        const float dmin = -exact::q8_k_d(y) * exact::read_half(x + 2);
        int scales[16], mins[8], sums32[8];
        exact::scales_and_mins(x + 4, scales, mins);
        exact::sums_of_32(y, sums32);
        for (int k = 0; k < 4; k++) {
            const int product = mins[2 * k] * sums32[2 * k] + mins[2 * k + 1] * sums32[2 * k + 1];
            acc_mins[k] = __fmaf_rn(dmin, (float)product, acc_mins[k]);
        }
        // Element 64 j + l is the low nibble of qs[32 j + l], element 64 j + 32 + l its high one.
        i8 q[256];
        for (int e = 0; e < 256; e++) {
            const u8 byte = x[16 + 32 * (e / 64) + e % 32];
            q[e] = (i8)((e % 64) < 32 ? byte & 0x0f : byte >> 4);
        }
        int sums[8];
        exact::scaled_lane_sums(q, scales, exact::q8_k_quants(y), sums);
        exact::fma_lanes(acc, d, sums);
    }
    return exact::hsum8(acc) + ((acc_mins[0] + acc_mins[2]) + (acc_mins[1] + acc_mins[3]));
}

// kquants.rs dot_q5_k: the minimum correction of a super-block as one integer, fused into a
// scalar added after hsum8.
__device__ float exact_dot_q5_k(unsigned n, const u8* w_row, const u8* a_row) {
    float acc[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
    float minimums = 0.0f;
    for (u32 i = 0; i < n / 256; i++) {
        // f16 d, f16 dmin, scales[12], qh[32], qs[128].
        const u8* x = w_row + (u64)i * 176;
        const u8* y = a_row + (u64)i * exact::Q8_K_BYTES;
        const float d = exact::q8_k_d(y) * exact::read_half(x);
        const float dmin = -exact::q8_k_d(y) * exact::read_half(x + 2);
        int scales[16], mins[8], sums32[8];
        exact::scales_and_mins(x + 4, scales, mins);
        exact::sums_of_32(y, sums32);
        int product = 0;
        for (int m = 0; m < 8; m++) product += mins[m] * sums32[m];
        minimums = __fmaf_rn(dmin, (float)product, minimums);
        // As Q4_K, with the fifth bit of element 64 j + l in bit 2j of qh[l] and that of
        // element 64 j + 32 + l in bit 2j + 1.
        i8 q[256];
        for (int e = 0; e < 256; e++) {
            const int j = e / 64, l = e % 32, upper = (e % 64) / 32;
            const u8 byte = x[48 + 32 * j + l];
            const int nibble = upper ? byte >> 4 : byte & 0x0f;
            q[e] = (i8)(nibble | (((x[16 + l] >> (2 * j + upper)) & 1) << 4));
        }
        int sums[8];
        exact::scaled_lane_sums(q, scales, exact::q8_k_quants(y), sums);
        exact::fma_lanes(acc, d, sums);
    }
    return exact::hsum8(acc) + minimums;
}

// kquants.rs dot_q6_k: the six-bit codes (value code - 32) in the lanes, the -32 offset taken
// out of lane k through the activation sums of sub-blocks 2k and 2k + 1 (ggml's q8sclsub).
__device__ float exact_dot_q6_k(unsigned n, const u8* w_row, const u8* a_row) {
    float acc[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
    for (u32 i = 0; i < n / 256; i++) {
        // ql[128], qh[64], scales[16] i8, f16 d.
        const u8* x = w_row + (u64)i * 210;
        const u8* y = a_row + (u64)i * exact::Q8_K_BYTES;
        const float d = exact::q8_k_d(y) * exact::read_half(x + 208);
        int scales[16];
        for (int j = 0; j < 16; j++) scales[j] = (i8)x[192 + j];
        // Element 128 h + 32 p + l: low four bits from ql[64 h + l + 32 (p % 2)] (nibble p / 2),
        // high two bits from bits 2p..2p+2 of qh[32 h + l].
        i8 q[256];
        for (int e = 0; e < 256; e++) {
            const int half = e / 128, part = (e / 32) % 4, l = e % 32;
            const int low = (x[64 * half + l + 32 * (part % 2)] >> (4 * (part / 2))) & 0x0f;
            const int high = (x[128 + 32 * half + l] >> (2 * part)) & 3;
            q[e] = (i8)(low | (high << 4));
        }
        int sums[8];
        exact::scaled_lane_sums(q, scales, exact::q8_k_quants(y), sums);
        for (int k = 0; k < 8; k++)
            sums[k] -= 32 * (scales[2 * k] * exact::q8_k_bsum(y, 2 * k) +
                             scales[2 * k + 1] * exact::q8_k_bsum(y, 2 * k + 1));
        exact::fma_lanes(acc, d, sums);
    }
    return exact::hsum8(acc);
}

// kquants.rs dot_iq4_xs.
__device__ float exact_dot_iq4_xs(unsigned n, const u8* w_row, const u8* a_row) {
    float acc[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
    for (u32 i = 0; i < n / 256; i++) {
        // f16 d, u16 scales_h, scales_l[4], qs[128].
        const u8* x = w_row + (u64)i * 136;
        const u8* y = a_row + (u64)i * exact::Q8_K_BYTES;
        const float d = exact::read_half(x) * exact::q8_k_d(y);
        const u32 scales_high = exact::read_u16(x + 2);
        int scales[16];
        i8 q[256];
        for (int sub = 0; sub < 8; sub++) {
            const int low = (x[4 + sub / 2] >> (4 * (sub % 2))) & 0x0f;
            const int high = (scales_high >> (2 * sub)) & 3;
            scales[2 * sub] = scales[2 * sub + 1] = (low | (high << 4)) - 32;
            for (int l = 0; l < 16; l++) {
                const u8 byte = x[8 + 16 * sub + l];
                q[32 * sub + l] = IQ4_NL_VALUES[byte & 0x0f];
                q[32 * sub + 16 + l] = IQ4_NL_VALUES[byte >> 4];
            }
        }
        int sums[8];
        exact::scaled_lane_sums(q, scales, exact::q8_k_quants(y), sums);
        exact::fma_lanes(acc, d, sums);
    }
    return exact::hsum8(acc);
}

// float.rs dot_f32: element i < n - n % 64 fused into lane i % 16 of accumulator (i / 16) % 4,
// reduce_four, then the rest fused one by one into that sum.
__device__ float exact_dot_f32(unsigned n, const u8* w_row, const u8* a_row) {
    const u32 body = n - n % exact::FLOAT_STEP;
    float acc[4][16];
    for (int r = 0; r < 4; r++)
        for (int q = 0; q < 16; q++) acc[r][q] = 0.0f;
    for (u32 i = 0; i < body; i++) {
        float& lane = acc[(i / 16) % 4][i % 16];
        lane = __fmaf_rn(exact::read_f32(w_row + 4 * (u64)i), exact::read_f32(a_row + 4 * (u64)i), lane);
    }
    float sum = exact::reduce_four(acc);
    for (u32 i = body; i < n; i++)
        sum = __fmaf_rn(exact::read_f32(w_row + 4 * (u64)i), exact::read_f32(a_row + 4 * (u64)i), sum);
    return sum;
}

// float.rs dot_f16 (dot_f16_with and half_arith.rs dot_body_scalar): the first n - n % 128
// products in native f16, that f16 starting the f64 sum of the rest, rounded to f32.
__device__ float exact_dot_f16(unsigned n, const u8* w_row, const u8* a_row) {
    const u32 body = n - n % exact::HALF_STEP;
    const double start = body > 0 ? (double)half_to_float(exact::half_dot_body(body, w_row, a_row)) : 0.0;
    return exact::f64_tail<exact::read_half>(start, body, n, w_row, a_row);
}

// float.rs dot_bf16: per 64 elements, elements [i, i + 32) into the first 16 lanes and
// [i + 32, i + 64) into the second (lane q: odd element 2q + 1, then 2q, see dpbf16_lane);
// f64(reduce16(first)) + f64(reduce16(second)) then starts the f64 sum of the rest.
__device__ float exact_dot_bf16(unsigned n, const u8* w_row, const u8* a_row) {
    const u32 body = n - n % exact::FLOAT_STEP;
    float halves[2][16];
    for (int h = 0; h < 2; h++)
        for (int q = 0; q < 16; q++) halves[h][q] = 0.0f;
    for (u32 step = 0; step < body; step += exact::FLOAT_STEP)
        for (int h = 0; h < 2; h++)
            for (int q = 0; q < 16; q++) {
                const u64 even = 2 * (u64)(step + 32 * h + 2 * q), odd = even + 2;
                halves[h][q] = exact::dpbf16_lane(halves[h][q], exact::read_bf16(w_row + even),
                                                  exact::read_bf16(w_row + odd), exact::read_bf16(a_row + even),
                                                  exact::read_bf16(a_row + odd));
            }
    const double sum = __dadd_rn((double)exact::reduce16(halves[0]), (double)exact::reduce16(halves[1]));
    return exact::f64_tail<exact::read_bf16>(sum, body, n, w_row, a_row);
}

// =============================================================================================
// Activation rows: exact_quantize_row_<format>(x, n, out) writes the n values of x in the
// format's bytes (activation_row_bytes(format, n) of them), n a whole number of its blocks.

// mod.rs quantize_activation, F32: the bits unchanged.
__device__ void exact_quantize_row_f32(const float* x, unsigned n, u8* out) {
    for (u32 i = 0; i < n; i++) exact::write_u32(out + 4 * (u64)i, __float_as_uint(x[i]));
}

// mod.rs quantize_activation, F16: half::f16::from_f32 of each value.
__device__ void exact_quantize_row_f16(const float* x, unsigned n, u8* out) {
    for (u32 i = 0; i < n; i++) exact::write_u16(out + 2 * (u64)i, exact::f16_bits(x[i]));
}

// mod.rs quantize_activation, BF16: half::bf16::from_f32 of each value.
__device__ void exact_quantize_row_bf16(const float* x, unsigned n, u8* out) {
    for (u32 i = 0; i < n; i++) exact::write_u16(out + 2 * (u64)i, exact::bf16_bits(x[i]));
}

// q8.rs quantize_row_q8_0_activation (its x86 kernel, see quantize_q8_block): per 32 values,
// f16(amax / 127) and the quants round_ties_even(x * (127 / amax)).
__device__ void exact_quantize_row_q8_0(const float* x, unsigned n, u8* out) {
    for (u32 b = 0; b < n / 32; b++) {
        u8* block = out + (u64)b * exact::Q8_0_BYTES;
        const float d = exact::quantize_q8_block(x + 32 * (u64)b, block + 2);
        exact::write_u16(block, exact::f16_bits(d));
    }
}

// q8.rs quantize_row_q8_1_activation (its x86 kernel x86::quantize_block_q8_1): the Q8_0
// activation block plus s = f16(d * sum(q)) with the unrounded f32 d.
__device__ void exact_quantize_row_q8_1(const float* x, unsigned n, u8* out) {
    for (u32 b = 0; b < n / 32; b++) {
        u8* block = out + (u64)b * exact::Q8_1_BYTES;
        const float d = exact::quantize_q8_block(x + 32 * (u64)b, block + 4);
        int sum = 0;
        for (int j = 0; j < 32; j++) sum += (i8)block[4 + j];
        exact::write_u16(block, exact::f16_bits(d));
        exact::write_u16(block + 2, exact::f16_bits(exact::q8_1_sum(d, sum)));
    }
}

// q8.rs quantize_row_q8_k: per 256 values, max = the first value of largest magnitude (a NaN
// never compares larger), iscale = -127 / max, q = min(nearest_int(iscale * x), 127) kept to
// its low byte as Rust's `as i8` does, the sums of each 16 quants, and d = 1 / iscale; an
// all-zero group gives d = 0 and zero quants and sums.
__device__ void exact_quantize_row_q8_k(const float* x, unsigned n, u8* out) {
    for (u32 b = 0; b < n / 256; b++) {
        const float* values = x + 256 * (u64)b;
        u8* block = out + (u64)b * exact::Q8_K_BYTES;
        float max = 0.0f, amax = 0.0f;
        for (int e = 0; e < 256; e++) {
            if (fabsf(values[e]) > amax) {
                amax = fabsf(values[e]);
                max = values[e];
            }
        }
        if (amax == 0.0f) {
            for (u32 byte = 0; byte < exact::Q8_K_BYTES; byte++) block[byte] = 0;
            continue;
        }
        const float iscale = __fdiv_rn(-127.0f, max);
        for (int e = 0; e < 256; e++) block[4 + e] = (u8)min(exact::q8_k_nearest(iscale, values[e]), 127);
        for (int group = 0; group < 16; group++) {
            int sum = 0;
            for (int j = 0; j < 16; j++) sum += (i8)block[4 + 16 * group + j];
            exact::write_u16(block + 260 + 2 * group, (u32)sum);
        }
        exact::write_u32(block, __float_as_uint(__fdiv_rn(1.0f, iscale)));
    }
}
