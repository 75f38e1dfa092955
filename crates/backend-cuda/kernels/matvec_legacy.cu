// Decode matvec of the 32-element block formats (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL)
// against q8_1 activations; see matvec.cuh for the skeleton and the part contract.
//
// In the 4/5-bit formats byte j of qs holds element j (low nibble) and j + 16 (high nibble).
// A part is two ints (8 bytes) of qs: part p covers elements 8p .. 8p+7 and 16+8p .. 16+8p+7,
// half of the block, so a constant offset (-8 for Q4_0, -16 for Q5_0) or min m contributes
// half of offset * (d_a * sum) per part.
#include "matvec.cuh"

#define LOW_NIBBLES 0x0F0F0F0Fu

// dp4a of the two low-nibble ints (elements 8p..) and two high-nibble ints (16 + 8p..).
__device__ __forceinline__ int dot_halves(const int* low, const int* high, const i8* aq, int p) {
    int sum = __dp4a(low[0], act4(aq, 8 * p), 0);
    sum = __dp4a(low[1], act4(aq, 8 * p + 4), sum);
    sum = __dp4a(high[0], act4(aq, 16 + 8 * p), sum);
    return __dp4a(high[1], act4(aq, 20 + 8 * p), sum);
}

// The high bits of four consecutive elements (bits 0..3 of h) moved to bit 4 of each byte.
__device__ __forceinline__ u32 spread_bits(u32 h) {
    return ((h & 1u) << 4) | ((h & 2u) << 11) | ((h & 4u) << 18) | ((h & 8u) << 25);
}

struct MvQ4_0 : Q4_0 {
    static constexpr int PARTS = 2;
    struct Part { int low[2], high[2]; float d; };
    static __device__ __forceinline__ Part load(const u8* b, int p) {
        Part part;
        part.d = load_half(b);
#pragma unroll
        for (int k = 0; k < 2; k++) {
            const u32 q = load_u32_a2(b + 2 + 8 * p + 4 * k);
            part.low[k] = (int)(q & LOW_NIBBLES);
            part.high[k] = (int)((q >> 4) & LOW_NIBBLES);
        }
        return part;
    }
    static __device__ __forceinline__ float dot(const Part& part, int p, const i8* aq, const float2* ads) {
        const float2 s = ads[0];
        return part.d * (s.x * (float)dot_halves(part.low, part.high, aq, p) - 4.0f * s.y);
    }
};

struct MvQ4_1 : Q4_1 {
    static constexpr int PARTS = 2;
    struct Part { int low[2], high[2]; float d, m; };
    static __device__ __forceinline__ Part load(const u8* b, int p) {
        Part part;
        part.d = load_half(b);
        part.m = load_half(b + 2);
#pragma unroll
        for (int k = 0; k < 2; k++) {
            const u32 q = load_u32_a4(b + 4 + 8 * p + 4 * k);
            part.low[k] = (int)(q & LOW_NIBBLES);
            part.high[k] = (int)((q >> 4) & LOW_NIBBLES);
        }
        return part;
    }
    static __device__ __forceinline__ float dot(const Part& part, int p, const i8* aq, const float2* ads) {
        const float2 s = ads[0];
        return part.d * s.x * (float)dot_halves(part.low, part.high, aq, p) + 0.5f * part.m * s.y;
    }
};

// Five-bit values of qs int k (bytes 4k..4k+3) with the matching qh bits.
__device__ __forceinline__ void q5_unpack(u32 q, u32 qh, int k, int* low, int* high) {
    *low = (int)((q & LOW_NIBBLES) | spread_bits(qh >> (4 * k)));
    *high = (int)(((q >> 4) & LOW_NIBBLES) | spread_bits(qh >> (4 * k + 16)));
}

struct MvQ5_0 : Q5_0 {
    static constexpr int PARTS = 2;
    struct Part { int low[2], high[2]; float d; };
    static __device__ __forceinline__ Part load(const u8* b, int p) {
        Part part;
        part.d = load_half(b);
        const u32 qh = load_u32_a2(b + 2);
#pragma unroll
        for (int k = 0; k < 2; k++) q5_unpack(load_u32_a2(b + 6 + 8 * p + 4 * k), qh, 2 * p + k, &part.low[k], &part.high[k]);
        return part;
    }
    static __device__ __forceinline__ float dot(const Part& part, int p, const i8* aq, const float2* ads) {
        const float2 s = ads[0];
        return part.d * (s.x * (float)dot_halves(part.low, part.high, aq, p) - 8.0f * s.y);
    }
};

