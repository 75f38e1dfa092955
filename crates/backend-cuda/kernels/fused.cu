// Fused decoder ops that save launches, each with exactly the per-element arithmetic of the
// primitive kernels it replaces (so results are identical):
//   add_rms_norm_f32     add_f32 (elementwise.cu) then rms_norm_f32 (norm.cu)
//   rope_kv_write_f16/32 rope_f32 (rope.cu) of q and of k, then kv_write_f16/32 (kv.cu)
// The matmul epilogues (bias, SwiGLU) live in the matvec kernels (matvec.cuh, matvec_float.cu).
#include "quantize.cuh"
#include "rope.cuh"

__device__ __forceinline__ double warp_sum_f64(double v) {
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
    return v;
}

// x[r] += delta[r], then out[r] = x[r] / rms(x[r]) * weight for rows r < rows (out does not
// overlap x or delta); with `half`, also half[r] = activation_f16_cpu's conversion of out[r]
// in q8 mode `mode` (0-2; width a multiple of its unit) for the batched matmul that reads it. Launch exactly as rms_norm_f32 (ops/norm.rs launch_config): blockDim
// (threads_x, rows_per_block), one warp per short row or one block per long row, so the sum
// of squares is reduced in the same order as inverse_rms in norm.cu.
extern "C" __global__ void add_rms_norm_f32(float* x, const float* delta, float* out, const float* weight, u32 width,
                                            float eps, u32 rows, u16* half, u32 mode) {
    // A thread's first CACHED values (i = threadIdx.x + k * blockDim.x) stay in registers, and
    // their norm weights, which no earlier kernel writes, are read before waiting for it.
    constexpr u32 CACHED = 4;
    pdl_launch_dependents();
    __shared__ double scratch[32];
    const u32 row = blockIdx.x * blockDim.y + threadIdx.y;
    if (row >= rows) return;  // whole rows (and so whole reducing groups) leave together
    float scales[CACHED], kept[CACHED];
#pragma unroll
    for (u32 k = 0; k < CACHED; k++) {
        const u32 i = threadIdx.x + k * blockDim.x;
        scales[k] = i < width ? weight[i] : 0.0f;
    }
    pdl_wait();
    float* values = x + (u64)row * width;
    const float* d = delta + (u64)row * width;
    float* dst = out + (u64)row * width;
    double sum = 0.0;
#pragma unroll
    for (u32 k = 0; k < CACHED; k++) {
        const u32 i = threadIdx.x + k * blockDim.x;
        if (i < width) {
            const float value = values[i] + d[i];
            values[i] = value;
            kept[k] = value;
            sum += (double)__fmul_rn(value, value);
        }
    }
    for (u32 i = threadIdx.x + CACHED * blockDim.x; i < width; i += blockDim.x) {
        const float value = values[i] + d[i];
        values[i] = value;
        sum += (double)__fmul_rn(value, value);
    }
    sum = warp_sum_f64(sum);
    if (blockDim.x > 32) {
        const u32 lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
        if (lane == 0) scratch[warp] = sum;
        __syncthreads();
        const u32 warps = (blockDim.x + 31) >> 5;
        sum = warp_sum_f64(lane < warps ? scratch[lane] : 0.0);
    }
    const float mean = (float)(sum / (double)width);
    const float scale = 1.0f / sqrtf(mean + eps);
    // Past the cached values, each thread reads back only the values it wrote.
#pragma unroll
    for (u32 k = 0; k < CACHED; k++) {
        const u32 i = threadIdx.x + k * blockDim.x;
        if (i < width) dst[i] = kept[k] * scale * scales[k];
    }
    for (u32 i = threadIdx.x + CACHED * blockDim.x; i < width; i += blockDim.x) dst[i] = values[i] * scale * weight[i];
    if (half == nullptr) return;
    // The row's values, written by the warp (a warp a row) or the block (a block a row), then
    // converted unit by unit as activation_f16_cpu converts them.
    u32 warp = 0, warps = 1;
    if (blockDim.x == 32) {
        __syncwarp();
    } else {
        __syncthreads();
        warp = threadIdx.x >> 5;
        warps = blockDim.x >> 5;
    }
    const u32 units = width / (mode == 2 ? 256 : 32);
    for (u32 unit = warp; unit < units; unit += warps)
        activation_f16_unit(dst, half + (u64)row * width, unit, mode, threadIdx.x & 31);
}

__device__ __forceinline__ void store_cell(u16* out, float value) { *out = float_to_half(value); }
__device__ __forceinline__ void store_cell(float* out, float value) { *out = value; }

