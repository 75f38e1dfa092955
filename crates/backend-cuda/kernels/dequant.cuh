// Dequantization of every weight type, eight consecutive elements at a time, bit for bit as
// the CPU reference (crates/quant/src/dequant) computes them: products and sums are rounded
// separately (__fmul_rn / __fadd_rn), never fused, so embeddings match exactly.
//
// Each type is a struct with QK (elements per block), BYTES (bytes per block) and
//   dequant8(block, c, v): v[0..8] = elements 8c .. 8c+7 of the block (c < QK / 8).
// Float types (F32, F16, BF16) have element(row, i) instead; dequant_group() at the end reads
// group g of a row for any type (a float row's last group may be partial).
#pragma once
#include "quant_blocks.cuh"

// Little-endian loads from block bytes of the alignment the format guarantees.
__device__ __forceinline__ u16 load_u16(const u8* p) { return *(const u16*)p; }
__device__ __forceinline__ float load_half(const u8* p) { return half_to_float(load_u16(p)); }
__device__ __forceinline__ u32 load_u32_a2(const u8* p) {
    const u16* h = (const u16*)p;
    return (u32)h[0] | ((u32)h[1] << 16);
}
__device__ __forceinline__ u32 load_u32_a4(const u8* p) { return *(const u32*)p; }
// Bytes p[0..8] as one little-endian word: one load where p is 8-byte aligned, four 16-bit
// loads where it is 2-byte aligned (instead of eight byte loads).
__device__ __forceinline__ u64 load_8_a8(const u8* p) { return *(const u64*)p; }
__device__ __forceinline__ u64 load_8_a2(const u8* p) {
    const u16* h = (const u16*)p;
    return (u64)h[0] | ((u64)h[1] << 16) | ((u64)h[2] << 32) | ((u64)h[3] << 48);
}
// Byte i of a word from load_8_*.
__device__ __forceinline__ int byte_at(u64 bytes, int i) { return (int)((bytes >> (8 * i)) & 0xff); }

// (x * d) + m with both steps rounded, as the CPU computes `q * d + m`.
__device__ __forceinline__ float mul_add_rn(float x, float d, float m) { return __fadd_rn(__fmul_rn(x, d), m); }
__device__ __forceinline__ float mul_sub_rn(float d, float x, float m) { return __fsub_rn(__fmul_rn(d, x), m); }

// Scale and min of sub-block j (0..8) of Q4_K/Q5_K from the 12 packed bytes. Branch-free
// (selects), so that the loads of neighbouring calls can be scheduled together.
__device__ __forceinline__ void scale_min_k4(int j, const u8* packed, int* scale, int* min) {
    const bool low = j < 4;
    const int at_j = packed[j], at_next = packed[j + 4], at_previous = packed[low ? j : j - 4];
    *scale = low ? (at_j & 63) : ((at_next & 0x0f) | ((at_previous >> 6) << 4));
    *min = low ? (at_next & 63) : ((at_next >> 4) | ((at_j >> 6) << 4));
}

// Signed scale of sub-block j (0..16) of Q3_K from the 12 packed bytes (bias 32 removed).
__device__ __forceinline__ int q3_k_scale(int j, const u8* packed) {
    const int low = (packed[j & 7] >> (j < 8 ? 0 : 4)) & 0x0f;
    const int high = (packed[8 + (j & 3)] >> (2 * (j >> 2))) & 3;
    return (low | (high << 4)) - 32;
}

// The 4 nibble values (0..15, one per byte of x) looked up in IQ4_NL_VALUES, as 4 int8.
__device__ __forceinline__ int iq4_lookup(u32 x) {
    // IQ4_NL_VALUES packed little-endian, four entries per word.
    const u32 t0 = 0xBFAD9881u, t1 = 0xF6EADDCFu, t2 = 0x26190D01u, t3 = 0x71594535u;
    u32 sel = x & 0x07070707u;
    sel |= sel >> 4;
    sel = (sel & 0xFFu) | ((sel >> 8) & 0xFF00u);
    const u32 low = __byte_perm(t0, t1, sel);
    const u32 high = __byte_perm(t2, t3, sel);
    const u32 upper = ((x >> 3) & 0x01010101u) * 0xFFu;
    return (int)((low & ~upper) | (high & upper));
}

