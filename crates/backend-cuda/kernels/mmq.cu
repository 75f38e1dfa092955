// Batched matmul for decode batches (more rows than the matvecs take, up to 16):
// out[t][r] = sum_k W[r][k] * x[t][k], reading each packed weight block once per tile of
// 8 NT token rows, on the tensor cores (mma.sync m16n8k16, f16 inputs, f32 accumulators).
//
// A block of 4 warps owns MMQ_BLOCK_ROWS weight rows (32 per warp: two m16 tiles), 8 NT
// tokens and one range of k (gridDim.z ranges of `split` elements). Activations arrive as f16
// [tokens][n_in] (convert.cu's activation_f16_cpu, once per input) and are staged MMQ_CHUNK
// elements at a time in shared memory for the 4 warps. Each warp dequantizes (dequant.cuh,
// every type) its rows MMQ_SLAB elements at a time into its own shared slab, eight
// neighbouring lanes reading one row's bytes, and feeds the tensor cores from the slab and
// the staged activations with ldmatrix. With one range the block writes `out` (plus `bias`);
// with several it writes its partial sums and mmq_merge (below, launched next) adds them in
// range order, so results do not depend on timing.
#include "mmq.cuh"

#define MMQ_CHUNK 128
#define MMQ_SLAB 64
// 8 halfs (16 bytes) of padding per row: the 8 rows of an ldmatrix 8x8 matrix start 4 banks
// apart, so its reads hit 32 distinct banks.
#define MMQ_X_STRIDE (MMQ_CHUNK + 8)
#define MMQ_W_STRIDE (MMQ_SLAB + 8)

template <class W, int NT>
__device__ __forceinline__ void mmq(const u8* __restrict__ w, u64 row_bytes, u32 n_in, u32 n_out,
                                    const u16* __restrict__ x, u32 tokens, u32 split, float* __restrict__ out,
                                    const float* __restrict__ bias, float* __restrict__ partial) {
    __shared__ __align__(16) u16 staged[8 * NT][MMQ_X_STRIDE];
    __shared__ __align__(16) u16 slab[MMQ_THREADS / 32][MMQ_WARP_ROWS][MMQ_W_STRIDE];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int g = lane >> 2, t = lane & 3;
    const u32 row0 = blockIdx.x * MMQ_BLOCK_ROWS + warp * MMQ_WARP_ROWS;
    const u32 token0 = blockIdx.y * 8 * NT;
    const u32 k_begin = blockIdx.z * split;
    const u32 k_end = min(n_in, k_begin + split);
    u16 (*rows)[MMQ_W_STRIDE] = slab[warp];
    // ldmatrix addresses: A (m16 x k16 of the slab): lanes 0-15 rows 0-15 at k 0, lanes 16-31
    // rows 0-15 at k 8; B (two 8-token tiles x k16 of the staged activations): lane group q =
    // lane / 8 reads token tile q / 2 at k 8 (q % 2).
    const u32 a_address = shared_address(&rows[lane & 15][(lane >> 4) * 8]);
    const u32 b_address = shared_address(&staged[8 * (lane >> 4) + (lane & 7)][((lane >> 3) & 1) * 8]);
    float acc[2][NT][4];
#pragma unroll
    for (int m = 0; m < 2; m++)
#pragma unroll
        for (int n = 0; n < NT; n++)
#pragma unroll
            for (int i = 0; i < 4; i++) acc[m][n][i] = 0.0f;
    mmq_prefetch_then_wait(w, row_bytes, n_in, n_out, k_begin, k_end);

    for (u32 k0 = k_begin; k0 < k_end; k0 += MMQ_CHUNK) {
        const u32 chunk = min((u32)MMQ_CHUNK, k_end - k0);
        const u32 parts = chunk / 8;
        __syncthreads();
        for (u32 p = threadIdx.x; p < 8 * NT * parts; p += MMQ_THREADS) {
            const u32 token = p / parts, part = p % parts;
            uint4 v = make_uint4(0, 0, 0, 0);
            if (token0 + token < tokens) v = *(const uint4*)(x + (u64)(token0 + token) * n_in + k0 + 8 * part);
            *(uint4*)&staged[token][8 * part] = v;
        }
        __syncthreads();
        for (u32 step = 0; step < chunk; step += MMQ_SLAB) {
            // Dequantize the warp's 32 rows x MMQ_SLAB elements into its slab: lane l takes
            // group l % 8 of rows l / 8, l / 8 + 4, ... (neighbouring lanes read one row).
            const u64 group = (k0 + step) / 8 + (lane & 7);
            // All eight rows' values first (independent loads in flight together), then stores.
            float v[MMQ_WARP_ROWS / 4][8];
#pragma unroll
            for (int i = 0; i < MMQ_WARP_ROWS / 4; i++)
                dequant_group<W>(w + (u64)min(row0 + 4 * i + (lane >> 3), n_out - 1) * row_bytes, n_in, group, v[i]);
            __syncwarp();
#pragma unroll
            for (int i = 0; i < MMQ_WARP_ROWS / 4; i++) {
                uint4 packed;
                packed.x = pack_half2(v[i][0], v[i][1]);
                packed.y = pack_half2(v[i][2], v[i][3]);
                packed.z = pack_half2(v[i][4], v[i][5]);
                packed.w = pack_half2(v[i][6], v[i][7]);
                *(uint4*)&rows[4 * i + (lane >> 3)][8 * (lane & 7)] = packed;
            }
            __syncwarp();
#pragma unroll
            for (u32 kk = 0; kk < MMQ_SLAB; kk += 16) {
                u32 a[2][4];
#pragma unroll
                for (int m = 0; m < 2; m++)
                    load_matrix_x4(a[m], a_address + (16 * m * MMQ_W_STRIDE + kk) * 2);
#pragma unroll
                for (int n = 0; n < NT; n += 2) {
                    u32 b[4];
                    load_matrix_x4(b, b_address + (8 * n * MMQ_X_STRIDE + step + kk) * 2);
#pragma unroll
                    for (int m = 0; m < 2; m++) {
                        mma_16816(acc[m][n], a[m], b[0], b[1]);
                        mma_16816(acc[m][n + 1], a[m], b[2], b[3]);
                    }
                }
            }
        }
    }

    mmq_finish<NT>(acc, out, bias, partial, row0, token0, tokens, n_out, g, t);
}

