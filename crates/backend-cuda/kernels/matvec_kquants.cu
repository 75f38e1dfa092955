// Decode matvec of the 256-element super-block formats (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS)
// against q8_1 activations; see matvec.cuh for the skeleton and the part contract. Each
// super-block is split into 8 parts; the element order of every format is described in
// dequant.cuh.
#include "matvec.cuh"

#define LOW_NIBBLES 0x0F0F0F0Fu
#define LOW_PAIRS 0x03030303u
#define ONES 0x01010101u

// Q2_K / Q3_K part p: half h = p / 4 and bytes k = 8j .. 8j+7 (j = p % 4) of that half's
// 32-byte run; for each of the 4 bit pairs g it gives 8 elements 128h + 32g + 8j ..,
// all in sub-block 8h + 2g + j / 2 and activation block 4h + g.

struct MvQ2_K : Q2_K {
    static constexpr int PARTS = 8;
    struct Part { u32 q[2]; float dl[4], ml[4]; };
    static __device__ __forceinline__ Part load(const u8* b, int p) {
        const int h = p >> 2, j = p & 3;
        Part part;
        part.q[0] = load_u32_a4(b + 16 + 32 * h + 8 * j);
        part.q[1] = load_u32_a4(b + 20 + 32 * h + 8 * j);
        const float d = load_half(b + 80), dmin = load_half(b + 82);
#pragma unroll
        for (int g = 0; g < 4; g++) {
            const int sc = b[8 * h + 2 * g + (j >> 1)];
            part.dl[g] = d * (float)(sc & 15);
            part.ml[g] = dmin * (float)(sc >> 4);
        }
        return part;
    }
    static __device__ __forceinline__ float dot(const Part& part, int p, const i8* aq, const float2* ads) {
        const int h = p >> 2, j = p & 3;
        float sum = 0.0f;
#pragma unroll
        for (int g = 0; g < 4; g++) {
            const int e = 128 * h + 32 * g + 8 * j;
            const int a0 = act4(aq, e), a1 = act4(aq, e + 4);
            const int q0 = (int)((part.q[0] >> (2 * g)) & LOW_PAIRS), q1 = (int)((part.q[1] >> (2 * g)) & LOW_PAIRS);
            const int dot = __dp4a(q1, a1, __dp4a(q0, a0, 0));
            const int act_sum = __dp4a((int)ONES, a1, __dp4a((int)ONES, a0, 0));
            sum += ads[4 * h + g].x * (part.dl[g] * (float)dot - part.ml[g] * (float)act_sum);
        }
        return sum;
    }
};

struct MvQ3_K : Q3_K {
    static constexpr int PARTS = 8;
    // w[g][k]: the signed values (q - 4 * !h) of ints k of bit pair g.
    struct Part { int w[4][2]; float dl[4]; };
    static __device__ __forceinline__ Part load(const u8* b, int p) {
        const int h = p >> 2, j = p & 3;
        Part part;
        const float d = load_half(b + 108);
#pragma unroll
        for (int k = 0; k < 2; k++) {
            const u32 q = load_u32_a2(b + 32 + 32 * h + 8 * j + 4 * k);
            const u32 hmask = load_u32_a2(b + 8 * j + 4 * k);
#pragma unroll
            for (int g = 0; g < 4; g++) {
                const u32 low = (q >> (2 * g)) & LOW_PAIRS;
                const u32 high = ((hmask >> (4 * h + g)) & ONES) << 2;
                part.w[g][k] = sub_bytes(low | high, 0x04040404u);
            }
        }
#pragma unroll
        for (int g = 0; g < 4; g++) part.dl[g] = d * (float)q3_k_scale(8 * h + 2 * g + (j >> 1), b + 96);
        return part;
    }
    static __device__ __forceinline__ float dot(const Part& part, int p, const i8* aq, const float2* ads) {
        const int h = p >> 2, j = p & 3;
        float sum = 0.0f;
#pragma unroll
        for (int g = 0; g < 4; g++) {
            const int e = 128 * h + 32 * g + 8 * j;
            const int dot = __dp4a(part.w[g][1], act4(aq, e + 4), __dp4a(part.w[g][0], act4(aq, e), 0));
            sum += part.dl[g] * ads[4 * h + g].x * (float)dot;
        }
        return sum;
    }
};

