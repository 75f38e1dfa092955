// TurboQuant KV caches (runit_backend::turbo holds the layout; the CPU's attention is
// backend-cpu/src/turbo/): the row writer and the attention on the codes.
//
// Every float operation repeats the CPU's scalar twins in their order, so that the bytes
// written and the attention's outputs equal the CPU's: sums of squares one value at a time,
// Walsh-Hadamard butterflies of growing span, scores in sixteen lanes (lane l taking
// coordinates l, l + 16, l + 32, l + 48 of each block) reduced by halves, Cephes' exp, the
// values' multiply-adds key after key, chunks of TQ_KEY_CHUNK keys merged in chunk order.
// Multiply-adds are written as fmaf and this module is compiled with --fmad=false, so no
// other multiply and add are fused. The layout: kernels/turbo.cuh.
#include "turbo.cuh"
#include "rope.cuh"

// Keys of one chunk (backend-cpu's KEY_CHUNK) and query heads of one chunk block (MAX_HEADS).
#define TQ_KEY_CHUNK 512
#define TQ_HEADS 4
#define TQ_MAX_HEAD_DIM 256
// Threads of the merge and of a chunk block of many rows (attention_turbo_chunk_rows); a
// chunk block of few rows (attention_turbo_chunk) has 16 warps: with 4, the one sequence of a
// decode at depth 16384 left the SMs latency-bound at 8 warps each (680 us a layer on an H100,
// session 35).
#define TQ_THREADS 128
#define TQ_FEW_ROWS_THREADS 512

// In-place unnormalized Walsh-Hadamard transform of 64 values in shared memory by one warp
// (turbo::hadamard: butterflies of span 1, 2, 4, ...; each lane one butterfly a span).
__device__ __forceinline__ void tq_hadamard(float* x, u32 lane) {
#pragma unroll
    for (u32 span = 1; span < TQ_BLOCK; span *= 2) {
        const u32 i = (lane / span) * 2 * span + lane % span;
        const float a = x[i], b = x[i + span];
        x[i] = __fadd_rn(a, b);
        x[i + span] = __fsub_rn(a, b);
        __syncwarp();
    }
}

__device__ __forceinline__ void tq_apply_signs(float* x, u64 signs, u32 lane) {
    for (u32 i = lane; i < TQ_BLOCK; i += 32)
        if (signs >> i & 1) x[i] = -x[i];
    __syncwarp();
}

// R x = H D x / 8 (turbo::rotate).
__device__ __forceinline__ void tq_rotate(float* x, u32 block, u32 lane) {
    tq_apply_signs(x, tq_signs(block, 0), lane);
    tq_hadamard(x, lane);
    for (u32 i = lane; i < TQ_BLOCK; i += 32) x[i] = __fmul_rn(x[i], 0.125f);
    __syncwarp();
}

// R^T y = D H y / 8 (turbo::rotate_back).
__device__ __forceinline__ void tq_rotate_back(float* y, u32 block, u32 lane) {
    tq_hadamard(y, lane);
    for (u32 i = lane; i < TQ_BLOCK; i += 32) y[i] = __fmul_rn(y[i], 0.125f);
    __syncwarp();
    tq_apply_signs(y, tq_signs(block, 0), lane);
}

// S y = H D' y (turbo::sketch).
__device__ __forceinline__ void tq_sketch(float* y, u32 block, u32 lane) {
    tq_apply_signs(y, tq_signs(block, 1), lane);
    tq_hadamard(y, lane);
}

__device__ __forceinline__ void tq_store_f16(u8* p, u16 h) {
    p[0] = (u8)(h & 0xff);
    p[1] = (u8)(h >> 8);
}

