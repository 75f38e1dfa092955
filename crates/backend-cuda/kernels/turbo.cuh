// TurboQuant's cache layout (runit_backend::turbo), shared by the kernels that read it:
// kernels/turbo.cu (the row writer and the attention that repeats the CPU's arithmetic) and
// kernels/attention.cu (the fast attention, `TurboKv`).
//
// A block of 64 values (TQ_BLOCK) is: the f16 norm, for keys with a sketch the f16 residual
// norm, the outliers' f16 values, the packed codes (code i at bit i * bits, little-endian),
// for a sketch the 64 sign bits; a row is its blocks, then the outliers' 6-bit indices, padded
// to 4 bytes.
#pragma once
#include "common.cuh"

#define TQ_BLOCK 64
#define TQ_OUTLIERS 2
#define TQ_INDEX_BITS 6

// The tables uploaded by the backend (src/ops/turbo.rs `tables`): 4-bit centroids and
// thresholds, 3-bit centroids and thresholds, the sketch's factor.
#define TQ_CENTROIDS4 0
#define TQ_THRESHOLDS4 16
#define TQ_CENTROIDS3 32
#define TQ_THRESHOLDS3 40
#define TQ_SKETCH_FACTOR 48

// The byte layout of a block (runit_backend::turbo::TurboLayout with two outliers).
struct TqLayout {
    u32 bits;    // bits of a code
    u32 sketch;  // 1: residual norm and sign sketch
    __device__ u32 header() const { return sketch ? 4 : 2; }
    __device__ u32 code_offset() const { return header() + 2 * TQ_OUTLIERS; }
    __device__ u32 sign_offset() const { return code_offset() + TQ_BLOCK * bits / 8; }
    __device__ u32 block_bytes() const { return sign_offset() + (sketch ? 8 : 0); }
    __device__ u32 index_bytes(u32 blocks) const { return (blocks * TQ_OUTLIERS * TQ_INDEX_BITS + 7) / 8; }
    // Rows are padded to 4 bytes (attention_decode_tq_codes copies them in words).
    __device__ u64 row_bytes(u32 blocks) const { return ((u64)blocks * block_bytes() + index_bytes(blocks) + 3) & ~3ull; }
    __device__ const float* centroids(const float* tables) const {
        return tables + (bits == 4 ? TQ_CENTROIDS4 : TQ_CENTROIDS3);
    }
};

// The seeded signs of a block's rotation (which = 0) or sketch (which = 1) diagonal: bit i
// set means -1 at coordinate i (turbo::signs, SplitMix64).
__device__ __forceinline__ u64 tq_signs(u32 block, u32 which) {
    u64 z = (u64)block + (which == 0 ? 0x52756e4954545130ull : 0x534b455443483031ull);
    z *= 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

__device__ __forceinline__ float tq_f16(const u8* p) { return half_to_float((u16)(p[0] | (u16)p[1] << 8)); }

// Code i of a block's packed codes.
__device__ __forceinline__ u32 tq_code(const u8* codes, u32 i, u32 bits) {
    const u32 bit = i * bits, shift = bit & 7;
    u32 word = codes[bit >> 3];
    if (shift + bits > 8) word |= (u32)codes[(bit >> 3) + 1] << 8;
    return word >> shift & ((1u << bits) - 1);
}

// The outlier index starting at bit `bit` of `indices` (turbo::read_index: slot s of a row's
// index bytes starts at bit 6 s).
__device__ __forceinline__ u32 tq_index_at(const u8* indices, u32 bit) {
    const u32 shift = bit & 7;
    u32 word = indices[bit >> 3];
    if (shift + TQ_INDEX_BITS > 8) word |= (u32)indices[(bit >> 3) + 1] << 8;
    return word >> shift & (TQ_BLOCK - 1);
}

// The bytes of one KV head in a cache row: its blocks (contiguous), then the index bytes that
// hold its blocks' outlier indices.
struct TqSlice {
    u64 row_bytes;     // bytes of a cell
    u32 block_offset;  // first byte of the head's blocks in the row
    u32 block_span;    // bytes of the head's blocks
    u64 index_offset;  // first index byte holding one of them
    u32 index_span;    // index bytes holding them
    u32 index_bit;     // bit of the head's first index in those bytes
    __device__ u32 stride() const { return block_span + index_span; }
};

__device__ __forceinline__ TqSlice tq_slice(const TqLayout& layout, u32 row_blocks, u32 first_block,
                                             u32 head_blocks) {
    const u32 bb = layout.block_bytes();
    const u32 first_bit = first_block * TQ_OUTLIERS * TQ_INDEX_BITS;
    const u32 end_bit = (first_block + head_blocks) * TQ_OUTLIERS * TQ_INDEX_BITS;
    TqSlice slice;
    slice.row_bytes = layout.row_bytes(row_blocks);
    slice.block_offset = first_block * bb;
    slice.block_span = head_blocks * bb;
    slice.index_offset = (u64)row_blocks * bb + first_bit / 8;
    slice.index_span = (end_bit + 7) / 8 - first_bit / 8;
    slice.index_bit = first_bit % 8;
    return slice;
}
