// Tensor-core attention over an f16 paged KV cache (head_dim 64 or 128), the fast twins of
// attention.cu's kernels (which stay for f32 caches and other head sizes). Same contract:
// q, out: [tokens, heads, head_dim] f32; K/V caches: [cells, kv_heads * head_dim] f16; a query
// at position p sees keys lo ..= p of its span (lo = 0, or max(0, p + 1 - window)); scores are
// scale * (q · k), the softmax is in f32. Queries and probabilities are rounded to f16 for
// mma.sync.m16n8k16 (f32 accumulators).
//
// - attention_prefill_mma_*: flash-attention 2. One block of 4 warps per (tile of 64 query
//   rows of one span, head); each warp owns 16 rows. K/V tiles of 64 positions are copied into
//   shared memory with cp.async (the next K tile loads while this tile's softmax and P·V run,
//   the next V tile while the next scores run), fragments come from ldmatrix.
// - attention_decode_mma_*: flash-decoding partials with the query heads of one kv head as
//   the 16 mma rows. One block per (row, kv head, slice of <= 16 query heads, chunk); each warp
//   walks its own 16-position sub-tiles of the chunk, the 4 warps merge in shared memory. A row
//   whose visible range lies in one chunk is written to `out` directly (attention_combine
//   skips it); otherwise the chunk's (max, sum, accumulator) go to the partials.
#include "common.cuh"
#include "flash_mma.cuh"

#define MMA_WARPS 4
#define MMA_THREADS (MMA_WARPS * 32)
#define KEY_TILE 64
#define QUERY_TILE (MMA_WARPS * 16)
#define SUB_TILE 16
#define ROW_PAD 8

// ----- PTX helpers ---------------------------------------------------------------------------

__device__ __forceinline__ void copy_async_16(u32 destination, const void* source) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(destination), "l"(source) : "memory");
}

__device__ __forceinline__ void copy_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }

// Waits until at most one committed group of this thread is still in flight.
__device__ __forceinline__ void copy_async_wait_one() { asm volatile("cp.async.wait_group 1;" ::: "memory"); }

__device__ __forceinline__ void copy_async_wait_all() { asm volatile("cp.async.wait_group 0;" ::: "memory"); }

__device__ __forceinline__ void store_zero_16(u32 destination) {
    asm volatile("st.shared.v4.u32 [%0], {%1, %1, %1, %1};" ::"r"(destination), "r"(0u) : "memory");
}

// ----- shared pieces ---------------------------------------------------------------------------

// The span owning `row`, or -1 when no span's rows include it.
__device__ __forceinline__ i32 mma_row_span(const i32* step, const StepHeader* h, i32 row) {
    if (row < 0 || row >= h->tokens) return -1;
    const i32 span = step[h->row_span + row];
    if (span < 0 || span >= h->spans) return -1;
    const i32* info = step + h->span_info + span * 4;
    return row >= info[0] && row < info[0] + info[1] ? span : -1;
}

__device__ __forceinline__ i32 mma_first_visible(i32 position, u32 window) {
    return window == 0 ? 0 : max(0, position + 1 - (i32)window);
}

// The A fragments of 16 query vectors (rows `row0` = g and `row1` = g + 8 of the fragment,
// null for a padding row), each D floats, rounded to f16.
template <int D>
__device__ __forceinline__ void load_queries(u32 (&fragment)[D / 16][4], const float* row0, const float* row1) {
    const u32 lane = threadIdx.x & 31, t = lane & 3;
#pragma unroll
    for (int ks = 0; ks < D / 16; ++ks) {
        const int c = ks * 16 + 2 * (int)t;
        float2 a = make_float2(0.0f, 0.0f), b = a, c8 = a, d8 = a;
        if (row0) {
            a = *(const float2*)(row0 + c);
            c8 = *(const float2*)(row0 + c + 8);
        }
        if (row1) {
            b = *(const float2*)(row1 + c);
            d8 = *(const float2*)(row1 + c + 8);
        }
        fragment[ks][0] = pack_half2(a.x, a.y);
        fragment[ks][1] = pack_half2(b.x, b.y);
        fragment[ks][2] = pack_half2(c8.x, c8.y);
        fragment[ks][3] = pack_half2(d8.x, d8.y);
    }
}