struct MvQ5_1 : Q5_1 {
    static constexpr int PARTS = 2;
    struct Part { int low[2], high[2]; float d, m; };
    static __device__ __forceinline__ Part load(const u8* b, int p) {
        Part part;
        part.d = load_half(b);
        part.m = load_half(b + 2);
        const u32 qh = load_u32_a4(b + 4);
#pragma unroll
        for (int k = 0; k < 2; k++) q5_unpack(load_u32_a4(b + 8 + 8 * p + 4 * k), qh, 2 * p + k, &part.low[k], &part.high[k]);
        return part;
    }
    static __device__ __forceinline__ float dot(const Part& part, int p, const i8* aq, const float2* ads) {
        const float2 s = ads[0];
        return part.d * s.x * (float)dot_halves(part.low, part.high, aq, p) + 0.5f * part.m * s.y;
    }
};

// Q8_0: four parts of 8 bytes (elements 8p .. 8p+7).
struct MvQ8_0 : Q8_0 {
    static constexpr int PARTS = 4;
    struct Part { int q[2]; float d; };
    static __device__ __forceinline__ Part load(const u8* b, int p) {
        Part part;
        part.d = load_half(b);
        part.q[0] = (int)load_u32_a2(b + 2 + 8 * p);
        part.q[1] = (int)load_u32_a2(b + 6 + 8 * p);
        return part;
    }
    static __device__ __forceinline__ float dot(const Part& part, int p, const i8* aq, const float2* ads) {
        const int sum = __dp4a(part.q[1], act4(aq, 8 * p + 4), __dp4a(part.q[0], act4(aq, 8 * p), 0));
        return part.d * ads[0].x * (float)sum;
    }
};

// Q8_0 for long rows (matvec_q8_0w_*): two parts of 16 bytes per block, half the scale loads
// and index arithmetic per byte (H200, qwen2.5-7b decode: 256 -> 270 tok/s); short rows keep
// MvQ8_0, whose four parts keep all of a block's threads busy.
struct MvQ8_0Wide : Q8_0 {
    static constexpr int PARTS = 2;
    struct Part { int q[4]; float d; };
    static __device__ __forceinline__ Part load(const u8* b, int p) {
        Part part;
        part.d = load_half(b);
#pragma unroll
        for (int k = 0; k < 4; k++) part.q[k] = (int)load_u32_a2(b + 2 + 16 * p + 4 * k);
        return part;
    }
    static __device__ __forceinline__ float dot(const Part& part, int p, const i8* aq, const float2* ads) {
        int sum = 0;
#pragma unroll
        for (int k = 0; k < 4; k++) sum = __dp4a(part.q[k], act4(aq, 16 * p + 4 * k), sum);
        return part.d * ads[0].x * (float)sum;
    }
};

struct MvIQ4_NL : IQ4_NL {
    static constexpr int PARTS = 2;
    struct Part { int low[2], high[2]; float d; };
    static __device__ __forceinline__ Part load(const u8* b, int p) {
        Part part;
        part.d = load_half(b);
#pragma unroll
        for (int k = 0; k < 2; k++) {
            const u32 q = load_u32_a2(b + 2 + 8 * p + 4 * k);
            part.low[k] = iq4_lookup(q & LOW_NIBBLES);
            part.high[k] = iq4_lookup((q >> 4) & LOW_NIBBLES);
        }
        return part;
    }
    static __device__ __forceinline__ float dot(const Part& part, int p, const i8* aq, const float2* ads) {
        return part.d * ads[0].x * (float)dot_halves(part.low, part.high, aq, p);
    }
};

template <> struct MatvecSteps<MvQ4_0> { static constexpr int VALUE = 2; };

MATVEC_ENTRIES(MvQ4_0, q4_0)
MATVEC_ENTRIES(MvQ4_1, q4_1)
MATVEC_ENTRIES(MvQ5_0, q5_0)
MATVEC_ENTRIES(MvQ5_1, q5_1)
MATVEC_ENTRIES(MvQ8_0, q8_0)
MATVEC_ENTRIES(MvQ8_0Wide, q8_0w)
MATVEC_ENTRIES(MvIQ4_NL, iq4_nl)