// Q4_K / Q5_K part p: pair P = p / 2, bytes l = 16j .. 16j+15 (j = p % 2) of the pair's 32-byte
// run: low nibbles are elements 64P + l (sub-block 2P), high nibbles 64P + 32 + l (2P + 1).
// Each part holds half of each of its two sub-blocks, so it adds half of min * (d_a * sum).
struct KPair {
    float d[2], m[2];
    __device__ __forceinline__ void load(const u8* b, int pair) {
        const float d_all = load_half(b), min_all = load_half(b + 2);
#pragma unroll
        for (int s = 0; s < 2; s++) {
            int scale, min;
            scale_min_k4(2 * pair + s, b + 4, &scale, &min);
            d[s] = d_all * (float)scale;
            m[s] = min_all * (float)min;
        }
    }
};

__device__ __forceinline__ float dot_k_pair(const int* low, const int* high, const KPair& k, int p,
                                            const i8* aq, const float2* ads) {
    const int pair = p >> 1, j = p & 1;
    const i8* a_low = aq + 64 * pair + 16 * j;
    const i8* a_high = a_low + 32;
    int dot_low = 0, dot_high = 0;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        dot_low = __dp4a(low[i], act4(a_low, 4 * i), dot_low);
        dot_high = __dp4a(high[i], act4(a_high, 4 * i), dot_high);
    }
    const float2 s_low = ads[2 * pair], s_high = ads[2 * pair + 1];
    return k.d[0] * s_low.x * (float)dot_low - 0.5f * k.m[0] * s_low.y + k.d[1] * s_high.x * (float)dot_high -
           0.5f * k.m[1] * s_high.y;
}