// Copies the D-wide rows of `keys` positions (cells[] per copy slot, -1: past the end, zeros)
// into shared memory with cp.async, `threads` threads from thread index `index`.
template <int D, int STRIDE, int LOADS, int THREADS>
__device__ __forceinline__ void copy_rows(u32 destination, const u16* cache, const i32 (&cells)[LOADS],
                                          u64 kv_width, u64 kv_offset, u32 index) {
#pragma unroll
    for (int i = 0; i < LOADS; ++i) {
        const u32 c = index + (u32)i * THREADS;
        const u32 key = c / (D / 8), chunk = c % (D / 8);
        const u32 at = destination + (key * STRIDE + chunk * 8) * 2;
        if (cells[i] >= 0)
            copy_async_16(at, cache + (u64)cells[i] * kv_width + kv_offset + chunk * 8);
        else
            store_zero_16(at);
    }
}

// The cells of the keys each copy slot of copy_rows covers, for keys first .. first + rows:
// slot i's key is THREADS / (D / 8) keys past slot i - 1's, so the cells are walked by
// additions (CellWalk) rather than a division each.
template <int D, int LOADS, int THREADS>
__device__ __forceinline__ void slot_cells(i32 (&cells)[LOADS], const i32* step, const StepHeader* h, i32 span,
                                           i32 first, i32 end, u32 index) {
    static_assert(THREADS % (D / 8) == 0, "a slot's key is a whole number of keys past the last");
    constexpr i32 KEYS_A_SLOT = THREADS / (D / 8);
    i32 position = first + (i32)(index / (D / 8));
    CellWalk walk(step, h, span, position);
#pragma unroll
    for (int i = 0; i < LOADS; ++i) {
        cells[i] = position < end ? walk.cell() : -1;
        position += KEYS_A_SLOT;
        walk.advance(KEYS_A_SLOT);
    }
}

