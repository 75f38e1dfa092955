// Decode matvec of float weights (F32, F16, BF16) against f32 activations:
// out[t][row] = sum_i W[row][i] * x[t][i] for t < tokens.
//
// The `_vec` / `_vec4` kernels (one block per row; one or four 16-byte loads per thread and
// step) and the `_vec_warp` kernels (each warp streams whole rows) need n_in % 8 == 0 and a
// 16-byte aligned weight (the host checks; src/matmul/matvec.rs picks one by shape). The
// plain kernels take any shape, one element per thread per step.
#include "dequant.cuh"

#define MATVEC_THREADS 128

// 16 bytes of weights that are read once: not kept in L1 (which holds the activations).
__device__ __forceinline__ uint4 load_stream(const u8* p) {
    uint4 v;
    asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
        : "l"(p));
    return v;
}

// Eight weights from the 16 bytes `q` holding elements 8k .. 8k + 7 (F16, BF16), or four
// (F32: v[4..8] unused).
__device__ __forceinline__ void unpack16(const F32*, uint4 q, float* v) {
    v[0] = __uint_as_float(q.x); v[1] = __uint_as_float(q.y); v[2] = __uint_as_float(q.z); v[3] = __uint_as_float(q.w);
}
__device__ __forceinline__ void unpack16(const F16*, uint4 q, float* v) {
    const u32 words[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
    for (int k = 0; k < 4; k++) {
        v[2 * k] = half_to_float((u16)(words[k] & 0xFFFFu));
        v[2 * k + 1] = half_to_float((u16)(words[k] >> 16));
    }
}
__device__ __forceinline__ void unpack16(const BF16*, uint4 q, float* v) {
    const u32 words[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
    for (int k = 0; k < 4; k++) {
        v[2 * k] = __uint_as_float(words[k] << 16);
        v[2 * k + 1] = __uint_as_float(words[k] & 0xFFFF0000u);
    }
}

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

// Elements per 16 bytes.
template <class W> struct Per16 { static constexpr int N = 8; };
template <> struct Per16<F32> { static constexpr int N = 4; };

// 16-byte loads in flight per lane and step of the warp kernels.
#define FLOAT_UNROLL_WARP 8

// out = silu(gate) * up, as silu_mul_f32 (elementwise.cu) computes it.
__device__ __forceinline__ float swiglu(float gate, float up) { return __fmul_rn(gate / (1.0f + expf(-gate)), up); }

// The `_vec_warp` kernels' dot of one row: this lane's share of row `wrow` . x[t] in acc[t],
// FLOAT_UNROLL_WARP 16-byte loads per lane issued before any is used.
template <class W, int T>
__device__ __forceinline__ void warp_row_dot(const u8* __restrict__ wrow, u32 units, u32 n_in,
                                             const float* __restrict__ x, u32 tokens, int lane, float* acc) {
    constexpr int N = Per16<W>::N;
#pragma unroll
    for (int t = 0; t < T; t++) acc[t] = 0.0f;
    for (u32 u0 = 0; u0 < units; u0 += 32 * FLOAT_UNROLL_WARP) {
        uint4 q[FLOAT_UNROLL_WARP];
#pragma unroll
        for (int j = 0; j < FLOAT_UNROLL_WARP; j++) {
            const u32 u = u0 + lane + 32 * j;
            if (u < units) q[j] = load_stream(wrow + 16 * (u64)u);
        }
#pragma unroll
        for (int j = 0; j < FLOAT_UNROLL_WARP; j++) {
            const u32 u = u0 + lane + 32 * j;
            if (u < units) {
                float v[8];
                unpack16((const W*)nullptr, q[j], v);
#pragma unroll
                for (int t = 0; t < T; t++) {
                    if (t < (int)tokens) {
                        const float* xt = x + (u64)t * n_in + (u64)N * u;
                        const float4 a = *(const float4*)xt;
                        float sum = v[0] * a.x + v[1] * a.y + v[2] * a.z + v[3] * a.w;
                        if constexpr (N == 8) {
                            const float4 b = *(const float4*)(xt + 4);
                            sum += v[4] * b.x + v[5] * b.y + v[6] * b.z + v[7] * b.w;
                        }
                        acc[t] += sum;
                    }
                }
            }
        }
    }
}

// The `_vec_warp` kernels: each warp owns rows_per_warp consecutive rows and streams each with
// 16-byte loads (row_bytes % 16 == 0 and a 16-byte aligned weight, which the host checks).
// Plain (S = false): out = W . x (+ bias[row] when bias is not null). SwiGLU (S = true):
// out = silu(W . x) * (W_up . x), each dot summed as the plain kernel sums it.
template <class W, int T, bool S>
__device__ __forceinline__ void matvec_float_vec(const u8* __restrict__ w, const u8* __restrict__ w_up,
                                                 u64 row_bytes, u32 n_in, u32 n_out, const float* __restrict__ x,
                                                 float* __restrict__ out, u32 tokens, u32 rows_per_warp,
                                                 const float* __restrict__ bias) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const u32 first_row = (blockIdx.x * (MATVEC_THREADS / 32) + warp) * rows_per_warp;
    if (first_row >= n_out) return;
    const u32 last_row = min(first_row + rows_per_warp, n_out);
    const u32 units = (u32)(row_bytes / 16);
    for (u32 row = first_row; row < last_row; row++) {
        float acc[T];
        warp_row_dot<W, T>(w + (u64)row * row_bytes, units, n_in, x, tokens, lane, acc);
        float acc_up[T];
        if constexpr (S) warp_row_dot<W, T>(w_up + (u64)row * row_bytes, units, n_in, x, tokens, lane, acc_up);
#pragma unroll
        for (int t = 0; t < T; t++) {
            const float sum = warp_sum(acc[t]);
            if constexpr (S) {
                const float up = warp_sum(acc_up[t]);
                if (lane == t && t < (int)tokens) out[(u64)t * n_out + row] = swiglu(sum, up);
            } else {
                if (lane == t && t < (int)tokens) out[(u64)t * n_out + row] = bias != nullptr ? sum + bias[row] : sum;
            }
        }
    }
}

// One thread's share of row `wrow` . x[t] in acc[t] for the one-block-per-row kernels:
// element-wise (U = 0, any row length), or with 16-byte loads, U per thread issued before any
// is used.
template <class W, int T, int U>
__device__ __forceinline__ void block_row_dot(const u8* __restrict__ wrow, u64 row_bytes, u32 n_in,
                                              const float* __restrict__ x, u32 tokens, float* acc) {
#pragma unroll
    for (int t = 0; t < T; t++) acc[t] = 0.0f;
    if constexpr (U == 1) {
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
    } else if constexpr (U > 1) {
        constexpr int N = Per16<W>::N;
        const u32 units = (u32)(row_bytes / 16);
        for (u32 u0 = threadIdx.x; u0 < units; u0 += MATVEC_THREADS * U) {
            uint4 q[U];
#pragma unroll
            for (int j = 0; j < U; j++) {
                const u32 u = u0 + MATVEC_THREADS * j;
                if (u < units) q[j] = load_stream(wrow + 16 * (u64)u);
            }
#pragma unroll
            for (int j = 0; j < U; j++) {
                const u32 u = u0 + MATVEC_THREADS * j;
                if (u < units) {
                    float v[8];
                    unpack16((const W*)nullptr, q[j], v);
#pragma unroll
                    for (int t = 0; t < T; t++) {
                        if (t < (int)tokens) {
                            const float* xt = x + (u64)t * n_in + (u64)N * u;
                            const float4 a = *(const float4*)xt;
                            float sum = v[0] * a.x + v[1] * a.y + v[2] * a.z + v[3] * a.w;
                            if constexpr (N == 8) {
                                const float4 b = *(const float4*)(xt + 4);
                                sum += v[4] * b.x + v[5] * b.y + v[6] * b.z + v[7] * b.w;
                            }
                            acc[t] += sum;
                        }
                    }
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
}

// One block of MATVEC_THREADS threads per row (see block_row_dot for U). Plain (S = false):
// out = W . x (+ bias[row] when bias is not null); SwiGLU (S = true): out = silu(W . x) *
// (W_up . x), each dot summed as the plain kernel sums it.
template <class W, int T, int U, bool S>
__device__ __forceinline__ void matvec_float(const u8* __restrict__ w, const u8* __restrict__ w_up, u64 row_bytes,
                                             u32 n_in, u32 n_out, const float* __restrict__ x,
                                             float* __restrict__ out, u32 tokens, const float* __restrict__ bias) {
    const u32 row = blockIdx.x;
    float acc[T];
    block_row_dot<W, T, U>(w + (u64)row * row_bytes, row_bytes, n_in, x, tokens, acc);
    float acc_up[T];
    if constexpr (S) block_row_dot<W, T, U>(w_up + (u64)row * row_bytes, row_bytes, n_in, x, tokens, acc_up);
    constexpr int DOTS = S ? 2 : 1;
    __shared__ float partial[MATVEC_THREADS / 32][DOTS * T];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int t = 0; t < T; t++) {
        const float v = warp_sum(acc[t]);
        if (lane == 0) partial[warp][t] = v;
        if constexpr (S) {
            const float u = warp_sum(acc_up[t]);
            if (lane == 0) partial[warp][T + t] = u;
        }
    }
    __syncthreads();
    if (threadIdx.x < tokens && threadIdx.x < T) {
        float sum = 0.0f;
#pragma unroll
        for (int k = 0; k < MATVEC_THREADS / 32; k++) sum += partial[k][threadIdx.x];
        if constexpr (S) {
            float up = 0.0f;
#pragma unroll
            for (int k = 0; k < MATVEC_THREADS / 32; k++) up += partial[k][T + threadIdx.x];
            out[(u64)threadIdx.x * n_out + row] = swiglu(sum, up);
        } else {
            out[(u64)threadIdx.x * n_out + row] = bias != nullptr ? sum + bias[row] : sum;
        }
    }
}

// Entry points: matvec_<name>[_vec|_vec4|_vec_warp]_t<T> (bias: an f32 [n_out] vector or null)
// and their SwiGLU twins matvec_<name>_swiglu[_vec|_vec4|_vec_warp]_t<T> (gate and up weights).
#define FLOAT_BLOCK_ENTRY(W, name, suffix, T, U)                                                      \
    extern "C" __global__ void __launch_bounds__(MATVEC_THREADS)                                     \
        matvec_##name##suffix##_t##T(const u8* w, u64 row_bytes, u32 n_in, u32 n_out, const float* x, \
                                     float* out, u32 tokens, const float* bias) { pdl_start();                    \
        matvec_float<W, T, U, false>(w, w, row_bytes, n_in, n_out, x, out, tokens, bias);            \
    }                                                                                                \
    extern "C" __global__ void __launch_bounds__(MATVEC_THREADS)                                     \
        matvec_##name##_swiglu##suffix##_t##T(const u8* gate, const u8* up, u64 row_bytes, u32 n_in,  \
                                              u32 n_out, const float* x, float* out, u32 tokens) { pdl_start();   \
        matvec_float<W, T, U, true>(gate, up, row_bytes, n_in, n_out, x, out, tokens, nullptr);      \
    }
#define FLOAT_ENTRY(W, name, T)                                                                       \
    FLOAT_BLOCK_ENTRY(W, name, , T, 0)                                                               \
    FLOAT_BLOCK_ENTRY(W, name, _vec, T, 1)                                                           \
    FLOAT_BLOCK_ENTRY(W, name, _vec4, T, 4)                                                          \
    extern "C" __global__ void __launch_bounds__(MATVEC_THREADS, (T) <= 2 ? 8 : 4)                   \
        matvec_##name##_vec_warp_t##T(const u8* w, u64 row_bytes, u32 n_in, u32 n_out, const float* x, \
                                      float* out, u32 tokens, u32 rows_per_warp, const float* bias) { pdl_start(); \
        matvec_float_vec<W, T, false>(w, w, row_bytes, n_in, n_out, x, out, tokens, rows_per_warp, bias); \
    }                                                                                                \
    extern "C" __global__ void __launch_bounds__(MATVEC_THREADS, (T) <= 2 ? 8 : 4)                   \
        matvec_##name##_swiglu_vec_warp_t##T(const u8* gate, const u8* up, u64 row_bytes, u32 n_in,  \
                                             u32 n_out, const float* x, float* out, u32 tokens,      \
                                             u32 rows_per_warp) { pdl_start();                                    \
        matvec_float_vec<W, T, true>(gate, up, row_bytes, n_in, n_out, x, out, tokens, rows_per_warp, nullptr); \
    }
