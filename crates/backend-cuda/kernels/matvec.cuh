// The decode matvec skeleton shared by the quantized weight types (llama.cpp's MMVQ idea):
// activations are first quantized to q8_1 blocks of 32 (int8 values + per-block scale d and
// d * sum), then each weight block is split into PARTS parts whose packed integers are
// dotted with the activation bytes by dp4a.
//
// Activation layout (written by quantize_q8_1 in convert.cu): `aq` [tokens][n_in] int8 and
// `ads` [tokens][n_in / 32] float2 (d, d * sum of the block's int8 values).
//
// A weight type W used here provides, beside dequant.cuh's QK and BYTES:
//   PARTS                  parts of one block (a power of two dividing MATVEC_THREADS)
//   struct Part            a part of the block, unpacked into registers
//   load(block, p)         reads part p of the block
//   dot(part, p, aq, ads)  its contribution to one token's output, aq / ads pointing at the
//                          activation of the block's first element
//
// Each block of MATVEC_THREADS threads computes MATVEC_ROWS(T) output rows; thread i takes
// parts i, i + MATVEC_THREADS, ... of every row (MatvecSteps<W> steps of them loaded at once).
// (A warp-per-row variant streaming rows through shared memory with cp.async measured 1.5-2x
// slower on an H200 for every quantized type and was dropped.)
#pragma once
#include "dequant.cuh"

// Threads per block (four warps, as MMVQ uses for one token).
#define MATVEC_THREADS 128

// The int8 activations 4 * k .. 4 * k + 3 past `aq` as one int.
__device__ __forceinline__ int act4(const i8* aq, int element) { return *(const int*)(aq + element); }

// Per-byte a - b, for bytes of a below 0x80 and bytes of b at most 0x80 (no borrows).
__device__ __forceinline__ int sub_bytes(u32 a, u32 b) { return (int)(((a | 0x80808080u) - b) ^ 0x80808080u); }

// Steps whose parts a thread loads at once: 1, unless a type says more
// (measured on an H200: two for Q4_0; more parts per thread cost registers and occupancy,
// which made Q8_0 and the K formats slower).
template <class W> struct MatvecSteps { static constexpr int VALUE = 1; };