// IQ4_NL_VALUES of the nibbles at `shift` of bytes qs[0..8], as 8 floats times d (rounded
// products, as the CPU's d * value).
__device__ __forceinline__ void iq4_dequant8(const u8* qs, int shift, float d, float* v) {
#pragma unroll
    for (int k = 0; k < 2; k++) {
        u32 x = 0;
#pragma unroll
        for (int j = 0; j < 4; j++) x |= (u32)((qs[4 * k + j] >> shift) & 15) << (8 * j);
        const int values = iq4_lookup(x);
#pragma unroll
        for (int j = 0; j < 4; j++) v[4 * k + j] = __fmul_rn(d, (float)(i8)(values >> (8 * j)));
    }
}

// Q4_0: x = d * (q - 8); byte j holds element j (low nibble) and j + 16 (high nibble).
struct Q4_0 {
    static constexpr int QK = 32, BYTES = 18;
    static __device__ __forceinline__ void dequant8(const u8* b, int c, float* v) {
        const float d = load_half(b);
        const u64 qs = load_8_a2(b + 2 + 8 * (c & 1));
        const int shift = (c >> 1) * 4;
#pragma unroll
        for (int i = 0; i < 8; i++) v[i] = __fmul_rn((float)(((byte_at(qs, i) >> shift) & 15) - 8), d);
    }
};

// Q4_1: x = d * q + m.
struct Q4_1 {
    static constexpr int QK = 32, BYTES = 20;
    static __device__ __forceinline__ void dequant8(const u8* b, int c, float* v) {
        const float d = load_half(b), m = load_half(b + 2);
        const u64 qs = load_8_a2(b + 4 + 8 * (c & 1));
        const int shift = (c >> 1) * 4;
#pragma unroll
        for (int i = 0; i < 8; i++) v[i] = mul_add_rn((float)((byte_at(qs, i) >> shift) & 15), d, m);
    }
};

// The five-bit value of element e (0..32) of a Q5 block: nibble of qs plus bit e of qh.
__device__ __forceinline__ int q5_value(const u8* qs, u32 qh, int e) {
    const int j = e & 15;
    const int nibble = e < 16 ? (qs[j] & 15) : (qs[j] >> 4);
    return nibble | (((qh >> e) & 1) << 4);
}

// Q5_0: x = d * (q - 16).
struct Q5_0 {
    static constexpr int QK = 32, BYTES = 22;
    static __device__ __forceinline__ void dequant8(const u8* b, int c, float* v) {
        const float d = load_half(b);
        const u32 qh = load_u32_a2(b + 2);
#pragma unroll
        for (int i = 0; i < 8; i++) v[i] = __fmul_rn((float)(q5_value(b + 6, qh, 8 * c + i) - 16), d);
    }
};

// Q5_1: x = d * q + m.
struct Q5_1 {
    static constexpr int QK = 32, BYTES = 24;
    static __device__ __forceinline__ void dequant8(const u8* b, int c, float* v) {
        const float d = load_half(b), m = load_half(b + 2);
        const u32 qh = load_u32_a4(b + 4);
#pragma unroll
        for (int i = 0; i < 8; i++) v[i] = mul_add_rn((float)q5_value(b + 8, qh, 8 * c + i), d, m);
    }
};

// Q8_0: x = d * q.
struct Q8_0 {
    static constexpr int QK = 32, BYTES = 34;
    static __device__ __forceinline__ void dequant8(const u8* b, int c, float* v) {
        const float d = load_half(b);
        const u64 qs = load_8_a2(b + 2 + 8 * c);
#pragma unroll
        for (int i = 0; i < 8; i++) v[i] = __fmul_rn((float)(i8)byte_at(qs, i), d);
    }
};

