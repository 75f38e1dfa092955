// Exact numerics: device twins of the CPU backend's float arithmetic outside matmul, bit for
// bit (crates/backend-cpu; its scalar code paths define the order of operations). Every float
// operation is written as an explicit round-to-nearest intrinsic (__fmul_rn, __fadd_rn,
// __fmaf_rn, __dadd_rn, ...) in the order and type of the Rust code, so no multiply and add
// are fused unless Rust fuses them (`mul_add`), whatever --fmad says; denormals are kept.
// The including module is still compiled with --fmad=false, as a second guard.
//
// Functions marked "warp" must be called by all 32 lanes of a warp with the same arguments;
// they split a row's elements over the lanes (element i belongs to lane i % 32) where the Rust
// code treats elements independently, and keep every ordered sum on one lane.
#pragma once
#include "common.cuh"

constexpr u32 ALL_LANES = 0xffffffffu;

__device__ __forceinline__ float negative_infinity() { return __uint_as_float(0xff800000u); }
__device__ __forceinline__ float positive_infinity() { return __uint_as_float(0x7f800000u); }

// Rust's `x as i32`: truncation toward zero, saturating at the ends of i32, NaN to 0 (a C cast
// of an out-of-range float is undefined).
__device__ __forceinline__ i32 rust_f32_to_i32(float x) {
    if (x != x) return 0;
    if (x >= 2147483648.0f) return 2147483647;
    if (x <= -2147483648.0f) return (i32)0x80000000u;
    return (i32)x;
}

// ---------------------------------------------------------------------------------------
// libm's expf: what Rust's f32::exp calls on the CPU, glibc's `__expf_fma` on x86-64 with FMA
// and AVX2. x = (k + r) ln2 / 32 with k an integer and |r| <= 1/2; the result is
// 2^(k/32) e^(r ln2 / 32) evaluated in double: 2^(k/32) from a table of 2^(i/32), i = k mod 32,
// whose entries have i << 47 subtracted so that adding k << 47 puts k / 32 into the exponent;
// e^(...) by a degree-3 polynomial. The five operations the machine code fuses (vfmadd/vfmsub)
// are the __fma_rn calls. /work/tools/expf_check.c holds the C twin of this function and
// checks it against libm for all 2^32 inputs.

// asuint64(2^(i/32)) - (i << 47), read from libm's data.
__constant__ u64 EXACT_EXP2_TABLE[32] = {
    0x3ff0000000000000ull, 0x3fefd9b0d3158574ull, 0x3fefb5586cf9890full, 0x3fef9301d0125b51ull,
    0x3fef72b83c7d517bull, 0x3fef54873168b9aaull, 0x3fef387a6e756238ull, 0x3fef1e9df51fdee1ull,
    0x3fef06fe0a31b715ull, 0x3feef1a7373aa9cbull, 0x3feedea64c123422ull, 0x3feece086061892dull,
    0x3feebfdad5362a27ull, 0x3feeb42b569d4f82ull, 0x3feeab07dd485429ull, 0x3feea47eb03a5585ull,
    0x3feea09e667f3bcdull, 0x3fee9f75e8ec5f74ull, 0x3feea11473eb0187ull, 0x3feea589994cce13ull,
    0x3feeace5422aa0dbull, 0x3feeb737b0cdc5e5ull, 0x3feec49182a3f090ull, 0x3feed503b23e255dull,
    0x3feee89f995ad3adull, 0x3feeff76f2fb5e47ull, 0x3fef199bdd85529cull, 0x3fef3720dcef9069ull,
    0x3fef5818dcfba487ull, 0x3fef7c97337b9b5full, 0x3fefa4afa2a490daull, 0x3fefd0765b6e4540ull,
};

