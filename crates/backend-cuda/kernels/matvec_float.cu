// Decode matvec of float weights (F32, F16, BF16) against f32 activations:
// out[t][row] = sum_i W[row][i] * x[t][i] for t < tokens, one block of 128 threads per row.
//
// The `_vec` kernels read 8 weights per thread per step with 16-byte loads; they need
// n_in % 8 == 0 and a 16-byte aligned weight (the host checks). The plain kernels take any
// shape, one element per thread per step.
#include "dequant.cuh"

#define MATVEC_THREADS 128

// Eight weights starting at element i (a multiple of 8) of a row, from aligned 16-byte loads.
__device__ __forceinline__ void load8(const F32*, const u8* row, u32 i, float* v) {
    const float4 a = *(const float4*)(row + 4 * (u64)i);
    const float4 b = *(const float4*)(row + 4 * (u64)i + 16);
    v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w;
    v[4] = b.x; v[5] = b.y; v[6] = b.z; v[7] = b.w;
}

__device__ __forceinline__ void load8(const F16*, const u8* row, u32 i, float* v) {
    const uint4 q = *(const uint4*)(row + 2 * (u64)i);
    const u32 words[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
    for (int k = 0; k < 4; k++) {
        v[2 * k] = half_to_float((u16)(words[k] & 0xFFFFu));
        v[2 * k + 1] = half_to_float((u16)(words[k] >> 16));
    }
}

__device__ __forceinline__ void load8(const BF16*, const u8* row, u32 i, float* v) {
    const uint4 q = *(const uint4*)(row + 2 * (u64)i);
    const u32 words[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
    for (int k = 0; k < 4; k++) {
        v[2 * k] = __uint_as_float(words[k] << 16);
        v[2 * k + 1] = __uint_as_float(words[k] & 0xFFFF0000u);
    }
}

template <class W, int T, bool VEC>
__device__ __forceinline__ void matvec_float(const u8* __restrict__ w, u64 row_bytes, u32 n_in, u32 n_out,
                                             const float* __restrict__ x, float* __restrict__ out, u32 tokens) {
    const u32 row = blockIdx.x;
    const u8* wrow = w + (u64)row * row_bytes;
    float acc[T];
#pragma unroll
    for (int t = 0; t < T; t++) acc[t] = 0.0f;
    if constexpr (VEC) {
        for (u32 i = 8 * threadIdx.x; i < n_in; i += 8 * MATVEC_THREADS) {
            float v[8];
            load8((const W*)nullptr, wrow, i, v);
#pragma unroll
            for (int t = 0; t < T; t++) {
                if (t < (int)tokens) {
                    const float* xt = x + (u64)t * n_in + i;
                    const float4 a = *(const float4*)xt;
                    const float4 b = *(const float4*)(xt + 4);
                    acc[t] += v[0] * a.x + v[1] * a.y + v[2] * a.z + v[3] * a.w + v[4] * b.x + v[5] * b.y +
                              v[6] * b.z + v[7] * b.w;
                }
            }
        }
    } else {
        for (u32 i = threadIdx.x; i < n_in; i += MATVEC_THREADS) {
            const float v = W::element(wrow, i);
#pragma unroll
            for (int t = 0; t < T; t++) {
                if (t < (int)tokens) acc[t] += v * x[(u64)t * n_in + i];
            }
        }
    }
    __shared__ float partial[MATVEC_THREADS / 32][T];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int t = 0; t < T; t++) {
        const float v = warp_sum(acc[t]);
        if (lane == 0) partial[warp][t] = v;
    }
    __syncthreads();
    if (threadIdx.x < tokens && threadIdx.x < T) {
        float sum = 0.0f;
#pragma unroll
        for (int k = 0; k < MATVEC_THREADS / 32; k++) sum += partial[k][threadIdx.x];
        out[(u64)threadIdx.x * n_out + row] = sum;
    }
}

#define FLOAT_ENTRY(W, name, T, VEC, suffix)                                                           \
    extern "C" __global__ void __launch_bounds__(MATVEC_THREADS)                                     \
        matvec_##name##suffix##_t##T(const u8* w, u64 row_bytes, u32 n_in, u32 n_out, const float* x, \
                                     float* out, u32 tokens) {                                       \
        matvec_float<W, T, VEC>(w, row_bytes, n_in, n_out, x, out, tokens);                          \
    }
#define FLOAT_ENTRIES(W, name)               \
    FLOAT_ENTRY(W, name, 1, true, _vec)      \
    FLOAT_ENTRY(W, name, 2, true, _vec)      \
    FLOAT_ENTRY(W, name, 4, true, _vec)      \
    FLOAT_ENTRY(W, name, 8, true, _vec)      \
    FLOAT_ENTRY(W, name, 1, false, )         \
    FLOAT_ENTRY(W, name, 2, false, )         \
    FLOAT_ENTRY(W, name, 4, false, )         \
    FLOAT_ENTRY(W, name, 8, false, )

FLOAT_ENTRIES(F32, f32)
FLOAT_ENTRIES(F16, f16)
FLOAT_ENTRIES(BF16, bf16)