// IQ4_NL: x = d * IQ4_NL_VALUES[q], nibbles laid out as Q4_0.
struct IQ4_NL {
    static constexpr int QK = 32, BYTES = 18;
    static __device__ __forceinline__ void dequant8(const u8* b, int c, float* v) {
        const float d = load_half(b);
        iq4_dequant8(b + 2 + 8 * (c & 1), (c >> 1) * 4, d, v);
    }
};

// The 2/3/6-bit K formats: element e = 128 h + 32 g + k of a super-block sits at bits
// 2g..2g+2 of byte k (k < 32) of half h's 32-byte run; group c = e / 8 gives h, g and k0.
struct KGroup {
    int h, g, k0;
    __device__ __forceinline__ KGroup(int c) : h(c >> 4), g((c >> 2) & 3), k0(8 * (c & 3)) {}
};

// Q2_K: x = d * (sc & 15) * q - dmin * (sc >> 4) per 16-element sub-block.
struct Q2_K {
    static constexpr int QK = 256, BYTES = 84;
    static __device__ __forceinline__ void dequant8(const u8* b, int c, float* v) {
        const KGroup at(c);
        const float d = load_half(b + 80), dmin = load_half(b + 82);
        const int sc = b[8 * at.h + 2 * at.g + (at.k0 >> 4)];
        const float dl = __fmul_rn(d, (float)(sc & 15)), ml = __fmul_rn(dmin, (float)(sc >> 4));
        const u64 qs = load_8_a2(b + 16 + 32 * at.h + at.k0);
#pragma unroll
        for (int i = 0; i < 8; i++) v[i] = mul_sub_rn(dl, (float)((byte_at(qs, i) >> (2 * at.g)) & 3), ml);
    }
};

// Q3_K: x = d * scale * (q - 4 * !h), h the element's bit 4h+g in hmask[k].
struct Q3_K {
    static constexpr int QK = 256, BYTES = 110;
    static __device__ __forceinline__ void dequant8(const u8* b, int c, float* v) {
        const KGroup at(c);
        const float d = load_half(b + 108);
        const float dl = __fmul_rn(d, (float)q3_k_scale(8 * at.h + 2 * at.g + (at.k0 >> 4), b + 96));
        const u64 qs = load_8_a2(b + 32 + 32 * at.h + at.k0);
        const u64 hmask = load_8_a2(b + at.k0);
        const int bit = 4 * at.h + at.g;
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const int low = (byte_at(qs, i) >> (2 * at.g)) & 3;
            const int offset = ((byte_at(hmask, i) >> bit) & 1) ? 0 : 4;
            v[i] = __fmul_rn(dl, (float)(low - offset));
        }
    }
};

// Q4_K: element 64 p + 32 s + l is nibble s of qs[32 p + l]; x = d * sc * q - dmin * m.
struct Q4_K {
    static constexpr int QK = 256, BYTES = 144;
    static __device__ __forceinline__ void dequant8(const u8* b, int c, float* v) {
        const int pair = c >> 3, s = (c >> 2) & 1, l0 = 8 * (c & 3);
        int scale, min;
        scale_min_k4(2 * pair + s, b + 4, &scale, &min);
        const float dl = __fmul_rn(load_half(b), (float)scale);
        const float ml = __fmul_rn(load_half(b + 2), (float)min);
        const u64 qs = load_8_a8(b + 16 + 32 * pair + l0);
#pragma unroll
        for (int i = 0; i < 8; i++) v[i] = mul_sub_rn(dl, (float)((byte_at(qs, i) >> (4 * s)) & 15), ml);
    }
};

// Q5_K: Q4_K plus a fifth bit, bit 2 p + s of qh[l].
struct Q5_K {
    static constexpr int QK = 256, BYTES = 176;
    static __device__ __forceinline__ void dequant8(const u8* b, int c, float* v) {
        const int pair = c >> 3, s = (c >> 2) & 1, l0 = 8 * (c & 3);
        int scale, min;
        scale_min_k4(2 * pair + s, b + 4, &scale, &min);
        const float dl = __fmul_rn(load_half(b), (float)scale);
        const float ml = __fmul_rn(load_half(b + 2), (float)min);
        const u64 qh = load_8_a8(b + 16 + l0);
        const u64 qs = load_8_a8(b + 48 + 32 * pair + l0);
        const int bit = 2 * pair + s;
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const int q = ((byte_at(qs, i) >> (4 * s)) & 15) | (((byte_at(qh, i) >> bit) & 1) << 4);
            v[i] = mul_sub_rn(dl, (float)q, ml);
        }
    }
};