// The expert-indexed (mixture-of-experts) twins of the one-token kernels,
// matvec_<name>[_swiglu][|_vec|_vec4|_vec_warp]_id: one token row per pair p = blockIdx.y, the
// matrix of expert ids[p] (matrices expert_bytes apart) times x row p / x_group into out row p,
// each row summed exactly as the one-token kernel of the same variant sums it.
#define FLOAT_ID_BLOCK_ENTRY(W, name, suffix, U)                                                       \
    extern "C" __global__ void __launch_bounds__(MATVEC_THREADS)                                     \
        matvec_##name##suffix##_id(const u8* w, u64 expert_bytes, u64 row_bytes, u32 n_in, u32 n_out,  \
                                   const float* x, float* out, const u32* ids, u32 x_group) {        \
        pdl_start();                                                                                 \
        const u32 pair = blockIdx.y;                                                                 \
        const u8* m = w + (u64)ids[pair] * expert_bytes;                                             \
        matvec_float<W, 1, U, false>(m, m, row_bytes, n_in, n_out, x + (u64)(pair / x_group) * n_in,  \
                                     out + (u64)pair * n_out, 1, nullptr);                          \
    }                                                                                                \
    extern "C" __global__ void __launch_bounds__(MATVEC_THREADS)                                     \
        matvec_##name##_swiglu##suffix##_id(const u8* gate, const u8* up, u64 expert_bytes,          \
                                            u64 row_bytes, u32 n_in, u32 n_out, const float* x,      \
                                            float* out, const u32* ids, u32 x_group) {               \
        pdl_start();                                                                                 \
        const u32 pair = blockIdx.y;                                                                 \
        const u64 offset = (u64)ids[pair] * expert_bytes;                                            \
        matvec_float<W, 1, U, true>(gate + offset, up + offset, row_bytes, n_in, n_out,              \
                                    x + (u64)(pair / x_group) * n_in, out + (u64)pair * n_out, 1, nullptr); \
    }