// out[t][row] = W[row] . x[t] (+ bias[row] when bias is not null) for t < tokens (T >= tokens,
// a compile-time bound so the accumulators stay in registers), rows R * blockIdx.x .. + R;
// every thread loads its parts of U steps of all R rows before using any.
//
// S (SwiGLU): the block's R weight rows are R / 2 rows of `w` (gate) and the same rows of
// `w_up`, and out[t][row] = silu(gate . x[t]) * (up . x[t]), each dot summed exactly as the
// plain kernel sums it and silu as silu_mul_f32 (elementwise.cu) computes it.
#define MATVEC_ROWS(T) ((T) <= 2 ? 4 : 2)
template <class W, int T, int R, bool S>
__device__ __forceinline__ void matvec_block(const u8* __restrict__ w, const u8* __restrict__ w_up, u64 row_bytes,
                                             u32 n_in, u32 n_out, const i8* __restrict__ aq,
                                             const float2* __restrict__ ads, float* __restrict__ out, u32 tokens,
                                             const float* __restrict__ bias, u32 block_index) {
    constexpr int U = MatvecSteps<W>::VALUE;
    // Output rows per block.
    constexpr int O = S ? R / 2 : R;
    const u32 first_row = block_index * O;
    const u8* rows[R];
#pragma unroll
    for (int r = 0; r < R; r++) {
        // Rows past the end repeat the last one; their sums are not written.
        const u32 wanted = first_row + (u32)(r % O);
        const u32 row = wanted < n_out ? wanted : n_out - 1;
        rows[r] = (S && r >= O ? w_up : w) + (u64)row * row_bytes;
    }
    // The weights are never written by an earlier kernel: while that kernel finishes (the
    // entry points only let dependents launch), this block's rows are pulled toward L2; then
    // it waits for the activations. (A second wait, after an entry's pdl_start, returns at once.)
    if (first_row < n_out) {
        const u64 bytes = (u64)(n_out - first_row < (u32)O ? n_out - first_row : (u32)O) * row_bytes;
        prefetch_l2(w + (u64)first_row * row_bytes, bytes);
        if constexpr (S) prefetch_l2(w_up + (u64)first_row * row_bytes, bytes);
    }
    pdl_wait();
    const u32 items = n_in / W::QK * W::PARTS;
    const u32 act_blocks = n_in / 32;
    float acc[R][T];
#pragma unroll
    for (int r = 0; r < R; r++) {
#pragma unroll
        for (int t = 0; t < T; t++) acc[r][t] = 0.0f;
    }
    if constexpr (U == 1) {
        for (u32 i = threadIdx.x; i < items; i += MATVEC_THREADS) {
            const u32 block = i / W::PARTS;
            const int p = (int)(i % W::PARTS);
            typename W::Part part[R];
#pragma unroll
            for (int r = 0; r < R; r++) part[r] = W::load(rows[r] + (u64)block * W::BYTES, p);
            const i8* a = aq + block * W::QK;
            const float2* s = ads + block * (W::QK / 32);
#pragma unroll
            for (int t = 0; t < T; t++) {
                if (t < (int)tokens) {
#pragma unroll
                    for (int r = 0; r < R; r++) acc[r][t] += W::dot(part[r], p, a + (u64)t * n_in, s + (u64)t * act_blocks);
                }
            }
        }
    } else {
        // PARTS divides MATVEC_THREADS, so a thread's part index is the same in every item.
        const int p = (int)(threadIdx.x % W::PARTS);
        for (u32 i0 = threadIdx.x; i0 < items; i0 += MATVEC_THREADS * U) {
            typename W::Part part[U][R];
#pragma unroll
            for (int u = 0; u < U; u++) {
                const u32 i = i0 + MATVEC_THREADS * u;
                if (i < items) {
#pragma unroll
                    for (int r = 0; r < R; r++) part[u][r] = W::load(rows[r] + (u64)(i / W::PARTS) * W::BYTES, p);
                }
            }
#pragma unroll
            for (int u = 0; u < U; u++) {
                const u32 i = i0 + MATVEC_THREADS * u;
                if (i < items) {
                    const u32 block = i / W::PARTS;
                    const i8* a = aq + block * W::QK;
                    const float2* s = ads + block * (W::QK / 32);
#pragma unroll
                    for (int t = 0; t < T; t++) {
                        if (t < (int)tokens) {
#pragma unroll
                            for (int r = 0; r < R; r++)
                                acc[r][t] += W::dot(part[u][r], p, a + (u64)t * n_in, s + (u64)t * act_blocks);
                        }
                    }
                }
            }
        }
    }
    __shared__ float partial[MATVEC_THREADS / 32][R * T];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int r = 0; r < R; r++) {
#pragma unroll
        for (int t = 0; t < T; t++) {
            const float v = warp_sum(acc[r][t]);
            if (lane == 0) partial[warp][r * T + t] = v;
        }
    }
    __syncthreads();
    if (threadIdx.x < O * T) {
        const int r = threadIdx.x / T, t = threadIdx.x % T;
        const u32 row = first_row + r;
        if (row < n_out && t < (int)tokens) {
            float sum = 0.0f;
#pragma unroll
            for (int k = 0; k < MATVEC_THREADS / 32; k++) sum += partial[k][threadIdx.x];
            if constexpr (S) {
                float up = 0.0f;
#pragma unroll
                for (int k = 0; k < MATVEC_THREADS / 32; k++) up += partial[k][threadIdx.x + O * T];
                out[(u64)t * n_out + row] = __fmul_rn(sum / (1.0f + expf(-sum)), up);
            } else {
                out[(u64)t * n_out + row] = bias != nullptr ? sum + bias[row] : sum;
            }
        }
    }
}

