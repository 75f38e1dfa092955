// ggml block layouts (byte-identical to the GGUF file), read by the dequantizing kernels.
#pragma once
#include "common.cuh"

#define QK4_0 32
#define QK8_0 32
#define QK_K 256

struct block_q4_0 { u16 d; u8 qs[16]; };
struct block_q4_1 { u16 d; u16 m; u8 qs[16]; };
struct block_q5_0 { u16 d; u8 qh[4]; u8 qs[16]; };
struct block_q5_1 { u16 d; u16 m; u8 qh[4]; u8 qs[16]; };
struct block_q8_0 { u16 d; i8 qs[32]; };
struct block_q2_K { u8 scales[16]; u8 qs[64]; u16 d; u16 dmin; };
struct block_q3_K { u8 hmask[32]; u8 qs[64]; u8 scales[12]; u16 d; };
struct block_q4_K { u16 d; u16 dmin; u8 scales[12]; u8 qs[128]; };
struct block_q5_K { u16 d; u16 dmin; u8 scales[12]; u8 qh[32]; u8 qs[128]; };
struct block_q6_K { u8 ql[128]; u8 qh[64]; i8 scales[16]; u16 d; };
struct block_iq4_nl { u16 d; u8 qs[16]; };
struct block_iq4_xs { u16 d; u16 scales_h; u8 scales_l[4]; u8 qs[128]; };

static_assert(sizeof(block_q4_0) == 18, "q4_0");
static_assert(sizeof(block_q4_1) == 20, "q4_1");
static_assert(sizeof(block_q5_0) == 22, "q5_0");
static_assert(sizeof(block_q5_1) == 24, "q5_1");
static_assert(sizeof(block_q8_0) == 34, "q8_0");
static_assert(sizeof(block_q2_K) == 84, "q2_K");
static_assert(sizeof(block_q3_K) == 110, "q3_K");
static_assert(sizeof(block_q4_K) == 144, "q4_K");
static_assert(sizeof(block_q5_K) == 176, "q5_K");
static_assert(sizeof(block_q6_K) == 210, "q6_K");
static_assert(sizeof(block_iq4_nl) == 18, "iq4_nl");
static_assert(sizeof(block_iq4_xs) == 136, "iq4_xs");

__constant__ const i8 IQ4_NL_VALUES[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
