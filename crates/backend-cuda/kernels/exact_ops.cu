// Exact numerics, non-matmul ops: each kernel gives the CPU backend's results bit for bit
// (the arithmetic lives in exact_math.cuh). Compiled with --fmad=false. Speed is not the aim:
// one thread per element or one warp per row or (row, head), grid-stride loops, so any grid
// size covers the work. Warp kernels need blockDim.x a multiple of 32 (blockDim.y = 1).
//
// Entry points (parameters; launch; the Rust function mirrored):
//
// exact_rms_norm(out, x, weight, width, eps, rows)
//     out[r] = rms_norm(x[r]) * weight for r < rows; out does not overlap x. One warp per row.
//     crates/backend-cpu/src/ops/norm.rs::rms_norm (normalize_row, inverse_rms).
// exact_rms_norm_in_place(x, weight, width, eps, rows)
//     The same written back into x (also the per-head norms: rows = tokens * heads,
//     width = head_dim). One warp per row. ops/norm.rs::rms_norm_in_place.
// exact_silu_mul(gate, up, n)
//     gate[i] = silu(gate[i]) * up[i] for i < n; the 16-value groups count from gate[0] (the
//     CPU op's buffer start), so a launch must cover the same buffer the CPU op is given.
//     One thread per element. ops/elementwise.rs::silu_mul -> vector/silu.rs::silu_mul.
// exact_rope(x, step, angles, table_positions, heads, head_dim, rotary_dim, neox)
//     Rotates the first rotary_dim dims of every head of the step's tokens (x: [tokens, heads,
//     head_dim]; token t's position is step positions[t]); neox = 1 for RopeStyle::Neox.
//     angles: host table [table_positions][rotary_dim / 2][2] f32 of (cos, sin); tokens at
//     positions >= table_positions are left alone (the host sizes the table to the context).
//     One thread per (token, head, pair). ops/rope.rs::rope (rotate_head, rotate_pair).
// exact_attention_f16(q, k_cache, v_cache, step, out, heads, kv_heads, head_dim, scale, window,
//                     rows_alone)
// exact_attention_f32(same, f32 caches)
//     Causal grouped-query attention of every row of the step's spans (q, out: [tokens,
//     heads, head_dim]; caches [cells, kv_heads * head_dim]; window 0 = no sliding window).
//     Spans, their first_row / rows / start_position, block tables and block_size come from
//     the step buffer (common.cuh StepHeader). Each span takes the CPU's path for it: the tiled
//     path when it has >= 64 rows and head_dim % 16 == 0 and rows_alone is 0, else the
//     one-chunk path (a lone row's: rows_alone != 0 in a pass whose rows must each get the
//     numbers of a pass of their own, speculative verification). Rows of no span are left
//     alone. One warp per (row, head).
//     ops/attention/mod.rs::attention -> chunk.rs::one_head | tiled.rs::tile.
// exact_moe_route(logits, ids, weights, tokens, experts, used, renormalise)
//     The router softmax and top-k of each token (logits [tokens, experts]) into ids and
//     weights [tokens, used], each token's experts ordered by index: the format of moe.cu's
//     moe_route, for moe_combine or runit_backend::moe::group_by_expert. One thread per token.
//     crates/backend/src/moe.rs::route_tokens.
//
// Host table: the RoPE angles. Entry [p][i] = the (cos, sin) of pair i at position p that
// crates/backend/src/ops.rs::RopeParams::angles(p, factors, ..) writes (libm's powf, cosf and
// sinf on the host, the values the CPU's ops/rope.rs rotates with), flattened to f32 pairs. One
// table per (theta, freq_scale, rotary_dim, rope_freqs); q and k share it when their params do.
//
// Already exact elsewhere, so not repeated here: add_f32, add_bias_f32 and copy_f32
// (elementwise.cu: one IEEE add or a copy per element, the same in any order); kv_write_f16 /
// kv_write_f32 (kv.cu: cvt.rn.f16.f32 is half's round to nearest even; positions from the
// step, which step.rs derives as start_position + row - first_row); embedding_* (dequant.cuh:
// every product and sum rounded separately, as crates/quant/src/dequant); gather_rows_f32 and
// scatter_add_rows_f32 (rows.cu: copies; product rounded, then added, sources in order);
// moe_combine (moe.cu: the experts' rows added from 0 in expert order, product then sum, as
// the CPU's zeroed output and scatter_add_rows per expert); the greedy pick's id (pick.cu:
// comparisons only, the first largest, NaNs never win).
#include "exact_math.cuh"

// This thread's warp in the grid, and the grid's warps (blockDim.x a multiple of 32).
__device__ __forceinline__ u64 grid_warp() { return ((u64)blockIdx.x * blockDim.x + threadIdx.x) / 32; }
__device__ __forceinline__ u64 grid_warps() { return (u64)gridDim.x * blockDim.x / 32; }
__device__ __forceinline__ u64 grid_thread() { return (u64)blockIdx.x * blockDim.x + threadIdx.x; }
__device__ __forceinline__ u64 grid_threads() { return (u64)gridDim.x * blockDim.x; }