__device__ __forceinline__ float exact_expf(float x) {
    const u32 bits = __float_as_uint(x);
    const u32 top = (bits >> 20) & 0x7ff;
    if (top >= 0x42b) {
        // |x| >= 88, infinities and NaNs. The overflow and underflow results are libm's: a
        // float product that rounds to inf, to 0, or (x between log(2^-150) and log(2^-149))
        // to the smallest subnormal.
        if (bits == 0xff800000u) return 0.0f;
        if (top >= 0x7f8) return __fadd_rn(x, x);
        if (x > 0x1.62e42ep6f) return __fmul_rn(0x1p97f, 0x1p97f);
        if (x < -0x1.9fe368p6f) return __fmul_rn(0x1p-95f, 0x1p-95f);
        if (x < -0x1.9d1d9ep6f) return __fmul_rn(0x1.4p-75f, 0x1.4p-75f);
    }
    const double inverse_ln2_32 = 0x1.71547652b82fep+5;  // 32 / ln 2
    const double shift = 0x1.8p+52;                        // adding it rounds to an integer
    const double xd = (double)x;
    const double shifted = __fma_rn(inverse_ln2_32, xd, shift);
    const u64 k = (u64)__double_as_longlong(shifted);
    const double kd = __dsub_rn(shifted, shift);
    const double r = __fma_rn(inverse_ln2_32, xd, -kd);
    const double s = __longlong_as_double((i64)(EXACT_EXP2_TABLE[k & 31] + (k << 47)));
    const double high = __fma_rn(0x1.c6af84b912394p-20, r, 0x1.ebfce50fac4f3p-13);
    const double r2 = __dmul_rn(r, r);
    const double low = __fma_rn(r, 0x1.62e42ff0c52d6p-6, 1.0);
    const double poly = __fma_rn(high, r2, low);
    return __double2float_rn(__dmul_rn(poly, s));
}

// ---------------------------------------------------------------------------------------
// ggml's polynomial exp and SiLU (crates/backend-cpu/src/vector/silu.rs).

// silu::scale_by_power_of_two: j * 2^n rounded once, for an integral n with |n| <= 192 (or
// NaN, which Rust's `as i32` turns into 0). Outside the normal exponents the product is exact
// in f64 and rounded to f32 once.
__device__ __forceinline__ float exact_scale_by_power_of_two(float j, float n) {
    const i32 k = rust_f32_to_i32(n);
    if (n >= -126.0f && n <= 127.0f) return __fmul_rn(j, __uint_as_float((u32)(k + 127) << 23));
    return __double2float_rn(__dmul_rn((double)j, __longlong_as_double((i64)(k + 1023) << 52)));
}

// silu::vector_exp, one lane of ggml's AVX-512 `ggml_v_expf` (constants as f32 bit patterns).
__device__ __forceinline__ float exact_vector_exp(float x) {
    const float shift = __uint_as_float(0x4b400000u);     // 0x1.8p23
    const float log2_e = __uint_as_float(0x3fb8aa3bu);    // 0x1.715476p+0
    const float ln2_high = __uint_as_float(0x3f317200u);  // 0x1.62e4p-1
    const float ln2_low = __uint_as_float(0x35bfbe8eu);   // 0x1.7f7d1cp-20
    const float c5 = __uint_as_float(0x3c072010u), c4 = __uint_as_float(0x3d2b9f17u);
    const float c3 = __uint_as_float(0x3e2aaf33u), c2 = __uint_as_float(0x3efffedbu);
    const float c1 = __uint_as_float(0x3f7ffff6u);
    const float z = __fmaf_rn(x, log2_e, shift);
    const float n = __fsub_rn(z, shift);
    const float b = __fmaf_rn(-n, ln2_low, __fmaf_rn(-n, ln2_high, x));
    const float u = __fmul_rn(b, b);
    const float j = __fmaf_rn(__fmaf_rn(__fmaf_rn(c5, b, c4), u, __fmaf_rn(c3, b, c2)), u, __fmaf_rn(c1, b, 1.0f));
    if (fabsf(n) > 192.0f) return n <= 0.0f ? 0.0f : positive_infinity();
    return exact_scale_by_power_of_two(j, n);
}

// silu::vector_silu: x / (1 + v_expf(0 - x)).
__device__ __forceinline__ float exact_vector_silu(float x) {
    return __fdiv_rn(x, __fadd_rn(1.0f, exact_vector_exp(__fsub_rn(0.0f, x))));
}