// The extern "C" entry points of one quantized type: matvec_<name>_t{1,2,4,8} (bias: an f32
// [n_out] vector added in the epilogue, or null), matvec_<name>_swiglu_t{1,2,4,8},
// matvec_<name>_qkv_t{1,2,4,8} and the expert twins matvec_<name>[_swiglu]_id.
#define MATVEC_ENTRY(W, name, T)                                                                        \
    extern "C" __global__ void __launch_bounds__(MATVEC_THREADS)                                       \
        matvec_##name##_t##T(const u8* w, u64 row_bytes, u32 n_in, u32 n_out, const i8* aq,          \
                             const float2* ads, float* out, u32 tokens, const float* bias) { pdl_launch_dependents(); \
        matvec_block<W, T, MATVEC_ROWS(T), false>(w, w, row_bytes, n_in, n_out, aq, ads, out, tokens, bias, \
                                                  blockIdx.x);                                         \
    }                                                                                                  \
    extern "C" __global__ void __launch_bounds__(MATVEC_THREADS)                                       \
        matvec_##name##_swiglu_t##T(const u8* gate, const u8* up, u64 row_bytes, u32 n_in, u32 n_out,  \
                                    const i8* aq, const float2* ads, float* out, u32 tokens) { pdl_launch_dependents(); \
        matvec_block<W, T, MATVEC_ROWS(T), true>(gate, up, row_bytes, n_in, n_out, aq, ads, out, tokens, nullptr, \
                                                 blockIdx.x);                                          \
    }                                                                                                  \
    /* Q, K and V of one input in one launch: the first ceil(n_q / R) blocks compute q, the next */  \
    /* ceil(n_kv / R) k, the rest v, each block exactly as matvec_<name>_t<T>. */                   \
    extern "C" __global__ void __launch_bounds__(MATVEC_THREADS)                                       \
        matvec_##name##_qkv_t##T(const u8* wq, const u8* wk, const u8* wv, u64 row_bytes, u32 n_in,    \
                                 u32 n_q, u32 n_kv, const i8* aq, const float2* ads, float* out_q,      \
                                 float* out_k, float* out_v, u32 tokens, const float* bias_q,           \
                                 const float* bias_k, const float* bias_v) { pdl_launch_dependents(); \
        constexpr u32 R = MATVEC_ROWS(T);                                                              \
        const u32 q_blocks = (n_q + R - 1) / R, kv_blocks = (n_kv + R - 1) / R;                        \
        const u32 b = blockIdx.x;                                                                      \
        if (b < q_blocks)                                                                              \
            matvec_block<W, T, R, false>(wq, wq, row_bytes, n_in, n_q, aq, ads, out_q, tokens, bias_q, b); \
        else if (b < q_blocks + kv_blocks)                                                             \
            matvec_block<W, T, R, false>(wk, wk, row_bytes, n_in, n_kv, aq, ads, out_k, tokens, bias_k, \
                                         b - q_blocks);                                                \
        else                                                                                           \
            matvec_block<W, T, R, false>(wv, wv, row_bytes, n_in, n_kv, aq, ads, out_v, tokens, bias_v, \
                                         b - q_blocks - kv_blocks);                                    \
    }
// The expert-indexed (mixture-of-experts) twins of matvec_<name>_t1 and _swiglu_t1, for one
// token row per pair p = blockIdx.y: the matrix of expert ids[p] (matrices expert_bytes apart
// from w, gate, up) times activation row p / x_group (x_group = experts per token when every
// slot of a token reads the token's row, 1 when each pair has its own row), into out row p.
// Each row is summed exactly as the one-token kernels sum it.
#define MATVEC_ID_ENTRIES(W, name)                                                                    \
    extern "C" __global__ void __launch_bounds__(MATVEC_THREADS)                                       \
        matvec_##name##_id(const u8* w, u64 expert_bytes, u64 row_bytes, u32 n_in, u32 n_out,           \
                           const i8* aq, const float2* ads, float* out, const u32* ids, u32 x_group) {  \
        pdl_start();                                                                                   \
        const u32 pair = blockIdx.y, x_row = pair / x_group;                                           \
        const u8* m = w + (u64)ids[pair] * expert_bytes;                                               \
        matvec_block<W, 1, MATVEC_ROWS(1), false>(m, m, row_bytes, n_in, n_out, aq + (u64)x_row * n_in, \
                                                  ads + (u64)x_row * (n_in / 32), out + (u64)pair * n_out, \
                                                  1, nullptr, blockIdx.x);                             \
    }                                                                                                  \
    extern "C" __global__ void __launch_bounds__(MATVEC_THREADS)                                       \
        matvec_##name##_swiglu_id(const u8* gate, const u8* up, u64 expert_bytes, u64 row_bytes,       \
                                  u32 n_in, u32 n_out, const i8* aq, const float2* ads, float* out,    \
                                  const u32* ids, u32 x_group) {                                       \
        pdl_start();                                                                                   \
        const u32 pair = blockIdx.y, x_row = pair / x_group;                                           \
        const u64 offset = (u64)ids[pair] * expert_bytes;                                              \
        matvec_block<W, 1, MATVEC_ROWS(1), true>(gate + offset, up + offset, row_bytes, n_in, n_out,    \
                                                 aq + (u64)x_row * n_in, ads + (u64)x_row * (n_in / 32), \
                                                 out + (u64)pair * n_out, 1, nullptr, blockIdx.x);     \
    }
#define MATVEC_ENTRIES(W, name) \
    MATVEC_ENTRY(W, name, 1)    \
    MATVEC_ENTRY(W, name, 2)    \
    MATVEC_ENTRY(W, name, 4)    \
    MATVEC_ENTRY(W, name, 8)    \
    MATVEC_ID_ENTRIES(W, name)