extern "C" __global__ void exact_rms_norm(float* out, const float* x, const float* weight, u32 width, float eps,
                                          u32 rows) {
    pdl_start();
    for (u64 row = grid_warp(); row < rows; row += grid_warps())
        exact_rms_norm_row(x + row * width, weight, width, eps, out + row * width);
}

extern "C" __global__ void exact_rms_norm_in_place(float* x, const float* weight, u32 width, float eps, u32 rows) {
    pdl_start();
    for (u64 row = grid_warp(); row < rows; row += grid_warps())
        exact_rms_norm_row(x + row * width, weight, width, eps, x + row * width);
}

extern "C" __global__ void exact_silu_mul(float* gate, const float* up, u64 n) {
    pdl_start();
    const u64 grouped = n / SILU_GROUP * SILU_GROUP;
    for (u64 i = grid_thread(); i < n; i += grid_threads()) gate[i] = exact_swiglu(gate[i], up[i], i < grouped);
}

extern "C" __global__ void exact_rope(float* x, const i32* step, const float* angles, u32 table_positions, u32 heads,
                                     u32 head_dim, u32 rotary_dim, u32 neox) {
    pdl_start();
    const StepHeader* h = (const StepHeader*)step;
    const u64 pairs = rotary_dim / 2;
    const u64 per_token = heads * pairs;
    const u64 n = (u64)h->tokens * per_token;
    for (u64 index = grid_thread(); index < n; index += grid_threads()) {
        const u64 token = index / per_token;
        const u64 head = index % per_token / pairs;
        const u64 pair = index % pairs;
        const u32 position = (u32)step[h->positions + token];
        if (position >= table_positions) continue;
        const float* angle = angles + ((u64)position * pairs + pair) * 2;
        float* values = x + (token * heads + head) * head_dim;
        const u64 first = neox ? pair : 2 * pair;
        const u64 second = neox ? pair + pairs : 2 * pair + 1;
        exact_rotate_pair(values + first, values + second, angle[0], angle[1]);
    }
}

// Query rows a span needs for the tiled path, and the head_dim multiple it needs
// (ops/attention/mod.rs TILED_MIN_ROWS, TILED_HEAD_DIM_MULTIPLE).
constexpr i32 TILED_MIN_ROWS = 64;
constexpr u32 TILED_HEAD_DIM_MULTIPLE = 16;

template <typename K, typename V>
__device__ void exact_attention(const float* q, const K* k_cache, const V* v_cache, const i32* step, float* out,
                                u32 heads, u32 kv_heads, u32 head_dim, float scale, u32 window, u32 rows_alone) {
    const StepHeader* h = (const StepHeader*)step;
    const u32 group = heads / kv_heads;
    const u64 kv_width = (u64)kv_heads * head_dim;
    const u64 units = (u64)h->tokens * heads;
    for (u64 unit = grid_warp(); unit < units; unit += grid_warps()) {
        const i32 row = (i32)(unit / heads);
        const u32 head = (u32)(unit % heads);
        const i32 span = step[h->row_span + row];
        if (span < 0 || span >= h->spans) continue;
        const i32* info = step + h->span_info + span * 4;  // first_row, rows, start_position
        if (row < info[0] || row >= info[0] + info[1]) continue;
        const i32 position = info[2] + (row - info[0]);
        const i32 first = window == 0 ? 0 : max(0, position + 1 - (i32)window);
        const u64 at = ((u64)row * heads + head) * head_dim;
        const u64 kv_head = (u64)(head / group) * head_dim;
        if (!rows_alone && info[1] >= TILED_MIN_ROWS && head_dim % TILED_HEAD_DIM_MULTIPLE == 0)
            exact_attention_tiled_row(q + at, k_cache + kv_head, v_cache + kv_head, step, h, span, kv_width, head_dim,
                                      scale, first, position, out + at);
        else
            exact_attention_one_head(q + at, k_cache + kv_head, v_cache + kv_head, step, h, span, kv_width, head_dim,
                                     scale, first, position, out + at);
    }
}

extern "C" __global__ void exact_attention_f16(const float* q, const u16* k_cache, const u16* v_cache, const i32* step,
                                               float* out, u32 heads, u32 kv_heads, u32 head_dim, float scale,
                                               u32 window, u32 rows_alone) {
    pdl_start();
    exact_attention(q, k_cache, v_cache, step, out, heads, kv_heads, head_dim, scale, window, rows_alone);
}

extern "C" __global__ void exact_attention_f32(const float* q, const float* k_cache, const float* v_cache,
                                               const i32* step, float* out, u32 heads, u32 kv_heads, u32 head_dim,
                                               float scale, u32 window, u32 rows_alone) {
    pdl_start();
    exact_attention(q, k_cache, v_cache, step, out, heads, kv_heads, head_dim, scale, window, rows_alone);
}

extern "C" __global__ void exact_moe_route(const float* logits, u32* ids, float* weights, u32 tokens, u32 experts,
                                           u32 used, u32 renormalise) {
    pdl_start();
    for (u64 t = grid_thread(); t < tokens; t += grid_threads())
        exact_route_token(logits + t * experts, experts, used, renormalise != 0, ids + t * used, weights + t * used);
}