// exp(x) for x <= 0 as backend-cpu's turbo::exp: 0 below -87, else 2^n e^r with Cephes'
// polynomial.
__device__ __forceinline__ float tq_exp(float x) {
    if (isnan(x) || x < -87.0f) return 0.0f;
    const float n = rintf(__fmul_rn(x, 1.44269504088896340736f));
    float r = fmaf(n, -0.693359375f, x);
    r = fmaf(n, 2.12194440e-4f, r);
    float p = 1.9875691e-4f;
    p = fmaf(p, r, 1.3982e-3f);
    p = fmaf(p, r, 8.333452e-3f);
    p = fmaf(p, r, 4.1665796e-2f);
    p = fmaf(p, r, 1.6666665e-1f);
    p = fmaf(p, r, 0.5f);
    const float y = __fadd_rn(fmaf(p, __fmul_rn(r, r), r), 1.0f);
    return __fmul_rn(y, __int_as_float(((int)n + 127) << 23));
}

// ---------------------------------------------------------------------------------------
// The row writer (turbo::encode_row of `src - mean`): one block per batch row, one warp per
// block of 64 values at a time. Shared memory: per warp 64 floats and 64 code bytes, then
// two index bytes per block of the row.
//
// Encodes the row at `src_row` (`width` values) into cell `cell` of `cache`. All threads of
// the block call it.
__device__ void turbo_encode_row(u8* cache, const float* src_row, i64 cell, const float* tables, const float* mean,
                                 u32 width, u32 bits, u32 sketch) {
    extern __shared__ float shared[];
    const TqLayout layout = {bits, sketch};
    const u32 blocks = width / TQ_BLOCK;
    const u32 warps = blockDim.x / 32, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    float* y = shared + warp * TQ_BLOCK;
    u8* codes = (u8*)(shared + warps * TQ_BLOCK) + warp * TQ_BLOCK;
    u8* kept = (u8*)(shared + warps * TQ_BLOCK) + warps * TQ_BLOCK;
    u8* out_row = cache + (u64)cell * layout.row_bytes(blocks);
    const float* centroids = layout.centroids(tables);
    const float* thresholds = tables + (bits == 4 ? TQ_THRESHOLDS4 : TQ_THRESHOLDS3);
    const u32 levels = 1u << bits;

    for (u32 b = warp; b < blocks; b += warps) {
        const float* in = src_row + b * TQ_BLOCK;
        for (u32 i = lane; i < TQ_BLOCK; i += 32)
            y[i] = mean ? __fsub_rn(in[i], mean[b * TQ_BLOCK + i]) : in[i];
        __syncwarp();
        u8* out = out_row + (u64)b * layout.block_bytes();
        // The outliers: the largest magnitude left (the first on ties; NaN never), as f16.
        for (u32 k = 0; k < TQ_OUTLIERS; ++k) {
            float best = -1.0f;
            u32 index = 0;
            for (u32 i = lane; i < TQ_BLOCK; i += 32) {
                const float a = fabsf(y[i]);
                if (a > best) {
                    best = a;
                    index = i;
                }
            }
#pragma unroll
            for (u32 offset = 16; offset > 0; offset >>= 1) {
                const float other = __shfl_xor_sync(0xffffffffu, best, offset);
                const u32 other_index = __shfl_xor_sync(0xffffffffu, index, offset);
                if (other > best || (other == best && other_index < index)) {
                    best = other;
                    index = other_index;
                }
            }
            if (lane == 0) {
                const u16 value = float_to_half(y[index]);
                y[index] = __fsub_rn(y[index], half_to_float(value));
                tq_store_f16(out + layout.header() + 2 * k, value);
                kept[b * TQ_OUTLIERS + k] = (u8)index;
            }
            __syncwarp();
        }
        // The norm of what is left, summed one value at a time.
        float norm = 0.0f;
        if (lane == 0) {
            float sum = 0.0f;
            for (u32 i = 0; i < TQ_BLOCK; ++i) sum = __fadd_rn(sum, __fmul_rn(y[i], y[i]));
            norm = __fsqrt_rn(sum);
            tq_store_f16(out, float_to_half(norm));
        }
        norm = __shfl_sync(0xffffffffu, norm, 0);
        tq_rotate(y, b, lane);
        const float inverse = norm > 0.0f ? __fdiv_rn(1.0f, norm) : 0.0f;
        for (u32 i = lane; i < TQ_BLOCK; i += 32) {
            const float v = __fmul_rn(y[i], inverse);
            u32 code = 0;
            for (u32 t = 0; t + 1 < levels; ++t) code += v > thresholds[t];
            y[i] = v;
            codes[i] = (u8)code;
        }
        __syncwarp();
        // Eight codes a lane: one little-endian word of `bits` bytes.
        if (lane < TQ_BLOCK / 8) {
            u32 word = 0;
            for (u32 k = 0; k < 8; ++k) word |= (u32)codes[lane * 8 + k] << (k * bits);
            for (u32 byte = 0; byte < bits; ++byte)
                out[layout.code_offset() + lane * bits + byte] = (u8)(word >> (8 * byte));
        }
        if (sketch) {
            for (u32 i = lane; i < TQ_BLOCK; i += 32) y[i] = __fsub_rn(y[i], centroids[codes[i]]);
            __syncwarp();
            if (lane == 0) {
                float sum = 0.0f;
                for (u32 i = 0; i < TQ_BLOCK; ++i) sum = __fadd_rn(sum, __fmul_rn(y[i], y[i]));
                tq_store_f16(out + 2, float_to_half(__fsqrt_rn(sum)));
            }
            __syncwarp();
            tq_sketch(y, b, lane);
            const u32 low = __ballot_sync(0xffffffffu, y[lane] < 0.0f);
            const u32 high = __ballot_sync(0xffffffffu, y[lane + 32] < 0.0f);
            const u64 signs = (u64)low | (u64)high << 32;
            if (lane < 8) out[layout.sign_offset() + lane] = (u8)(signs >> (8 * lane));
        }
        __syncwarp();
    }
    __syncthreads();
    // The indices, 6 bits each after the blocks (bits past the last index stay zero).
    u8* indices = out_row + (u64)blocks * layout.block_bytes();
    const u32 slots = blocks * TQ_OUTLIERS;
    for (u32 j = threadIdx.x; j < layout.index_bytes(blocks); j += blockDim.x) {
        u32 byte = 0;
        for (u32 bit = 0; bit < 8; ++bit) {
            const u32 at = 8 * j + bit, slot = at / TQ_INDEX_BITS;
            if (slot < slots) byte |= ((u32)kept[slot] >> (at % TQ_INDEX_BITS) & 1) << bit;
        }
        indices[j] = (u8)byte;
    }
}