// out[i] = sum over the `splits` ranges of partial[s][i] (in range order) + bias[i % n_out]
// for i < values (= tokens × n_out): the merge of a batched kernel's ranges.
extern "C" __global__ void mmq_merge(const float* __restrict__ partial, u64 values, u32 splits, u32 n_out,
                                     const float* __restrict__ bias, float* __restrict__ out) {
    pdl_start();
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < values; i += (u64)gridDim.x * blockDim.x) {
        float sum = 0.0f;
        for (u32 s = 0; s < splits; s++) sum += __ldcg(partial + s * values + i);
        out[i] = sum + (bias != nullptr ? bias[i % n_out] : 0.0f);
    }
}

#define MMQ_KERNEL(W, name, NT)                                                                              \
    extern "C" __global__ void __launch_bounds__(MMQ_THREADS) mmq_##name##_n##NT(                         \
        const u8* w, u64 row_bytes, u32 n_in, u32 n_out, const u16* x, u32 tokens, u32 split, float* out,   \
        const float* bias, float* partial) {                                                  \
        mmq<W, NT>(w, row_bytes, n_in, n_out, x, tokens, split, out, bias, partial);               \
    }

// Token tiles of 16 rows (NT = 2 tiles of 8): with more rows per tile the kernels ran slower
// than dequantizing for cuBLAS on an H200 (docs/perf-cuda.md), so only this one is built.
#define MMQ_ENTRIES(W, name) MMQ_KERNEL(W, name, 2)

MMQ_ENTRIES(F32, f32)
MMQ_ENTRIES(F16, f16)
MMQ_ENTRIES(BF16, bf16)
MMQ_ENTRIES(Q4_0, q4_0)
MMQ_ENTRIES(Q4_1, q4_1)
MMQ_ENTRIES(Q5_0, q5_0)
MMQ_ENTRIES(Q5_1, q5_1)
MMQ_ENTRIES(Q8_0, q8_0)
MMQ_ENTRIES(IQ4_NL, iq4_nl)
MMQ_ENTRIES(Q2_K, q2_k)
MMQ_ENTRIES(Q3_K, q3_k)
MMQ_ENTRIES(Q4_K, q4_k)
MMQ_ENTRIES(Q5_K, q5_k)
MMQ_ENTRIES(Q6_K, q6_k)
MMQ_ENTRIES(IQ4_XS, iq4_xs)