struct MvQ4_K : Q4_K {
    static constexpr int PARTS = 8;
    struct Part { int low[4], high[4]; KPair k; };
    static __device__ __forceinline__ Part load(const u8* b, int p) {
        Part part;
        const uint4 q = *(const uint4*)(b + 16 + 16 * p);
        const u32 words[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
        for (int i = 0; i < 4; i++) {
            part.low[i] = (int)(words[i] & LOW_NIBBLES);
            part.high[i] = (int)((words[i] >> 4) & LOW_NIBBLES);
        }
        part.k.load(b, p >> 1);
        return part;
    }
    static __device__ __forceinline__ float dot(const Part& part, int p, const i8* aq, const float2* ads) {
        return dot_k_pair(part.low, part.high, part.k, p, aq, ads);
    }
};

struct MvQ5_K : Q5_K {
    static constexpr int PARTS = 8;
    struct Part { int low[4], high[4]; KPair k; };
    static __device__ __forceinline__ Part load(const u8* b, int p) {
        const int pair = p >> 1, j = p & 1;
        Part part;
        const uint4 q = *(const uint4*)(b + 48 + 16 * p);
        const uint4 qh = *(const uint4*)(b + 16 + 16 * j);
        const u32 words[4] = {q.x, q.y, q.z, q.w};
        const u32 highs[4] = {qh.x, qh.y, qh.z, qh.w};
#pragma unroll
        for (int i = 0; i < 4; i++) {
            part.low[i] = (int)((words[i] & LOW_NIBBLES) | (((highs[i] >> (2 * pair)) & ONES) << 4));
            part.high[i] = (int)(((words[i] >> 4) & LOW_NIBBLES) | (((highs[i] >> (2 * pair + 1)) & ONES) << 4));
        }
        part.k.load(b, pair);
        return part;
    }
    static __device__ __forceinline__ float dot(const Part& part, int p, const i8* aq, const float2* ads) {
        return dot_k_pair(part.low, part.high, part.k, p, aq, ads);
    }
};

// Q6_K part p: half h = p / 4, bytes l = 8j .. 8j+7 (j = p % 4) of ql[64h ..], ql[64h + 32 ..]
// and qh[32h ..]; group g gives elements 128h + 32g + l with scale scales[8h + j/2 + 2g].
struct MvQ6_K : Q6_K {
    static constexpr int PARTS = 8;
    struct Part { int w[4][2]; float dl[4]; };
    static __device__ __forceinline__ Part load(const u8* b, int p) {
        const int h = p >> 2, j = p & 3;
        Part part;
#pragma unroll
        for (int k = 0; k < 2; k++) {
            const u32 ql_low = load_u32_a2(b + 64 * h + 8 * j + 4 * k);
            const u32 ql_high = load_u32_a2(b + 64 * h + 32 + 8 * j + 4 * k);
            const u32 qh = load_u32_a2(b + 128 + 32 * h + 8 * j + 4 * k);
            const u32 nibbles[4] = {ql_low & LOW_NIBBLES, ql_high & LOW_NIBBLES, (ql_low >> 4) & LOW_NIBBLES,
                                    (ql_high >> 4) & LOW_NIBBLES};
#pragma unroll
            for (int g = 0; g < 4; g++) {
                const u32 q = nibbles[g] | (((qh >> (2 * g)) & LOW_PAIRS) << 4);
                part.w[g][k] = sub_bytes(q, 0x20202020u);
            }
        }
        const float d = load_half(b + 208);
#pragma unroll
        for (int g = 0; g < 4; g++) part.dl[g] = d * (float)(i8)b[192 + 8 * h + (j >> 1) + 2 * g];
        return part;
    }
    static __device__ __forceinline__ float dot(const Part& part, int p, const i8* aq, const float2* ads) {
        const int h = p >> 2, j = p & 3;
        float sum = 0.0f;
#pragma unroll
        for (int g = 0; g < 4; g++) {
            const int e = 128 * h + 32 * g + 8 * j;
            const int dot = __dp4a(part.w[g][1], act4(aq, e + 4), __dp4a(part.w[g][0], act4(aq, e), 0));
            sum += part.dl[g] * ads[4 * h + g].x * (float)dot;
        }
        return sum;
    }
};

// IQ4_XS part p = sub-block ib: qs[16 ib .. 16 ib + 16], elements 32 ib + j (low nibble of
// byte j) and 32 ib + 16 + j (high nibble), one activation block.
struct MvIQ4_XS : IQ4_XS {
    static constexpr int PARTS = 8;
    struct Part { int low[4], high[4]; float dl; };
    static __device__ __forceinline__ Part load(const u8* b, int p) {
        Part part;
        const uint2 q01 = *(const uint2*)(b + 8 + 16 * p);
        const uint2 q23 = *(const uint2*)(b + 16 + 16 * p);
        const u32 words[4] = {q01.x, q01.y, q23.x, q23.y};
#pragma unroll
        for (int i = 0; i < 4; i++) {
            part.low[i] = iq4_lookup(words[i] & LOW_NIBBLES);
            part.high[i] = iq4_lookup((words[i] >> 4) & LOW_NIBBLES);
        }
        const int low = (b[4 + (p >> 1)] >> (4 * (p & 1))) & 15;
        const int high = (load_u16(b + 2) >> (2 * p)) & 3;
        part.dl = load_half(b) * (float)((low | (high << 4)) - 32);
        return part;
    }
    static __device__ __forceinline__ float dot(const Part& part, int p, const i8* aq, const float2* ads) {
        const i8* a = aq + 32 * p;
        int sum = 0;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            sum = __dp4a(part.low[i], act4(a, 4 * i), sum);
            sum = __dp4a(part.high[i], act4(a, 16 + 4 * i), sum);
        }
        return part.dl * ads[p].x * (float)sum;
    }
};

MATVEC_ENTRIES(MvQ2_K, q2_k)
MATVEC_ENTRIES(MvQ3_K, q3_k)
MATVEC_ENTRIES(MvQ4_K, q4_k)
MATVEC_ENTRIES(MvQ5_K, q5_k)
MATVEC_ENTRIES(MvQ6_K, q6_k)
MATVEC_ENTRIES(MvIQ4_XS, iq4_xs)
