// Embedding lookup: out[t] = dequantized row ids[t] of the table, for every weight type.
// The ids come from the step buffer (common.cuh's StepHeader). Grid: x = token, y = groups of
// 256 threads; each thread dequantizes 8 consecutive elements (dequant.cuh) of its row.
#include "dequant.cuh"

template <class W>
__device__ __forceinline__ void embedding(const u8* __restrict__ table, u64 row_bytes, u64 width,
                                          const i32* __restrict__ step, float* __restrict__ out) {
    const StepHeader* h = (const StepHeader*)step;
    const u64 t = blockIdx.x;
    const u64 g = (u64)blockIdx.y * blockDim.x + threadIdx.x;
    if (8 * g >= width) return;
    const u64 id = (u64)(u32)step[h->ids + t];
    float v[8];
    const int valid = dequant_group<W>(table + id * row_bytes, width, g, v);
    float* dst = out + t * width + 8 * g;
    if (valid == 8 && width % 4 == 0) {
        *(float4*)dst = make_float4(v[0], v[1], v[2], v[3]);
        *(float4*)(dst + 4) = make_float4(v[4], v[5], v[6], v[7]);
    } else {
        for (int k = 0; k < valid; k++) dst[k] = v[k];
    }
}

#define EMBEDDING(W, name)                                                                     \
    extern "C" __global__ void embedding_##name(const u8* table, u64 row_bytes, u64 width,     \
                                                const i32* step, float* out) { pdl_start();                 \
        embedding<W>(table, row_bytes, width, step, out);                                      \
    }

EMBEDDING(F32, f32)
EMBEDDING(F16, f16)
EMBEDDING(BF16, bf16)
EMBEDDING(Q4_0, q4_0)
EMBEDDING(Q4_1, q4_1)
EMBEDDING(Q5_0, q5_0)
EMBEDDING(Q5_1, q5_1)
EMBEDDING(Q8_0, q8_0)
EMBEDDING(IQ4_NL, iq4_nl)
EMBEDDING(Q2_K, q2_k)
EMBEDDING(Q3_K, q3_k)
EMBEDDING(Q4_K, q4_k)
EMBEDDING(Q5_K, q5_k)
EMBEDDING(Q6_K, q6_k)
EMBEDDING(IQ4_XS, iq4_xs)