// silu::scalar_silu (ggml_silu_f32): x / (1 + expf(-x)) with libm's expf.
__device__ __forceinline__ float exact_scalar_silu(float x) {
    return __fdiv_rn(x, __fadd_rn(1.0f, exact_expf(-x)));
}

// ---------------------------------------------------------------------------------------
// Native f16 arithmetic (crates/quant/src/dot/half_arith.rs): its fma, add and mul are the
// correctly rounded f16 (nearest even, subnormals kept) of the exact result, which is what
// PTX's .rn f16 instructions compute. A NaN result may carry another payload (the Rust code
// returns 0x7e00); it stays a NaN either way.

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

__device__ __forceinline__ u16 half_mul(u16 a, u16 b) {
    u16 r;
    asm("mul.rn.f16 %0, %1, %2;" : "=h"(r) : "h"(a), "h"(b));
    return r;
}

// The value an f16 holds after storing x in it (nearest even, as half's f16::from_f32).
__device__ __forceinline__ float round_to_half(float x) { return half_to_float(float_to_half(x)); }

// ggml's f16 kernels on the reference machine (AVX512-FP16) run the first n - n % 128
// elements of a row in native f16 (half_arith::body_len).
constexpr u32 HALF_STEP = 128;

// ---------------------------------------------------------------------------------------
// Vector kernels (crates/backend-cpu/src/vector/mod.rs).

// vector::sum_squares: each square rounded to f32, added in order to an f64.
__device__ __forceinline__ double exact_sum_squares(const float* x, u32 n) {
    double sum = 0.0;
    for (u32 i = 0; i < n; i++) sum = __dadd_rn(sum, (double)__fmul_rn(x[i], x[i]));
    return sum;
}

// vector::reduce of eight f64 partial sums held by lanes 0..7 (one each):
// ((0 + 4) + (2 + 6)) + ((1 + 5) + (3 + 7)), in lane 0.
__device__ __forceinline__ double reduce_eight_lanes(double partial) {
    partial = __dadd_rn(partial, __shfl_down_sync(ALL_LANES, partial, 4));
    partial = __dadd_rn(partial, __shfl_down_sync(ALL_LANES, partial, 2));
    return __dadd_rn(partial, __shfl_down_sync(ALL_LANES, partial, 1));
}

// Warp. vector::dot_f32 (scalar twin): products rounded to f32, lane i % 8 of eight f64
// partial sums takes element i of the first n - n % 8, then the reduce, then the rest in
// order; rounded to f32. Every lane gets the result.
__device__ float exact_dot_f32(const float* a, const float* b, u32 n) {
    const u32 lane = threadIdx.x & 31;
    const u32 body = n / 8 * 8;
    double partial = 0.0;
    if (lane < 8)
        for (u32 i = lane; i < body; i += 8) partial = __dadd_rn(partial, (double)__fmul_rn(a[i], b[i]));
    double sum = reduce_eight_lanes(partial);
    if (lane == 0)
        for (u32 i = body; i < n; i++) sum = __dadd_rn(sum, (double)__fmul_rn(a[i], b[i]));
    return __shfl_sync(ALL_LANES, __double2float_rn(sum), 0);
}