// Q6_K: element 128 h + 32 g + l: low nibble of ql[64 h + l] (g 0), ql[64 h + 32 + l] (g 1),
// their high nibbles (g 2, 3); top two bits at bits 2g of qh[32 h + l]; x = d * sc * (q - 32).
struct Q6_K {
    static constexpr int QK = 256, BYTES = 210;
    static __device__ __forceinline__ void dequant8(const u8* b, int c, float* v) {
        const KGroup at(c);
        const float d = load_half(b + 208);
        const i8 sc = (i8)b[192 + 8 * at.h + (at.k0 >> 4) + 2 * at.g];
        const float dl = __fmul_rn(d, (float)sc);
        const u64 ql = load_8_a2(b + 64 * at.h + 32 * (at.g & 1) + at.k0);
        const u64 qh = load_8_a2(b + 128 + 32 * at.h + at.k0);
        const int nibble_shift = 4 * (at.g >> 1);
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const int q = ((byte_at(ql, i) >> nibble_shift) & 15) | (((byte_at(qh, i) >> (2 * at.g)) & 3) << 4);
            v[i] = __fmul_rn(dl, (float)(q - 32));
        }
    }
};

// IQ4_XS: x = d * (ls - 32) * IQ4_NL_VALUES[q] per 32-element sub-block ib; element
// 32 ib + 16 s + j is nibble s of qs[16 ib + j].
struct IQ4_XS {
    static constexpr int QK = 256, BYTES = 136;
    static __device__ __forceinline__ void dequant8(const u8* b, int c, float* v) {
        const int ib = c >> 2, s = (c >> 1) & 1, j0 = 8 * (c & 1);
        const int low = (b[4 + (ib >> 1)] >> (4 * (ib & 1))) & 15;
        const int high = (load_u16(b + 2) >> (2 * ib)) & 3;
        const float dl = __fmul_rn(load_half(b), (float)((low | (high << 4)) - 32));
        iq4_dequant8(b + 8 + 16 * ib + j0, 4 * s, dl, v);
    }
};

// Float weights: element i of a row.
struct F32 {
    static __device__ __forceinline__ float element(const u8* row, u64 i) { return ((const float*)row)[i]; }
};
struct F16 {
    static __device__ __forceinline__ float element(const u8* row, u64 i) { return half_to_float(((const u16*)row)[i]); }
};
struct BF16 {
    static __device__ __forceinline__ float element(const u8* row, u64 i) { return bf16_to_float(((const u16*)row)[i]); }
};

// True for the float types (element-wise access, any row length).
template <class W> struct IsFloat { static constexpr bool value = false; };
template <> struct IsFloat<F32> { static constexpr bool value = true; };
template <> struct IsFloat<F16> { static constexpr bool value = true; };
template <> struct IsFloat<BF16> { static constexpr bool value = true; };

// Elements 8 g .. 8 g + 7 of a row of `width` elements (row = its first byte); returns how
// many are valid (fewer than 8 only for a float row's last group).
template <class W>
__device__ __forceinline__ int dequant_group(const u8* row, u64 width, u64 g, float* v) {
    if constexpr (IsFloat<W>::value) {
        const u64 first = 8 * g;
        const int valid = width - first < 8 ? (int)(width - first) : 8;
#pragma unroll
        for (int i = 0; i < 8; i++) v[i] = i < valid ? W::element(row, first + i) : 0.0f;
        return valid;
    } else {
        constexpr int GROUPS = W::QK / 8;
        W::dequant8(row + (g / GROUPS) * W::BYTES, (int)(g % GROUPS), v);
        return 8;
    }
}