// Launch: grid.x = rows, blockDim.x = 32 * warps; dynamic shared memory
// warps * (64 * 4 + 64) + blocks * 2 bytes.
extern "C" __global__ void kv_write_turbo(u8* cache, const float* src, const i32* step, const float* tables,
                                          const float* mean, u32 width, u32 rows, u64 n_cells, u32 bits,
                                          u32 sketch) {
    pdl_start();
    const i32 row = blockIdx.x;
    const i64 cell = row_cell(step, row, rows, n_cells);
    if (cell < 0) return;
    turbo_encode_row(cache, src + (u64)row * width, cell, tables, mean, width, bits, sketch);
}

// RoPE of q and k, then k and v written into their TurboQuant caches, in one launch: exactly
// rope_f32 (rope.cu, no YaRN) of q and of k followed by kv_write_turbo of each (the per-element
// arithmetic is theirs). grid.x = max(tokens, kv_rows), grid.y = q_heads + 2: blocks y <
// q_heads rotate that head of row x of q ([tokens, q_heads, head_dim]); block q_heads rotates
// every head of row x of k ([tokens, width]) in place, then encodes it into k_cache; block
// q_heads + 1 encodes row x of v into v_cache. Rows past `tokens` are not rotated, rows past
// `kv_rows` not written. blockDim.x and dynamic shared memory as kv_write_turbo's for the
// caches' width. The parameters up to v_cells are rope_kv_write_f16/32's (fused.cu).
extern "C" __global__ void rope_kv_write_turbo(float* q, float* k, const float* v, u8* k_cache, u8* v_cache,
                                               const i32* step, const float* factors, u32 has_factors, u32 q_heads,
                                               u32 k_heads, u32 head_dim, u32 rotary_dim, float theta_scale,
                                               float freq_scale, u32 neox, u32 tokens, u32 width, u32 kv_rows,
                                               u64 k_cells, u64 v_cells, const float* tables, const float* k_mean,
                                               const float* v_mean, u32 k_bits, u32 k_sketch, u32 v_bits,
                                               u32 v_sketch) {
    pdl_start();
    if (rope_qk_rows(q, k, step, factors, has_factors, q_heads, k_heads, head_dim, rotary_dim, theta_scale, freq_scale,
                     neox, tokens, width))
        return;
    const u32 token = blockIdx.x;
    const bool key = blockIdx.y == q_heads;
    const i64 cell = row_cell(step, (i32)token, kv_rows, key ? k_cells : v_cells);
    if (cell < 0) return;
    turbo_encode_row(key ? k_cache : v_cache, (key ? k : v) + (u64)token * width, cell, tables, key ? k_mean : v_mean,
                     width, key ? k_bits : v_bits, key ? k_sketch : v_sketch);
}