// One block per (row, head), optionally RMS-normalising the head first (Qwen3's per-head
// q/k norms, has_norm): grid.x = max(tokens, kv_rows), grid.y = q_heads + k_heads (the
// query heads first), any block size. Row t < tokens: the block's head of q ([tokens, q_heads,
// head_dim]) or k ([tokens, k_heads, head_dim]) is rotated in place as rope_f32 rotates it, each
// thread computing its own pair's angle. Then a key head's block writes, for rows t < kv_rows,
// that head of k and the same head of v ([tokens, width]) to the cell of the row's position, as
// kv_write_f16/32. Many small blocks instead of one per row: a decode step's single row no
// longer runs on one multiprocessor.
template <class C>
__device__ __forceinline__ void rope_kv_write(float* q, float* k, const float* v, C* k_cache, C* v_cache,
                                              const i32* step, const float* factors, u32 has_factors, u32 q_heads,
                                              u32 k_heads, u32 head_dim, u32 rotary_dim, float theta_scale,
                                              float freq_scale, u32 neox, u32 tokens, u32 width, u32 kv_rows,
                                              u64 k_cells, u64 v_cells, const float* q_norm, const float* k_norm,
                                              u32 has_norm, float eps) {
    __shared__ float norm_scale;
    const StepHeader* h = (const StepHeader*)step;
    const u32 token = blockIdx.x, slot = blockIdx.y;
    const bool rotate = token < tokens && (i32)token < h->tokens;
    const bool key = slot >= q_heads;
    if (!key && !rotate) return;  // uniform over the block
    const u32 pairs = rotary_dim / 2;
    const u32 kv_head = key ? slot - q_heads : 0;
    float* values = key ? k + (u64)token * width + (u64)kv_head * head_dim
                        : q + ((u64)token * q_heads + slot) * head_dim;
    if (rotate && has_norm) {
        // The head's RMS norm as rms_norm_in_place_f32 computes a row of head_dim <= 256
        // values (one warp: lane l sums the squares of l, l + 32, ... in f64, then the xor
        // tree), written back before the rotation reads it.
        if (threadIdx.x < 32) {
            double sum = 0.0;
            for (u32 i = threadIdx.x; i < head_dim; i += 32) {
                const float value = values[i];
                sum += (double)__fmul_rn(value, value);
            }
            sum = warp_sum_f64(sum);
            const float mean = (float)(sum / (double)head_dim);
            if (threadIdx.x == 0) norm_scale = 1.0f / sqrtf(mean + eps);
        }
        __syncthreads();
        const float scale = norm_scale;
        const float* weight = key ? k_norm : q_norm;
        for (u32 i = threadIdx.x; i < head_dim; i += blockDim.x) values[i] = values[i] * scale * weight[i];
        __syncthreads();
    }
    if (rotate) {
        const float position = (float)(u32)step[h->positions + token];
        for (u32 pair = threadIdx.x; pair < pairs; pair += blockDim.x)
            rope_pair(values, pair, position, factors, has_factors, rotary_dim, theta_scale, freq_scale, neox);
    }
    if (!key) return;
    // The rotated key head, written by this block's threads, is read below.
    __syncthreads();
    const i32 row = (i32)token;
    if (token >= kv_rows) return;
    const i32 span = owning_span(step, h, row);
    if (span < 0) return;
    const i32 cell = step_cell(step, h, span, step[h->positions + row]);
    if (cell < 0) return;
    const u64 at = (u64)kv_head * head_dim;
    const float* v_in = v + (u64)row * width + at;
    if ((u64)cell < k_cells) {
        C* out = k_cache + (u64)cell * width + at;
        for (u32 i = threadIdx.x; i < head_dim; i += blockDim.x) store_cell(out + i, values[i]);
    }
    if ((u64)cell < v_cells) {
        C* out = v_cache + (u64)cell * width + at;
        for (u32 i = threadIdx.x; i < head_dim; i += blockDim.x) store_cell(out + i, v_in[i]);
    }
}

#define ROPE_KV_WRITE(name, C)                                                                                     \
    extern "C" __global__ void rope_kv_write_##name(float* q, float* k, const float* v, C* k_cache, C* v_cache,     \
                                                    const i32* step, const float* factors, u32 has_factors,        \
                                                    u32 q_heads, u32 k_heads, u32 head_dim, u32 rotary_dim,        \
                                                    float theta_scale, float freq_scale, u32 neox, u32 tokens,     \
                                                    u32 width, u32 kv_rows, u64 k_cells, u64 v_cells,              \
                                                    const float* q_norm, const float* k_norm, u32 has_norm,        \
                                                    float eps) { pdl_start();                                      \
        rope_kv_write<C>(q, k, v, k_cache, v_cache, step, factors, has_factors, q_heads, k_heads, head_dim,        \
                         rotary_dim, theta_scale, freq_scale, neox, tokens, width, kv_rows, k_cells, v_cells,      \
                         q_norm, k_norm, has_norm, eps);                                                           \
    }
ROPE_KV_WRITE(f16, u16)
ROPE_KV_WRITE(f32, float)