// Warp. vector::dot_f16 of the query `a` rounded to f16 (vector::to_f16; rounded here on
// every read, the same values) and the f16 row `b`. From 128 elements on, the first
// n - n % 128 go through half_arith::dot_body: 128 f16 accumulators, lane q holding those of
// elements q, 32 + q, 64 + q, 96 + q of each step (the four registers' lane q), one fma.rn.f16
// each; then registers 0 + 2 and 1 + 3, their sum, and gcc's _mm512_reduce_add_ph (16 + 16,
// 8 + 8, 4 + 4, then (0 + 2) + (1 + 3)), all in f16. That f16 starts the f64 sum of the
// remaining exact products. Below 128 elements: the f64 lanes of exact_dot_f32 (f16 products
// are exact in f32). Every lane gets the result.
__device__ float exact_dot_f16(const float* a, const u16* b, u32 n) {
    const u32 lane = threadIdx.x & 31;
    const u32 native = n - n % HALF_STEP;
    double sum;
    u32 rest;
    if (native > 0) {
        u16 acc[4] = {0, 0, 0, 0};
        for (u32 step = 0; step < native; step += HALF_STEP) {
#pragma unroll
            for (u32 r = 0; r < 4; r++) {
                const u32 i = step + 32 * r + lane;
                acc[r] = half_fma(float_to_half(a[i]), b[i], acc[r]);
            }
        }
        u16 total = half_add(half_add(acc[0], acc[2]), half_add(acc[1], acc[3]));
#pragma unroll
        for (u32 offset = 16; offset > 0; offset >>= 1)
            total = half_add(total, (u16)__shfl_down_sync(ALL_LANES, (u32)total, offset));
        sum = (double)half_to_float(total);
        rest = native;
    } else {
        const u32 body = n / 8 * 8;
        double partial = 0.0;
        if (lane < 8)
            for (u32 i = lane; i < body; i += 8)
                partial = __dadd_rn(partial, (double)__fmul_rn(round_to_half(a[i]), half_to_float(b[i])));
        sum = reduce_eight_lanes(partial);
        rest = body;
    }
    if (lane == 0)
        for (u32 i = rest; i < n; i++)
            sum = __dadd_rn(sum, (double)__fmul_rn(round_to_half(a[i]), half_to_float(b[i])));
    return __shfl_sync(ALL_LANES, __double2float_rn(sum), 0);
}

// The dot of one-chunk attention: f16 keys take dot_f16, f32 keys dot_f32.
__device__ __forceinline__ float exact_key_dot(const float* query, const u16* key, u32 n) {
    return exact_dot_f16(query, key, n);
}
__device__ __forceinline__ float exact_key_dot(const float* query, const float* key, u32 n) {
    return exact_dot_f32(query, key, n);
}

__device__ __forceinline__ float cache_value(const u16* cache, u64 index) { return half_to_float(cache[index]); }
__device__ __forceinline__ float cache_value(const float* cache, u64 index) { return cache[index]; }

// Element i of vector::scale_f16 / vector::mad_f16 on an f16 accumulator held as f32 values
// (each one an f16 value, so converting it to f16 is exact). `native`: i < n - n % 128.
__device__ __forceinline__ float exact_scale_f16_element(float y, float v, bool native) {
    if (native) return half_to_float(half_mul(float_to_half(y), float_to_half(v)));
    return round_to_half(__fmul_rn(y, v));
}
__device__ __forceinline__ float exact_mad_f16_element(float y, u16 x, float v, bool native) {
    if (native) return half_to_float(half_fma(x, float_to_half(v), float_to_half(y)));
    return round_to_half(__fmaf_rn(half_to_float(x), v, y));
}

// Warp. `acc *= v` for this lane's elements of a one-chunk accumulator: scale_f16 when the V
// cache is f16 (`half`), scale_f32 otherwise.
__device__ __forceinline__ void exact_scale_accumulator(float* acc, u32 n, float v, bool half) {
    const u32 native = n - n % HALF_STEP;
    for (u32 i = threadIdx.x & 31; i < n; i += 32)
        acc[i] = half ? exact_scale_f16_element(acc[i], v, i < native) : __fmul_rn(acc[i], v);
}

// Warp. `acc += value * v` for this lane's elements: mad_f16 (f16 V cache) or mad_f32.
__device__ __forceinline__ void exact_mad_accumulator(float* acc, const u16* value, u32 n, float v) {
    const u32 native = n - n % HALF_STEP;
    for (u32 i = threadIdx.x & 31; i < n; i += 32) acc[i] = exact_mad_f16_element(acc[i], value[i], v, i < native);
}
__device__ __forceinline__ void exact_mad_accumulator(float* acc, const float* value, u32 n, float v) {
    for (u32 i = threadIdx.x & 31; i < n; i += 32) acc[i] = __fmaf_rn(value[i], v, acc[i]);
}

template <typename T> struct IsHalfCache { static constexpr bool value = false; };
template <> struct IsHalfCache<u16> { static constexpr bool value = true; };

// ---------------------------------------------------------------------------------------
// Row and element ops.