#define FLOAT_ID_ENTRIES(W, name)                                                                     \
    FLOAT_ID_BLOCK_ENTRY(W, name, , 0)                                                               \
    FLOAT_ID_BLOCK_ENTRY(W, name, _vec, 1)                                                           \
    FLOAT_ID_BLOCK_ENTRY(W, name, _vec4, 4)                                                          \
    extern "C" __global__ void __launch_bounds__(MATVEC_THREADS, 8)                                  \
        matvec_##name##_vec_warp_id(const u8* w, u64 expert_bytes, u64 row_bytes, u32 n_in, u32 n_out, \
                                    const float* x, float* out, const u32* ids, u32 x_group,          \
                                    u32 rows_per_warp) {                                             \
        pdl_start();                                                                                 \
        const u32 pair = blockIdx.y;                                                                 \
        const u8* m = w + (u64)ids[pair] * expert_bytes;                                             \
        matvec_float_vec<W, 1, false>(m, m, row_bytes, n_in, n_out, x + (u64)(pair / x_group) * n_in, \
                                      out + (u64)pair * n_out, 1, rows_per_warp, nullptr);          \
    }                                                                                                \
    extern "C" __global__ void __launch_bounds__(MATVEC_THREADS, 8)                                  \
        matvec_##name##_swiglu_vec_warp_id(const u8* gate, const u8* up, u64 expert_bytes,           \
                                           u64 row_bytes, u32 n_in, u32 n_out, const float* x,       \
                                           float* out, const u32* ids, u32 x_group,                  \
                                           u32 rows_per_warp) {                                      \
        pdl_start();                                                                                 \
        const u32 pair = blockIdx.y;                                                                 \
        const u64 offset = (u64)ids[pair] * expert_bytes;                                            \
        matvec_float_vec<W, 1, true>(gate + offset, up + offset, row_bytes, n_in, n_out,             \
                                     x + (u64)(pair / x_group) * n_in, out + (u64)pair * n_out, 1,  \
                                     rows_per_warp, nullptr);                                        \
    }
#define FLOAT_ENTRIES(W, name) \
    FLOAT_ENTRY(W, name, 1)    \
    FLOAT_ENTRY(W, name, 2)    \
    FLOAT_ENTRY(W, name, 4)    \
    FLOAT_ENTRY(W, name, 8)    \
    FLOAT_ID_ENTRIES(W, name)

FLOAT_ENTRIES(F32, f32)
FLOAT_ENTRIES(F16, f16)
FLOAT_ENTRIES(BF16, bf16)