// ---------------------------------------------------------------------------------------
// Attention on the codes, as backend-cpu's turbo::attention: the visible keys of a query are
// cut into chunks of TQ_KEY_CHUNK positions from the first visible one; attention_turbo_chunk
// computes one chunk's partial (max, weights' sum, rotated value accumulator, unrotated
// outlier accumulator) for up to TQ_HEADS query heads of a KV head; attention_turbo_merge
// merges a row's partials in chunk order, rotates the accumulator back and divides.
//
// The span owning `row`, or -1 when no span's rows include it.
__device__ __forceinline__ i32 tq_span(const i32* step, const StepHeader* h, i32 row) {
    if (row < 0 || row >= h->tokens) return -1;
    const i32 span = step[h->row_span + row];
    if (span < 0 || span >= h->spans) return -1;
    const i32* info = step + h->span_info + span * 4;
    return row >= info[0] && row < info[0] + info[1] ? span : -1;
}

__device__ __forceinline__ i32 tq_first_visible(i32 position, u32 window) {
    return window == 0 ? 0 : max(0, position + 1 - (i32)window);
}

// Sum of sixteen lanes of a half-warp by halves (backend-cpu's turbo::reduce): lane 0 of
// the half gets ((l0 + l8) + (l4 + l12)) + ... in the twins' order.
__device__ __forceinline__ float tq_reduce16(float v, u32 mask) {
#pragma unroll
    for (u32 offset = 8; offset > 0; offset >>= 1) v = __fadd_rn(v, __shfl_xor_sync(mask, v, offset, 16));
    return v;
}

// Copies the head's slice of the rows of keys cells[0 .. m) into `staged`, slice.stride()
// bytes a key, TQ_STAGE_LOADS byte loads of each thread in flight at once (the loops over
// keys then read shared memory: reading the cache there left each load's latency in series,
// about 25 ms a decode step at depth 4096, session 35).
#define TQ_STAGE_BYTES 16384
#define TQ_STAGE_LOADS 32
template <u32 THREADS>
__device__ __forceinline__ void tq_stage(u8* staged, const u8* cache, const i32* cells, u32 m, const TqSlice& slice) {
    const u32 stride = slice.stride(), total = m * stride;
    for (u32 base = 0; base < total; base += THREADS * TQ_STAGE_LOADS) {
        u8 bytes[TQ_STAGE_LOADS];
#pragma unroll
        for (u32 r = 0; r < TQ_STAGE_LOADS; ++r) {
            const u32 i = base + threadIdx.x + THREADS * r;
            if (i < total) {
                const u32 k = i / stride, b = i % stride;
                const u64 at = b < slice.block_span ? slice.block_offset + b : slice.index_offset + (b - slice.block_span);
                bytes[r] = cache[(u64)cells[k] * slice.row_bytes + at];
            }
        }
#pragma unroll
        for (u32 r = 0; r < TQ_STAGE_LOADS; ++r) {
            const u32 i = base + threadIdx.x + THREADS * r;
            if (i < total) staged[i] = bytes[r];
        }
    }
}