// Warp. norm.rs normalize_row and rms_norm_in_place for one row of `width` values (`out` may
// be `x`: lane 0 has read the whole row before the broadcast, the others write after it):
// mean = f32(sum_squares / width), scale = 1 / sqrt(mean + eps), out = (x * scale) * w.
__device__ void exact_rms_norm_row(const float* x, const float* weight, u32 width, float eps, float* out) {
    const u32 lane = threadIdx.x & 31;
    float scale = 0.0f;
    if (lane == 0) {
        const float mean = __double2float_rn(__ddiv_rn(exact_sum_squares(x, width), (double)width));
        scale = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(mean, eps)));
    }
    scale = __shfl_sync(ALL_LANES, scale, 0);
    for (u32 i = lane; i < width; i += 32) out[i] = __fmul_rn(__fmul_rn(x[i], scale), weight[i]);
}

// Values per SwiGLU group (ggml's AVX-512 lanes, vector::SILU_GROUP).
constexpr u64 SILU_GROUP = 16;

// One element of vector::silu_mul: silu(gate) * up, silu by ggml's polynomial when the element
// lies in a whole group of 16 (`grouped`), else by the scalar SiLU with libm's expf.
__device__ __forceinline__ float exact_swiglu(float gate, float up, bool grouped) {
    return __fmul_rn(grouped ? exact_vector_silu(gate) : exact_scalar_silu(gate), up);
}

// rope.rs rotate_pair: x0 cos - x1 sin and x0 sin + x1 cos, the first product of each fused.
__device__ __forceinline__ void exact_rotate_pair(float* x0, float* x1, float cos, float sin) {
    const float a = *x0, b = *x1;
    *x0 = __fmaf_rn(a, cos, -__fmul_rn(b, sin));
    *x1 = __fmaf_rn(a, sin, __fmul_rn(b, cos));
}

// ---------------------------------------------------------------------------------------
// Attention (crates/backend-cpu/src/ops/attention): one query row and head over the keys at
// positions first ..= position of its span. `keys` and `values` point at this head's KV head
// in cell 0 (kv_head * head_dim); a cell's row starts kv_width further per cell. `out` is
// the row's output [head_dim], used as the accumulator.

// The cache offset of position `p` of `span` (SequenceSpan::cell).
__device__ __forceinline__ u64 exact_cell_offset(const i32* step, const StepHeader* h, i32 span, i32 p, u64 kv_width) {
    return (u64)step_cell(step, h, span, p) * kv_width;
}

// Warp. chunk.rs one_head: per key, the dot (Q rounded to f16 for f16 keys), the online
// softmax in f32 with libm's expf (a new maximum rescales what was accumulated), V
// accumulated in the V cache's type (f16 rounding at every step for an f16 cache) and
// `sum = fma(sum, rescale, weight)`; at the end everything times 1 / sum (0 for a zero sum).
// The AVX2 group kernel (chunk/group.rs) gives the same bits.
template <typename K, typename V>
__device__ void exact_attention_one_head(const float* query, const K* keys, const V* values, const i32* step,
                                         const StepHeader* h, i32 span, u64 kv_width, u32 head_dim, float scale,
                                         i32 first, i32 position, float* out) {
    const bool half = IsHalfCache<V>::value;
    for (u32 i = threadIdx.x & 31; i < head_dim; i += 32) out[i] = 0.0f;
    float max = negative_infinity();
    float sum = 0.0f;
    for (i32 p = first; p <= position; p++) {
        const u64 at = exact_cell_offset(step, h, span, p, kv_width);
        const float score = __fmul_rn(exact_key_dot(query, keys + at, head_dim), scale);
        float rescale = 1.0f, weight = 1.0f;
        if (score > max) {
            rescale = exact_expf(__fsub_rn(max, score));
            max = score;
            exact_scale_accumulator(out, head_dim, rescale, half);
        } else {
            weight = exact_expf(__fsub_rn(score, max));
        }
        exact_mad_accumulator(out, values + at, head_dim, weight);
        sum = __fmaf_rn(sum, rescale, weight);
    }
    const float inverse = sum == 0.0f ? 0.0f : __fdiv_rn(1.0f, sum);
    for (u32 i = threadIdx.x & 31; i < head_dim; i += 32) out[i] = __fmul_rn(out[i], inverse);
}