// ----- prefill ---------------------------------------------------------------------------------
// grid (tiles, heads) with tiles >= Σ ceil(rows_s / 64) over spans, MMA_THREADS threads.
template <int D>
__device__ __forceinline__ void prefill_mma(const float* q, const u16* k_cache, const u16* v_cache, const i32* step,
                                            float* out, u32 heads, u32 kv_heads, float scale, u32 window) {
    constexpr int STRIDE = D + ROW_PAD;
    constexpr int LOADS = KEY_TILE * (D / 8) / MMA_THREADS;
    __shared__ __align__(16) u16 keys[KEY_TILE * STRIDE];
    __shared__ __align__(16) u16 values[KEY_TILE * STRIDE];
    __shared__ i32 warp_begin[MMA_WARPS], warp_end[MMA_WARPS];

    const StepHeader* h = (const StepHeader*)step;
    // This block's span and tile; the last tiles (the longest rows) start first.
    const PrefillTile tile_of(step, gridDim.x - 1 - blockIdx.x, QUERY_TILE);
    const i32 span = tile_of.span, span_end = tile_of.span_end;
    if (span < 0) return;  // block-uniform

    const u32 head = blockIdx.y;
    const u32 kv_head = head / (heads / kv_heads);
    const u64 kv_width = (u64)kv_heads * D;
    const u64 kv_offset = (u64)kv_head * D;
    const u32 lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;

    // The thread's two rows (g and g + 8 of the warp's 16), the warp's key ranges.
    const MmaPrefillRows rr(step, tile_of.first_row + (i32)(warp * 16), span_end, window);
    const i32 begin = rr.begin, end = rr.end;
    if (lane == 0) {
        warp_begin[warp] = begin;
        warp_end[warp] = end;
    }

    u32 query[D / 16][4];
    load_queries<D>(query, rr.rows[0] < span_end ? q + ((u64)rr.rows[0] * heads + head) * D : nullptr,
                    rr.rows[1] < span_end ? q + ((u64)rr.rows[1] * heads + head) * D : nullptr);
    __syncthreads();
    const int2 block_range = mma_block_range<MMA_WARPS>(warp_begin, warp_end);
    const i32 block_begin = block_range.x, block_end = block_range.y;
    if (block_begin >= block_end) return;  // block-uniform (no valid row)

    const float scale_log2 = scale * LOG2E;
    float running_max[2] = {NEG_INF, NEG_INF}, sum[2] = {0.0f, 0.0f};
    float acc[D / 8][4];
#pragma unroll
    for (int n = 0; n < D / 8; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;

    const u32 keys_at = shared_address(keys), values_at = shared_address(values);
    i32 cells[LOADS];
    slot_cells<D, LOADS, MMA_THREADS>(cells, step, h, span, block_begin, block_end, threadIdx.x);
    copy_rows<D, STRIDE, LOADS, MMA_THREADS>(keys_at, k_cache, cells, kv_width, kv_offset, threadIdx.x);
    copy_async_commit();
    copy_rows<D, STRIDE, LOADS, MMA_THREADS>(values_at, v_cache, cells, kv_width, kv_offset, threadIdx.x);
    copy_async_commit();

    for (i32 tile = block_begin; tile < block_end; tile += KEY_TILE) {
        const i32 next = tile + KEY_TILE;
        // Warp-uniform: does this tile meet the warp's rows?
        const bool active = tile < end && next > begin;
        float s[KEY_TILE / 8][4];
        copy_async_wait_one();  // this tile's keys
        __syncthreads();
        if (active) flash_scores<D, STRIDE, KEY_TILE / 16>(s, query, keys_at);
        __syncthreads();  // the keys are consumed: load the next tile's
        if (next < block_end) {
            slot_cells<D, LOADS, MMA_THREADS>(cells, step, h, span, next, block_end, threadIdx.x);
            copy_rows<D, STRIDE, LOADS, MMA_THREADS>(keys_at, k_cache, cells, kv_width, kv_offset, threadIdx.x);
        }
        copy_async_commit();
        u32 p[KEY_TILE / 16][4];
        if (active) {
            rr.mask<KEY_TILE / 8>(s, tile, scale_log2);
            flash_softmax_step<KEY_TILE / 8, D / 8>(s, running_max, sum, acc, p);
        }
        copy_async_wait_one();  // this tile's values
        __syncthreads();
        if (active) flash_accumulate<D, STRIDE, KEY_TILE / 16>(acc, p, values_at);
        __syncthreads();  // the values are consumed: load the next tile's
        if (next < block_end)
            copy_rows<D, STRIDE, LOADS, MMA_THREADS>(values_at, v_cache, cells, kv_width, kv_offset, threadIdx.x);
        copy_async_commit();
    }
    copy_async_wait_all();

#pragma unroll
    for (int r = 0; r < 2; ++r) {
        sum[r] += __shfl_xor_sync(0xffffffffu, sum[r], 1);
        sum[r] += __shfl_xor_sync(0xffffffffu, sum[r], 2);
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        if (rr.rows[r] >= span_end) continue;
        const float inverse = sum[r] == 0.0f ? 0.0f : 1.0f / sum[r];
        float* destination = out + ((u64)rr.rows[r] * heads + head) * D + 2 * t;
#pragma unroll
        for (int n = 0; n < D / 8; ++n)
            *(float2*)(destination + n * 8) = make_float2(acc[n][2 * r] * inverse, acc[n][2 * r + 1] * inverse);
    }
}

extern "C" __global__ void __launch_bounds__(MMA_THREADS)
attention_prefill_mma_d64(const float* q, const u16* k_cache, const u16* v_cache, const i32* step, float* out,
                          u32 heads, u32 kv_heads, float scale, u32 window) { pdl_start();
    prefill_mma<64>(q, k_cache, v_cache, step, out, heads, kv_heads, scale, window);
}

extern "C" __global__ void __launch_bounds__(MMA_THREADS)
attention_prefill_mma_d128(const float* q, const u16* k_cache, const u16* v_cache, const i32* step, float* out,
                           u32 heads, u32 kv_heads, float scale, u32 window) { pdl_start();
    prefill_mma<128>(q, k_cache, v_cache, step, out, heads, kv_heads, scale, window);
}

// ----- decode ----------------------------------------------------------------------------------
// grid (chunks, kv_heads * slices, rows), MMA_THREADS threads; heads_per_block <= 16. Partials
// as attention_decode_* writes them ([rows, heads, chunks] of (max, sum) and head_dim values).
// A row whose visible range lies in one chunk is written to `out` directly. Otherwise the last
// block of a (row, head group) to finish (counted in `counters[row][blockIdx.y]`, zero at rest:
// that block resets it) merges the group's chunks into `out` as attention_combine would, so no
// combine kernel follows.
template <int D>
__device__ __forceinline__ void decode_mma(const float* q, const u16* k_cache, const u16* v_cache, const i32* step,
                                           float* out, float* part_acc, float* part_stats, u32 heads,
                                           u32 kv_heads, float scale, u32 window, u32 chunk_len, u32 chunks,
                                           u32 heads_per_block, u32* counters) {
    constexpr int STRIDE = D + ROW_PAD;
    constexpr int LOADS = SUB_TILE * (D / 8) / 32;
    constexpr int WARP_HALVES = 2 * SUB_TILE * STRIDE;  // a warp's keys, then its values
    static_assert(MMA_WARPS * 16 * D * 4 <= MMA_WARPS * WARP_HALVES * 2, "the merge reuses the tiles");
    __shared__ __align__(16) u16 buffers[MMA_WARPS * WARP_HALVES];
    __shared__ float warp_max[MMA_WARPS][16], warp_sum[MMA_WARPS][16];

    const StepHeader* h = (const StepHeader*)step;
    const i32 row = blockIdx.z;
    const i32 span = mma_row_span(step, h, row);
    if (span < 0) return;
    const i32 position = step[h->positions + row];
    const i32 chunk = blockIdx.x;
    if ((u32)chunk >= chunks) return;
    const i32 lo = mma_first_visible(position, window);
    const i32 begin = max(lo, chunk * (i32)chunk_len);
    const i32 end = min(position + 1, (chunk + 1) * (i32)chunk_len);
    if (begin >= end) return;  // attention_combine skips the chunks outside [lo, position]
    const bool direct = lo / (i32)chunk_len == min(position / (i32)chunk_len, (i32)chunks - 1);

    const u32 group = heads / kv_heads;
    const u32 slices = (group + heads_per_block - 1) / heads_per_block;
    const u32 kv_head = blockIdx.y / slices;
    const u32 slice = blockIdx.y % slices;
    const u32 first_head = kv_head * group + slice * heads_per_block;
    const u32 n_heads = min(heads_per_block, group - slice * heads_per_block);
    const u64 kv_width = (u64)kv_heads * D;
    const u64 kv_offset = (u64)kv_head * D;
    const u32 lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;

    // The fragment's rows are the block's query heads (g and g + 8), zero past n_heads.
    u32 query[D / 16][4];
    const float* q_row = q + ((u64)row * heads + first_head) * D;
    load_queries<D>(query, g < n_heads ? q_row + g * D : nullptr, g + 8 < n_heads ? q_row + (g + 8) * D : nullptr);

    const float scale_log2 = scale * LOG2E;
    float running_max[2] = {NEG_INF, NEG_INF}, sum[2] = {0.0f, 0.0f};
    float acc[D / 8][4];
#pragma unroll
    for (int n = 0; n < D / 8; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;

    // Each warp walks its own sub-tiles: positions begin + 16 * (warp + 4 * i).
    const u32 keys_at = shared_address(buffers + warp * WARP_HALVES);
    const u32 values_at = keys_at + SUB_TILE * STRIDE * 2;
    i32 cells[LOADS];
    i32 sub = begin + (i32)warp * SUB_TILE;
    if (sub < end) {
        slot_cells<D, LOADS, 32>(cells, step, h, span, sub, end, lane);
        copy_rows<D, STRIDE, LOADS, 32>(keys_at, k_cache, cells, kv_width, kv_offset, lane);
        copy_async_commit();
        copy_rows<D, STRIDE, LOADS, 32>(values_at, v_cache, cells, kv_width, kv_offset, lane);
        copy_async_commit();
    }
    for (; sub < end; sub += MMA_WARPS * SUB_TILE) {
        const i32 next = sub + MMA_WARPS * SUB_TILE;
        copy_async_wait_one();  // this sub-tile's keys
        __syncwarp();
        float s[SUB_TILE / 8][4];
        flash_scores<D, STRIDE, SUB_TILE / 16>(s, query, keys_at);
        __syncwarp();
        if (next < end) {
            slot_cells<D, LOADS, 32>(cells, step, h, span, next, end, lane);
            copy_rows<D, STRIDE, LOADS, 32>(keys_at, k_cache, cells, kv_width, kv_offset, lane);
        }
        copy_async_commit();
#pragma unroll
        for (int n = 0; n < SUB_TILE / 8; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e)
                s[n][e] = sub + n * 8 + 2 * (i32)t + (e & 1) < end ? s[n][e] * scale_log2 : NEG_INF;
        u32 p[SUB_TILE / 16][4];
        flash_softmax_step<SUB_TILE / 8, D / 8>(s, running_max, sum, acc, p);
        copy_async_wait_one();  // this sub-tile's values
        __syncwarp();
        flash_accumulate<D, STRIDE, SUB_TILE / 16>(acc, p, values_at);
        __syncwarp();
        if (next < end) copy_rows<D, STRIDE, LOADS, 32>(values_at, v_cache, cells, kv_width, kv_offset, lane);
        copy_async_commit();
    }
    copy_async_wait_all();
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        sum[r] += __shfl_xor_sync(0xffffffffu, sum[r], 1);
        sum[r] += __shfl_xor_sync(0xffffffffu, sum[r], 2);
    }

    // Merge the warps: a common max per head, each warp's rescaled accumulator in shared memory.
    __syncthreads();  // every warp is done with its tiles
    if (t == 0) {
        warp_max[warp][g] = running_max[0];
        warp_max[warp][g + 8] = running_max[1];
        warp_sum[warp][g] = sum[0];
        warp_sum[warp][g + 8] = sum[1];
    }
    __syncthreads();
    float* merged = (float*)buffers;  // [MMA_WARPS][16][D]
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const u32 head_row = g + 8 * r;
        float block_max = NEG_INF;
#pragma unroll
        for (int w = 0; w < MMA_WARPS; ++w) block_max = fmaxf(block_max, warp_max[w][head_row]);
        const float factor = fast_exp2(running_max[r] - (block_max == NEG_INF ? 0.0f : block_max));
        float* destination = merged + (warp * 16 + head_row) * D + 2 * t;
#pragma unroll
        for (int n = 0; n < D / 8; ++n)
            *(float2*)(destination + n * 8) = make_float2(acc[n][2 * r] * factor, acc[n][2 * r + 1] * factor);
    }
    __syncthreads();
    for (u32 i = threadIdx.x; i < n_heads * D; i += MMA_THREADS) {
        const u32 head_row = i / D, d = i % D;
        float block_max = NEG_INF;
#pragma unroll
        for (int w = 0; w < MMA_WARPS; ++w) block_max = fmaxf(block_max, warp_max[w][head_row]);
        const float base = block_max == NEG_INF ? 0.0f : block_max;
        float total = 0.0f, value = 0.0f;
#pragma unroll
        for (int w = 0; w < MMA_WARPS; ++w) {
            total += warp_sum[w][head_row] * fast_exp2(warp_max[w][head_row] - base);
            value += merged[(w * 16 + head_row) * D + d];
        }
        const u64 row_head = (u64)row * heads + first_head + head_row;
        if (direct) {
            out[row_head * D + d] = total == 0.0f ? 0.0f : value / total;
        } else {
            const u64 part = row_head * chunks + chunk;
            part_acc[part * D + d] = value;
            if (d == 0) {
                part_stats[2 * part] = base * LN2;  // natural-log units, as attention_combine reads them
                part_stats[2 * part + 1] = total;
            }
        }
    }
    if (direct) return;
    // Publish this block's partials, then count it; the last block of the group merges.
    __threadfence();
    __syncthreads();
    __shared__ bool last_block;
    const u32 first_chunk = (u32)lo / chunk_len;
    const u32 last_chunk = min((u32)position / chunk_len, chunks - 1);
    if (threadIdx.x == 0) {
        u32* counter = counters + (u64)row * gridDim.y + blockIdx.y;
        const u32 done = atomicAdd(counter, 1u);
        last_block = done == last_chunk - first_chunk;
        if (last_block) *counter = 0u;  // every other block of the group has counted
    }
    __syncthreads();
    if (!last_block) return;
    __threadfence();
    // Each head's chunk weights exp(m_c - max) / sum_c(s_c exp(m_c - max)), then the values.
    __shared__ float weights[16][64];  // heads_per_block <= 16, chunks <= plan::MMA_MAX_CHUNKS
    const u32 n = last_chunk - first_chunk + 1;
    if (threadIdx.x < n_heads) {
        const u64 base = (((u64)row * heads + first_head + threadIdx.x) * chunks + first_chunk) * 2;
        float max_all = NEG_INF;
        for (u32 c = 0; c < n; ++c) max_all = fmaxf(max_all, __ldcg(part_stats + base + 2 * c));
        float sum_all = 0.0f;
        for (u32 c = 0; c < n; ++c)
            sum_all += __ldcg(part_stats + base + 2 * c + 1) * expf(__ldcg(part_stats + base + 2 * c) - max_all);
        const float inverse = sum_all == 0.0f ? 0.0f : 1.0f / sum_all;
        for (u32 c = 0; c < n; ++c) weights[threadIdx.x][c] = expf(__ldcg(part_stats + base + 2 * c) - max_all) * inverse;
    }
    __syncthreads();
    for (u32 i = threadIdx.x; i < n_heads * D; i += MMA_THREADS) {
        const u32 head_row = i / D, d = i % D;
        const u64 row_head = (u64)row * heads + first_head + head_row;
        const float* acc_c = part_acc + (row_head * chunks + first_chunk) * D + d;
        float value = 0.0f;
        for (u32 c = 0; c < n; ++c) value += __ldcg(acc_c + (u64)c * D) * weights[head_row][c];
        out[row_head * D + d] = value;
    }
}

extern "C" __global__ void __launch_bounds__(MMA_THREADS)
attention_decode_mma_d64(const float* q, const u16* k_cache, const u16* v_cache, const i32* step, float* out,
                         float* part_acc, float* part_stats, u32 heads, u32 kv_heads, float scale, u32 window,
                         u32 chunk_len, u32 chunks, u32 heads_per_block, u32* counters) { pdl_start();
    decode_mma<64>(q, k_cache, v_cache, step, out, part_acc, part_stats, heads, kv_heads, scale, window, chunk_len,
                   chunks, heads_per_block, counters);
}

extern "C" __global__ void __launch_bounds__(MMA_THREADS)
attention_decode_mma_d128(const float* q, const u16* k_cache, const u16* v_cache, const i32* step, float* out,
                          float* part_acc, float* part_stats, u32 heads, u32 kv_heads, float scale, u32 window,
                          u32 chunk_len, u32 chunks, u32 heads_per_block, u32* counters) { pdl_start();
    decode_mma<128>(q, k_cache, v_cache, step, out, part_acc, part_stats, heads, kv_heads, scale, window, chunk_len,
                    chunks, heads_per_block, counters);
}