// Launch: grid (chunks, kv_heads * slices, rows), THREADS threads (attention_turbo_chunk:
// TQ_FEW_ROWS_THREADS, attention_turbo_chunk_rows: TQ_THREADS); a slice is TQ_HEADS query heads
// of a KV head. partials: [rows, heads, chunks][2 + 2 * head_dim] for rows
// first_row ...
template <u32 THREADS>
__device__ __forceinline__ void turbo_chunk(const float* q, const u8* k_cache, const u8* v_cache, const i32* step,
                                            const float* tables, float* partials, u32 heads, u32 kv_heads,
                                            u32 head_dim, float scale, u32 window, u32 chunks, u32 first_row,
                                            u32 k_bits, u32 k_sketch, u32 v_bits) {
    __shared__ float plain[TQ_HEADS][TQ_MAX_HEAD_DIM];
    __shared__ float rotated[TQ_HEADS][TQ_MAX_HEAD_DIM];
    __shared__ float sketched[TQ_HEADS][TQ_MAX_HEAD_DIM];
    __shared__ float outliers[TQ_HEADS][TQ_MAX_HEAD_DIM];
    __shared__ float scores[TQ_HEADS][TQ_KEY_CHUNK];
    __shared__ i32 cells[TQ_KEY_CHUNK];
    __shared__ float k_table[16], v_table[16];
    __shared__ float stats[TQ_HEADS][2];
    __shared__ __align__(16) u8 staged[TQ_STAGE_BYTES];

    const StepHeader* h = (const StepHeader*)step;
    const i32 row = (i32)(first_row + blockIdx.z);
    const i32 span = tq_span(step, h, row);
    if (span < 0) return;
    const i32 position = step[h->positions + row];
    const i32 lo = tq_first_visible(position, window);
    const i32 chunk = blockIdx.x;
    const i32 start = lo + chunk * TQ_KEY_CHUNK;
    if (start > position) return;  // the merge reads only the row's chunks
    const i32 n = min(TQ_KEY_CHUNK, position + 1 - start);

    const u32 group = heads / kv_heads;
    const u32 slices = (group + TQ_HEADS - 1) / TQ_HEADS;
    const u32 kv_head = blockIdx.y / slices;
    const u32 first = (blockIdx.y % slices) * TQ_HEADS;
    const u32 n_heads = min(TQ_HEADS, group - first);
    const u32 first_head = kv_head * group + first;
    const u32 head_blocks = head_dim / TQ_BLOCK;
    const u32 first_block = kv_head * head_blocks;
    const u32 row_blocks = kv_heads * head_blocks;
    const TqLayout k_layout = {k_bits, k_sketch}, v_layout = {v_bits, 0};
    const TqSlice k_slice = tq_slice(k_layout, row_blocks, first_block, head_blocks);
    const TqSlice v_slice = tq_slice(v_layout, row_blocks, first_block, head_blocks);
    const u32 kbb = k_layout.block_bytes(), vbb = v_layout.block_bytes();
    const u32 tid = threadIdx.x, lane = tid % 32, warp = tid / 32;

    if (tid < 16) {
        k_table[tid] = k_layout.centroids(tables)[tid % (1u << k_bits)];
        v_table[tid] = v_layout.centroids(tables)[tid % (1u << v_bits)];
    }
    for (u32 i = tid; i < n_heads * head_dim; i += THREADS) {
        const u32 g = i / head_dim, d = i % head_dim;
        const float value = q[((u64)row * heads + first_head + g) * head_dim + d];
        plain[g][d] = value;
        rotated[g][d] = value;
        outliers[g][d] = 0.0f;
    }
    for (i32 k = tid; k < n; k += THREADS) cells[k] = step_cell(step, h, span, start + k);
    __syncthreads();
    // R q and S R q, block by block (turbo::Queries).
    for (u32 unit = warp; unit < n_heads * head_blocks; unit += THREADS / 32) {
        const u32 g = unit / head_blocks, b = unit % head_blocks;
        float* r = &rotated[g][b * TQ_BLOCK];
        tq_rotate(r, first_block + b, lane);
        if (k_sketch) {
            float* s = &sketched[g][b * TQ_BLOCK];
            for (u32 i = lane; i < TQ_BLOCK; i += 32) s[i] = r[i];
            __syncwarp();
            tq_sketch(s, first_block + b, lane);
        }
    }
    __syncthreads();

    // Scores: a half-warp per (key, head), sixteen lanes as the twins', over the keys staged
    // in shared memory a part of the chunk at a time.
    const float sketch_factor = tables[TQ_SKETCH_FACTOR];
    const u32 l = tid % 16, half = tid / 16;
    const u32 mask = 0xffffu << (16 * (lane / 16));
    const u32 k_part = TQ_STAGE_BYTES / k_slice.stride();
    for (u32 from = 0; from < (u32)n; from += k_part) {
        const u32 m = min(k_part, (u32)n - from);
        tq_stage<THREADS>(staged, k_cache, cells + from, m, k_slice);
        __syncthreads();
        for (u32 p = half; p < m * n_heads; p += THREADS / 16) {
            const u32 k = p / n_heads, g = p % n_heads;
            const u8* key = staged + k * k_slice.stride();
            float acc = 0.0f;
            for (u32 b = 0; b < head_blocks; ++b) {
                const u8* block = key + b * kbb;
                const float norm = tq_f16(block);
                const u8* codes = block + k_layout.code_offset();
#pragma unroll
                for (u32 j = 0; j < 4; ++j) {
                    const u32 i = l + 16 * j;
                    const float c = __fmul_rn(k_table[tq_code(codes, i, k_bits)], norm);
                    acc = fmaf(rotated[g][b * TQ_BLOCK + i], c, acc);
                }
                if (k_sketch) {
                    const float alpha = __fmul_rn(__fmul_rn(sketch_factor, tq_f16(block + 2)), norm);
                    const u8* sign_bytes = block + k_layout.sign_offset();
#pragma unroll
                    for (u32 j = 0; j < 4; ++j) {
                        const u32 i = l + 16 * j;
                        const float s = sign_bytes[i >> 3] >> (i & 7) & 1 ? -alpha : alpha;
                        acc = fmaf(sketched[g][b * TQ_BLOCK + i], s, acc);
                    }
                }
            }
            float dot = tq_reduce16(acc, mask);
            if (l == 0) {
                const u8* indices = key + k_slice.block_span;
                for (u32 b = 0; b < head_blocks; ++b) {
                    const u8* block = key + b * kbb;
                    for (u32 o = 0; o < TQ_OUTLIERS; ++o) {
                        const u32 index = tq_index_at(indices, k_slice.index_bit + (b * TQ_OUTLIERS + o) * TQ_INDEX_BITS);
                        dot = fmaf(plain[g][b * TQ_BLOCK + index], tq_f16(block + k_layout.header() + 2 * o), dot);
                    }
                }
                scores[g][from + k] = __fmul_rn(dot, scale);
            }
        }
        __syncthreads();
    }

    // Softmax weights exp(score - max) in place, a half-warp per head, the sum in sixteen
    // lanes (key k in lane k % 16, in key order).
    if (half < n_heads) {
        const u32 g = half;
        float max = -__int_as_float(0x7f800000);
        for (i32 k = l; k < n; k += 16) max = fmaxf(max, scores[g][k]);
#pragma unroll
        for (u32 offset = 8; offset > 0; offset >>= 1) max = fmaxf(max, __shfl_xor_sync(mask, max, offset, 16));
        float sum = 0.0f;
        for (i32 k = l; k < n; k += 16) {
            const float weight = tq_exp(__fsub_rn(scores[g][k], max));
            scores[g][k] = weight;
            sum = __fadd_rn(sum, weight);
        }
        sum = tq_reduce16(sum, mask);
        if (l == 0) {
            stats[g][0] = max;
            stats[g][1] = sum;
        }
    }
    __syncthreads();

    // Values, key after key: each thread its (head, coordinate) pairs tid, tid +
    // THREADS, ... (rotated basis), and threads below n_heads * head_blocks also one
    // (head, block)'s outliers (unrotated).
    constexpr u32 PAIRS = TQ_HEADS * TQ_MAX_HEAD_DIM / THREADS;
    float acc[PAIRS];
#pragma unroll
    for (u32 j = 0; j < PAIRS; ++j) acc[j] = 0.0f;
    const u32 outlier_g = tid / head_blocks, outlier_b = tid % head_blocks;
    const bool outlier_thread = tid < n_heads * head_blocks;
    const u32 v_part = TQ_STAGE_BYTES / v_slice.stride();
    for (u32 from = 0; from < (u32)n; from += v_part) {
        const u32 m = min(v_part, (u32)n - from);
        tq_stage<THREADS>(staged, v_cache, cells + from, m, v_slice);
        __syncthreads();
        for (u32 k = 0; k < m; ++k) {
            const u8* value_row = staged + k * v_slice.stride();
#pragma unroll
            for (u32 j = 0; j < PAIRS; ++j) {
                const u32 pair = tid + THREADS * j, g = pair / head_dim, d = pair % head_dim;
                if (g < n_heads) {
                    const u8* block = value_row + (d / TQ_BLOCK) * vbb;
                    const float c = __fmul_rn(v_table[tq_code(block + v_layout.code_offset(), d % TQ_BLOCK, v_bits)],
                                              tq_f16(block));
                    acc[j] = fmaf(c, scores[g][from + k], acc[j]);
                }
            }
            if (outlier_thread) {
                const u8* block = value_row + outlier_b * vbb;
                const u8* indices = value_row + v_slice.block_span;
                const float weight = scores[outlier_g][from + k];
                for (u32 o = 0; o < TQ_OUTLIERS; ++o) {
                    const u32 index =
                        tq_index_at(indices, v_slice.index_bit + (outlier_b * TQ_OUTLIERS + o) * TQ_INDEX_BITS);
                    float* slot = &outliers[outlier_g][outlier_b * TQ_BLOCK + index];
                    *slot = fmaf(tq_f16(block + v_layout.header() + 2 * o), weight, *slot);
                }
            }
        }
        __syncthreads();
    }
    const u32 per_head = 2 + 2 * head_dim;
    float* out = partials + ((u64)blockIdx.z * heads + first_head) * chunks * per_head + chunk * per_head;
    const u64 head_stride = (u64)chunks * per_head;  // from head g to g + 1 of the row
    if (tid < n_heads) {
        out[tid * head_stride] = stats[tid][0];
        out[tid * head_stride + 1] = stats[tid][1];
    }
#pragma unroll
    for (u32 j = 0; j < PAIRS; ++j) {
        const u32 pair = tid + THREADS * j, g = pair / head_dim, d = pair % head_dim;
        if (g < n_heads) {
            out[g * head_stride + 2 + d] = acc[j];
            out[g * head_stride + 2 + head_dim + d] = outliers[g][d];
        }
    }
}