// Keys per tile of the tiled path (ggml's KV tile), aligned to multiples of 64 positions.
constexpr i32 KEY_TILE = 64;

// Warp. gcc's _mm512_reduce_add_ps of the 16 values held by lanes 16 g .. 16 g + 15 (one
// each): halves i + (i + 8), quarters i + (i + 4), then (0 + 2) + (1 + 3); in lane 16 g.
__device__ __forceinline__ float exact_reduce_add_16(float v) {
    v = __fadd_rn(v, __shfl_down_sync(ALL_LANES, v, 8, 16));
    v = __fadd_rn(v, __shfl_down_sync(ALL_LANES, v, 4, 16));
    v = __fadd_rn(v, __shfl_down_sync(ALL_LANES, v, 2, 16));
    return __fadd_rn(v, __shfl_down_sync(ALL_LANES, v, 1, 16));
}

// Warp. tiled.rs `tile` for one query row: keys in tiles of 64 positions (tile t covers
// 64 t .. 64 t + 63; the row's result depends only on its own visible keys per tile, not on
// the other rows of ggml's query tile). Per tile: each score one f32 FMA chain over the head
// dimension from 0 (K widened to f32), times scale, -inf where not visible; a tile without a
// visible finite maximum changes nothing; else a new maximum rescales the accumulator and
// the sum by libm's expf, the tile's exponentials are ggml's polynomial exp (soft_max_f32:
// four groups of 16, each summed in f32 in _mm512_reduce_add_ps order, added to an f64 from
// 0), sum = f32(f64(sum) + that), and V is accumulated with f32 FMAs key by key in order,
// zero weights skipped. Lane l holds the scores of keys l and l + 32 of the tile.
template <typename K, typename V>
__device__ void exact_attention_tiled_row(const float* query, const K* keys, const V* values, const i32* step,
                                          const StepHeader* h, i32 span, u64 kv_width, u32 head_dim, float scale,
                                          i32 first, i32 position, float* out) {
    const u32 lane = threadIdx.x & 31;
    for (u32 i = lane; i < head_dim; i += 32) out[i] = 0.0f;
    float max = negative_infinity();
    float sum = 0.0f;
    for (i32 start = first / KEY_TILE * KEY_TILE; start <= position; start += KEY_TILE) {
        float scores[2];
#pragma unroll
        for (u32 part = 0; part < 2; part++) {
            const i32 p = start + (i32)(lane + 32 * part);
            scores[part] = negative_infinity();
            if (p >= first && p <= position) {
                const u64 at = exact_cell_offset(step, h, span, p, kv_width);
                float dot = 0.0f;
                for (u32 d = 0; d < head_dim; d++) dot = __fmaf_rn(cache_value(keys, at + d), query[d], dot);
                scores[part] = __fmul_rn(dot, scale);
            }
        }
        // f32::max and fmaxf both pass over NaNs; the sign of a zero maximum changes no
        // result below, so the order of this reduction does not matter.
        const float tile_max = warp_max(fmaxf(scores[0], scores[1]));
        if (tile_max == negative_infinity()) continue;
        const float new_max = fmaxf(max, tile_max);
        if (new_max > max) {
            const float rescale = exact_expf(__fsub_rn(max, new_max));
            for (u32 i = lane; i < head_dim; i += 32) out[i] = __fmul_rn(out[i], rescale);
            sum = __fmul_rn(sum, rescale);
        }
        max = new_max;
        const float weights[2] = {exact_vector_exp(__fsub_rn(scores[0], new_max)),
                                  exact_vector_exp(__fsub_rn(scores[1], new_max))};
        const float low = exact_reduce_add_16(weights[0]), high = exact_reduce_add_16(weights[1]);
        double total = 0.0;
        total = __dadd_rn(total, (double)__shfl_sync(ALL_LANES, low, 0));
        total = __dadd_rn(total, (double)__shfl_sync(ALL_LANES, low, 16));
        total = __dadd_rn(total, (double)__shfl_sync(ALL_LANES, high, 0));
        total = __dadd_rn(total, (double)__shfl_sync(ALL_LANES, high, 16));
        sum = __double2float_rn(__dadd_rn((double)sum, total));
        // Keys that are not visible have weight exp(-inf) = 0 and are skipped like any zero.
        for (i32 key = 0; key < KEY_TILE; key++) {
            const float weight = __shfl_sync(ALL_LANES, key < 32 ? weights[0] : weights[1], key & 31);
            const i32 p = start + key;
            if (weight == 0.0f || p < first || p > position) continue;
            const u64 at = exact_cell_offset(step, h, span, p, kv_width);
            for (u32 i = lane; i < head_dim; i += 32) out[i] = __fmaf_rn(cache_value(values, at + i), weight, out[i]);
        }
    }
    const float inverse = sum == 0.0f ? 0.0f : __fdiv_rn(1.0f, sum);
    for (u32 i = lane; i < head_dim; i += 32) out[i] = __fmul_rn(out[i], inverse);
}

