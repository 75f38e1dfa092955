// Writes a step's keys or values ([tokens, width] f32) into the paged cache: row t goes to
// the cell of its position in its span's block table (step_cell), as f16 (rounded to nearest
// even) or f32. Rows outside every span are skipped.
//
// Launch: one block per row (grid.x = rows), any block size.
#include "common.cuh"
#include "rope.cuh"

extern "C" __global__ void kv_write_f16(u16* cache, const float* src, const i32* step, u32 width, u32 rows, u64 n_cells) { pdl_start();
    const i32 row = blockIdx.x;
    const i64 cell = row_cell(step, row, rows, n_cells);
    if (cell < 0) return;
    const float* in = src + (u64)row * width;
    u16* out = cache + (u64)cell * width;
    for (u32 i = threadIdx.x; i < width; i += blockDim.x) out[i] = float_to_half(in[i]);
}

extern "C" __global__ void kv_write_f32(float* cache, const float* src, const i32* step, u32 width, u32 rows, u64 n_cells) { pdl_start();
    const i32 row = blockIdx.x;
    const i64 cell = row_cell(step, row, rows, n_cells);
    if (cell < 0) return;
    const float* in = src + (u64)row * width;
    float* out = cache + (u64)cell * width;
    for (u32 i = threadIdx.x; i < width; i += blockDim.x) out[i] = in[i];
}

// Writes rows into a Q8_0 (34-byte blocks: f16 scale, 32 i8) or Q4_0 (18-byte blocks: f16
// scale, 16 bytes of nibble pairs: element j low, j + 16 high) cache, after the rotation in
// chunks of `rotation` (0: none). Q8_0: d = amax / 127, q = round(x / d); Q4_0: d = m / -8
// with m the element of largest magnitude, q = min(15, (i8)(x / d + 8.5)).
//
// Launch: one block per row (grid.x = rows), shared memory of `width` floats.
template <bool Q8>
__device__ void kv_write_blocks(u8* cache, const float* src, const i32* step, u32 width, u32 rows, u64 n_cells,
                                u32 rotation) {
    extern __shared__ float x[];
    const i32 row = blockIdx.x;
    const i64 cell = row_cell(step, row, rows, n_cells);
    if (cell < 0) return;
    for (u32 i = threadIdx.x; i < width; i += blockDim.x) x[i] = src[(u64)row * width + i];
    __syncthreads();
    if (rotation > 0) hadamard_chunks(x, width, rotation);
    const u32 block_bytes = Q8 ? 34 : 18;
    u8* out = cache + (u64)cell * (width / 32) * block_bytes;
    for (u32 b = threadIdx.x; b < width / 32; b += blockDim.x) {
        const float* v = x + b * 32;
        u8* blk = out + b * block_bytes;
        if (Q8) {
            float amax = 0.0f;
            for (u32 j = 0; j < 32; ++j) amax = fmaxf(amax, fabsf(v[j]));
            const float d = amax / 127.0f;
            const float id = d != 0.0f ? 1.0f / d : 0.0f;
            const u16 dh = float_to_half(d);
            blk[0] = (u8)(dh & 0xff);
            blk[1] = (u8)(dh >> 8);
            for (u32 j = 0; j < 32; ++j) blk[2 + j] = (u8)(i8)roundf(v[j] * id);
        } else {
            float amax = 0.0f, max = 0.0f;
            for (u32 j = 0; j < 32; ++j) {
                if (fabsf(v[j]) > amax) {
                    amax = fabsf(v[j]);
                    max = v[j];
                }
            }
            const float d = max / -8.0f;
            const float id = d != 0.0f ? 1.0f / d : 0.0f;
            const u16 dh = float_to_half(d);
            blk[0] = (u8)(dh & 0xff);
            blk[1] = (u8)(dh >> 8);
            for (u32 j = 0; j < 16; ++j) {
                const u8 q0 = (u8)min(15, (int)(i8)(v[j] * id + 8.5f));
                const u8 q1 = (u8)min(15, (int)(i8)(v[j + 16] * id + 8.5f));
                blk[2 + j] = q0 | (q1 << 4);
            }
        }
    }
}

extern "C" __global__ void kv_write_q8_0(u8* cache, const float* src, const i32* step, u32 width, u32 rows, u64 n_cells, u32 rotation) { pdl_start();
    kv_write_blocks<true>(cache, src, step, width, rows, n_cells, rotation);
}

extern "C" __global__ void kv_write_q4_0(u8* cache, const float* src, const i32* step, u32 width, u32 rows, u64 n_cells, u32 rotation) { pdl_start();
    kv_write_blocks<false>(cache, src, step, width, rows, n_cells, rotation);
}

// RoPE of q and k, then k and v written into caches of blocks (each Q8_0 or Q4_0: `k_q8`,
// `v_q8`), in one launch: exactly rope_f32 (rope.cu, no YaRN) of q and of k followed by
// kv_write_q8_0/q4_0 of each (their per-element arithmetic). grid.x = max(tokens, kv_rows),
// grid.y = q_heads + 2: blocks y < q_heads rotate that head of row x of q ([tokens, q_heads,
// head_dim]); block q_heads rotates every head of row x of k ([tokens, width]) in place, then
// writes it into k_cache; block q_heads + 1 writes row x of v into v_cache. Rows past `tokens`
// are not rotated, rows past `kv_rows` not written. Shared memory of `width` floats.
extern "C" __global__ void rope_kv_write_blocks(float* q, float* k, const float* v, u8* k_cache, u8* v_cache,
                                                const i32* step, const float* factors, u32 has_factors, u32 q_heads,
                                                u32 k_heads, u32 head_dim, u32 rotary_dim, float theta_scale,
                                                float freq_scale, u32 neox, u32 tokens, u32 width, u32 kv_rows,
                                                u64 k_cells, u64 v_cells, u32 k_q8, u32 v_q8, u32 k_rotation,
                                                u32 v_rotation) {
    pdl_start();
    if (rope_qk_rows(q, k, step, factors, has_factors, q_heads, k_heads, head_dim, rotary_dim, theta_scale, freq_scale,
                     neox, tokens, width))
        return;
    const bool key = blockIdx.y == q_heads;
    u8* cache = key ? k_cache : v_cache;
    const float* src = key ? k : v;
    const u64 n_cells = key ? k_cells : v_cells;
    const u32 rotation = key ? k_rotation : v_rotation;
    if (key ? k_q8 : v_q8)
        kv_write_blocks<true>(cache, src, step, width, kv_rows, n_cells, rotation);
    else
        kv_write_blocks<false>(cache, src, step, width, kv_rows, n_cells, rotation);
}