#define TURBO_CHUNK(name, threads)                                                                               \
    extern "C" __global__ void __launch_bounds__(threads)                                                        \
        name(const float* q, const u8* k_cache, const u8* v_cache, const i32* step, const float* tables,         \
             float* partials, u32 heads, u32 kv_heads, u32 head_dim, float scale, u32 window, u32 chunks,        \
             u32 first_row, u32 k_bits, u32 k_sketch, u32 v_bits) {                                              \
        pdl_start();                                                                                             \
        turbo_chunk<threads>(q, k_cache, v_cache, step, tables, partials, heads, kv_heads, head_dim, scale,      \
                             window, chunks, first_row, k_bits, k_sketch, v_bits);                               \
    }
TURBO_CHUNK(attention_turbo_chunk, TQ_FEW_ROWS_THREADS)
TURBO_CHUNK(attention_turbo_chunk_rows, TQ_THREADS)

// Launch: grid (heads, rows), TQ_THREADS threads. Merges the partials of row first_row +
// blockIdx.y, head blockIdx.x, in chunk order into out ([tokens, heads, head_dim]).
extern "C" __global__ void __launch_bounds__(TQ_THREADS)
    attention_turbo_merge(float* out, const float* partials, const i32* step, u32 heads, u32 kv_heads,
                          u32 head_dim, u32 window, u32 chunks, u32 first_row) {
    pdl_start();
    __shared__ float merged[TQ_MAX_HEAD_DIM];
    const StepHeader* h = (const StepHeader*)step;
    const i32 row = (i32)(first_row + blockIdx.y);
    if (tq_span(step, h, row) < 0) return;
    const i32 position = step[h->positions + row];
    const u32 count = (u32)(position + 1 - tq_first_visible(position, window) + TQ_KEY_CHUNK - 1) / TQ_KEY_CHUNK;
    const u32 head = blockIdx.x;
    const u32 per_head = 2 + 2 * head_dim;
    const float* part = partials + ((u64)blockIdx.y * heads + head) * chunks * per_head;
    float max = -__int_as_float(0x7f800000);
    for (u32 c = 0; c < count; ++c) max = fmaxf(max, part[c * per_head]);
    const u32 tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
    float sum = 0.0f;
    float acc[TQ_MAX_HEAD_DIM / TQ_THREADS], outlier[TQ_MAX_HEAD_DIM / TQ_THREADS];
#pragma unroll
    for (u32 j = 0; j < TQ_MAX_HEAD_DIM / TQ_THREADS; ++j) acc[j] = outlier[j] = 0.0f;
    for (u32 c = 0; c < count; ++c) {
        const float* p = part + c * per_head;
        const float factor = tq_exp(__fsub_rn(p[0], max));
        sum = fmaf(p[1], factor, sum);
#pragma unroll
        for (u32 j = 0; j < TQ_MAX_HEAD_DIM / TQ_THREADS; ++j) {
            const u32 d = tid + TQ_THREADS * j;
            if (d < head_dim) {
                acc[j] = fmaf(p[2 + d], factor, acc[j]);
                outlier[j] = fmaf(p[2 + head_dim + d], factor, outlier[j]);
            }
        }
    }
#pragma unroll
    for (u32 j = 0; j < TQ_MAX_HEAD_DIM / TQ_THREADS; ++j) {
        const u32 d = tid + TQ_THREADS * j;
        if (d < head_dim) merged[d] = acc[j];
    }
    __syncthreads();
    const u32 head_blocks = head_dim / TQ_BLOCK;
    const u32 first_block = head / (heads / kv_heads) * head_blocks;
    for (u32 b = warp; b < head_blocks; b += TQ_THREADS / 32) tq_rotate_back(&merged[b * TQ_BLOCK], first_block + b, lane);
    __syncthreads();
    const float inverse = sum == 0.0f ? 0.0f : __fdiv_rn(1.0f, sum);
#pragma unroll
    for (u32 j = 0; j < TQ_MAX_HEAD_DIM / TQ_THREADS; ++j) {
        const u32 d = tid + TQ_THREADS * j;
        if (d < head_dim) out[((u64)row * heads + head) * head_dim + d] = __fmul_rn(__fadd_rn(merged[d], outlier[j]), inverse);
    }
}