// ---------------------------------------------------------------------------------------
// Mixture-of-experts routing (crates/backend/src/moe.rs route_tokens).

// The key under which f32 values order as Rust's f32::total_cmp orders them, as signed ints.
__device__ __forceinline__ i32 total_order_key(float v) {
    const i32 bits = __float_as_int(v);
    return bits ^ (i32)(((u32)(bits >> 31)) >> 1);
}

// True when expert a (probability key ka) sorts before expert b in route_tokens' order:
// probabilities descending by total_cmp, equal ones by the lower index.
__device__ __forceinline__ bool routes_before(i32 ka, u32 a, i32 kb, u32 b) {
    return ka > kb || (ka == kb && a < b);
}

// route_tokens for one token's `experts` logits: p = expf(l - max) (max by f32::max from
// -inf), their f64 sum in order, each p times the f32 of 1 / sum; the `used` first experts in
// routes_before order; their f64 sum in that order, rounded to f32, divides them when
// `renormalise`. Writes ids[0..used] and weights[0..used] ordered by expert index (the order
// in which the CPU adds the experts' outputs, as moe.cu's moe_route). A probability is
// recomputed where needed instead of stored (the same operations give the same bits).
__device__ void exact_route_token(const float* logits, u32 experts, u32 used, bool renormalise, u32* ids,
                                  float* weights) {
    float max = negative_infinity();
    for (u32 e = 0; e < experts; e++) max = fmaxf(max, logits[e]);
    double sum = 0.0;
    for (u32 e = 0; e < experts; e++) sum = __dadd_rn(sum, (double)exact_expf(__fsub_rn(logits[e], max)));
    const float inverse = __double2float_rn(__ddiv_rn(1.0, sum));
    auto probability = [&](u32 e) { return __fmul_rn(exact_expf(__fsub_rn(logits[e], max)), inverse); };
    // Pick k is the first expert in routes_before order after pick k - 1.
    double total = 0.0;
    u32 last = experts;
    i32 last_key = 0;
    for (u32 k = 0; k < used; k++) {
        u32 best = experts;
        i32 best_key = 0;
        for (u32 e = 0; e < experts; e++) {
            const i32 key = total_order_key(probability(e));
            if (last != experts && !routes_before(last_key, last, key, e)) continue;
            if (best == experts || routes_before(key, e, best_key, best)) {
                best = e;
                best_key = key;
            }
        }
        const float p = probability(best);
        ids[k] = best;
        weights[k] = p;
        total = __dadd_rn(total, (double)p);
        last = best;
        last_key = best_key;
    }
    const float chosen = __double2float_rn(total);
    if (renormalise)
        for (u32 k = 0; k < used; k++) weights[k] = __fdiv_rn(weights[k], chosen);
    for (u32 k = 1; k < used; k++) {
        const u32 id = ids[k];
        const float w = weights[k];
        u32 j = k;
        for (; j > 0 && ids[j - 1] > id; j--) {
            ids[j] = ids[j - 1];
            weights[j] = weights[j - 1];
        }
        ids[j] = id;
        weights[j] = w;
    }
}
