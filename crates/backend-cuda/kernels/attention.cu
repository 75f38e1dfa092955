// Causal grouped-query attention over the paged KV cache (see Backend::attention):
// q, out: [tokens, heads, head_dim] f32; K/V caches: [cells, kv_heads * head_dim] f16 or f32,
// or ggml's Q8_0 / Q4_0 blocks of 32 (rows rotated in chunks, kv.cu), or TurboQuant's blocks
// (outside exact numerics; `TurboKv`).
// A query at position p sees keys at positions lo ..= p of its own span, lo = 0 or, with a
// sliding window w, max(0, p + 1 - w). Scores are scale * (q · k), the softmax is in f32.
// Positions, spans and block tables come from the step buffer (StepHeader), so launch shapes
// depend only on the row and span counts and the table stride.
//
// Two paths:
// - decode (few rows per span): flash-decoding. attention_decode_* computes, per (row, kv
//   head, slice of that kv head's query heads, chunk of chunk_len positions), the chunk's
//   running max, sum and unnormalised V accumulator; attention_combine merges the chunks.
//   The grid covers the table's capacity, chunks outside a row's visible range exit at once.
// - prefill (many rows per span): attention_prefill_*, one block per (tile of query rows of
//   one span, head), one warp per query row, K/V tiles in shared memory, online softmax;
//   key tiles past the tile's last position are never visited.
#include "common.cuh"
#include "turbo.cuh"
#include "flash_mma.cuh"

#define MAX_HEAD_DIM 256
#define LANE_DIMS (MAX_HEAD_DIM / 32)
#define DECODE_THREADS 128
#define DECODE_WARPS (DECODE_THREADS / 32)
#define THREAD_DIMS (MAX_HEAD_DIM / DECODE_THREADS)
#define DECODE_TILE 32
#define MAX_HEADS_PER_BLOCK 8
#define MAX_CHUNKS 512
#define TQ_TILE 64  // keys of a TurboQuant decode tile (plan::TURBO_MIN_CHUNK)

__device__ __forceinline__ float kv_value(const u16* cache, u64 index) { return half_to_float(cache[index]); }
__device__ __forceinline__ float kv_value(const float* cache, u64 index) { return cache[index]; }

// Cache views for the attention kernels: the row of one cell's kv head; for the decode
// kernels a tile of DECODE_TILE keys' rows (`Tile`, in shared memory) that `stage` fills
// before the tile is read through `tile_at`; for the prefill kernels `fill`, which writes a
// tile of rows as floats. Plain caches read their rows in place (an empty tile);
// caches of blocks copy the tile's blocks first, every load of the block in flight at once,
// as codes and scales (reading them element by element in the loops over keys left each
// load's latency in series: 135 us a layer at depth 4096 on an H100, session 35).
struct NoTile {};
template <typename T>
struct PlainKv {
    using Tile = NoTile;
    // decode_chunk's scores take a warp per key, lanes over the head dimension.
    static constexpr bool LANE_SCORES = false;
    const T* base;
    u64 width;  // elements of a cell (kv_heads * head_dim)
    __device__ __forceinline__ const T* row(i32 cell, u64 kv_offset) const {
        return base + (u64)cell * width + kv_offset;
    }
    __device__ __forceinline__ void stage(Tile&, const i32*, i32, u64, u32) const {}
    __device__ __forceinline__ float tile_at(const Tile&, const i32* cells, i32 j, u64 kv_offset, u32 d) const {
        return kv_value(row(cells[j], kv_offset), d);
    }
    // Rows of keys cells[0 .. n) into dst (`stride` floats a key), the block's threads over
    // the elements.
    __device__ __forceinline__ void fill(float* dst, u32 stride, const i32* cells, i32 n, u64 kv_offset,
                                         u32 head_dim) const {
        for (u32 i = threadIdx.x; i < (u32)n * head_dim; i += blockDim.x) {
            const u32 j = i / head_dim, d = i % head_dim;
            dst[j * stride + d] = kv_value(row(cells[j], kv_offset), d);
        }
    }
};
// A tile of blocks of 32: element d of key j is code d (byte d % 4 of words[j][d / 4], as i8)
// times scales[j][d / 32]. Rows have one word of padding, so that lanes reading one word
// of different keys (decode_chunk's scores over a tile of blocks) hit different banks.
struct BlockTile {
    u32 words[DECODE_TILE][MAX_HEAD_DIM / 4 + 1];
    float scales[DECODE_TILE][MAX_HEAD_DIM / 32];
};
template <bool Q8>
struct BlockKv {
    using Tile = BlockTile;
    // decode_chunk's scores take a lane per key (`lane_scores`).
    static constexpr bool LANE_SCORES = true;
    const u8* base;
    u64 row_bytes;  // bytes of a cell
    static constexpr u32 BLOCK_BYTES = Q8 ? 34 : 18;
    __device__ __forceinline__ const u8* row(i32 cell, u64 kv_offset) const {
        return base + (u64)cell * row_bytes + kv_offset / 32 * BLOCK_BYTES;
    }
    // Block b of key cells[j]: its scale, and its 32 codes packed four to a word (as i8). The
    // block's 2-byte words (cells are 2-byte aligned) are all loaded before any is unpacked.
    __device__ __forceinline__ float load_block(const i32* cells, u32 j, u32 b, u64 kv_offset, u32 codes[8]) const {
        const u16* words = (const u16*)(row(cells[j], kv_offset) + b * BLOCK_BYTES);
        constexpr u32 WORDS = BLOCK_BYTES / 2;
        u16 w[WORDS];
#pragma unroll
        for (u32 i = 0; i < WORDS; ++i) w[i] = words[i];
        if (Q8) {
#pragma unroll
            for (u32 i = 0; i < 8; ++i) codes[i] = (u32)w[1 + 2 * i] | (u32)w[2 + 2 * i] << 16;
        } else {
            // Byte e holds element e (low nibble) and e + 16 (high), both offset by 8.
#pragma unroll
            for (u32 half = 0; half < 2; ++half)
#pragma unroll
                for (u32 i = 0; i < 4; ++i) {
                    u32 word = 0;
#pragma unroll
                    for (u32 k = 0; k < 4; ++k) {
                        const u32 e = 4 * i + k;
                        const u32 byte = (u32)(w[1 + e / 2] >> (8 * (e & 1))) & 0xff;
                        const u32 nibble = half ? byte >> 4 : byte & 15;
                        word |= (u32)(u8)(i8)((i32)nibble - 8) << (8 * k);
                    }
                    codes[4 * half + i] = word;
                }
        }
        return half_to_float(w[0]);
    }
    // One thread per (key, block).
    __device__ __forceinline__ void stage(Tile& tile, const i32* cells, i32 n, u64 kv_offset, u32 head_dim) const {
        const u32 blocks = head_dim / 32;
        for (u32 unit = threadIdx.x; unit < (u32)n * blocks; unit += blockDim.x) {
            const u32 j = unit / blocks, b = unit % blocks;
            u32 codes[8];
            tile.scales[j][b] = load_block(cells, j, b, kv_offset, codes);
            u32* out = &tile.words[j][b * 8];
#pragma unroll
            for (u32 i = 0; i < 8; ++i) out[i] = codes[i];
        }
    }
    __device__ __forceinline__ void fill(float* dst, u32 stride, const i32* cells, i32 n, u64 kv_offset,
                                         u32 head_dim) const {
        const u32 blocks = head_dim / 32;
        for (u32 unit = threadIdx.x; unit < (u32)n * blocks; unit += blockDim.x) {
            const u32 j = unit / blocks, b = unit % blocks;
            u32 codes[8];
            const float scale = load_block(cells, j, b, kv_offset, codes);
            float* out = dst + j * stride + b * 32;
#pragma unroll
            for (u32 e = 0; e < 32; ++e) out[e] = (float)(i8)(codes[e / 4] >> (8 * (e % 4))) * scale;
        }
    }
    __device__ __forceinline__ float tile_at(const Tile& tile, const i32*, i32 j, u64, u32 d) const {
        return (float)(i8)(tile.words[j][d / 4] >> (8 * (d % 4))) * tile.scales[j][d / 32];
    }
    // Scores of key `lane` (when below n) against query heads warp + DECODE_WARPS * k of the
    // block: each block's code dot in f32, times its scale. One word of codes feeds every
    // head of the warp; the queries are read by all lanes at once (broadcast).
    __device__ __forceinline__ void lane_scores(const Tile& tile, const float* queries, i32 n, u32 n_heads,
                                                u32 head_dim, float scale, u32 lane, u32 warp,
                                                float (*scores)[DECODE_TILE]) const {
        constexpr u32 PER_WARP = MAX_HEADS_PER_BLOCK / DECODE_WARPS;
        if ((i32)lane >= n) return;
        float dot[PER_WARP];
#pragma unroll
        for (u32 k = 0; k < PER_WARP; ++k) dot[k] = 0.0f;
        for (u32 b = 0; b < head_dim / 32; ++b) {
            float part[PER_WARP];
#pragma unroll
            for (u32 k = 0; k < PER_WARP; ++k) part[k] = 0.0f;
#pragma unroll
            for (u32 w = 0; w < 8; ++w) {
                const u32 word = tile.words[lane][b * 8 + w];
                float c[4];
#pragma unroll
                for (u32 e = 0; e < 4; ++e) c[e] = (float)(i8)(word >> (8 * e));
#pragma unroll
                for (u32 k = 0; k < PER_WARP; ++k) {
                    const u32 hh = warp + DECODE_WARPS * k;
                    if (hh < n_heads) {
                        const float4 q = *(const float4*)&queries[hh * head_dim + b * 32 + 4 * w];
                        part[k] += c[0] * q.x + c[1] * q.y + c[2] * q.z + c[3] * q.w;
                    }
                }
            }
            const float s = tile.scales[lane][b];
#pragma unroll
            for (u32 k = 0; k < PER_WARP; ++k) dot[k] += part[k] * s;
        }
#pragma unroll
        for (u32 k = 0; k < PER_WARP; ++k) {
            const u32 hh = warp + DECODE_WARPS * k;
            if (hh < n_heads) scores[hh][lane] = dot[k] * scale;
        }
    }
};

// TurboQuant caches (kernels/turbo.cuh) outside exact numerics (kernels/turbo.cu repeats the
// CPU's arithmetic instead), in the rotated basis R = H D / 8 of their blocks: the queries
// rotated alike and the output rotated back (`rotate_like_cache`). `TurboKv` decodes a tile's
// keys and values once, into shared memory, so that the tiled prefill and the flash-decoding
// kernels run as over a float cache (attention_prefill_tq, attention_decode_tq): a key there
// is |x| c (its codes' centroids), plus the sketch's estimate of the residual alpha S^T s (S =
// H D', s the signs as +-1, alpha = sqrt(pi/2) / 64 |r| |x|: alpha <S R q, s> = <R q, alpha
// S^T s>), plus its outliers rotated (R e_i v = H[., i] d_i v / 8); a value is the same without
// the sketch. (H s)_i is counted from the sign bits: 64 [i = 0] - 2 popcount(s) + 4 popcount(s
// & P_i), P_i the coordinates j with i & j of odd parity. attention_tq_query and
// attention_decode_tq_codes below score decode rows from the codes without decoding them
// (RUNIT_CUDA_TURBO_CODES=0 takes attention_decode_tq instead). Heads of at most TQ_TILE_DIM values
// (kernels/turbo.cu takes larger ones).
#define TQ_TILE_DIM 128
// A key's bytes of one head: two blocks of at most 48 bytes and the index bytes of their four
// outliers (at most 4).
#define TQ_RAW_KEY 104
// The rotation argument naming TurboQuant caches: bit 31 set, bits 0-3 the keys' code bits,
// bit 4 set when keys carry the sketch, bits 8-11 the values' code bits, bits 16-30 the query
// heads of a KV head (src/ops/turbo.rs `rotation_word`).
#define TQ_ROTATION 0x80000000u
__device__ __forceinline__ TqLayout tq_key_layout(u32 word) { return TqLayout{word & 15, word >> 4 & 1}; }
__device__ __forceinline__ TqLayout tq_value_layout(u32 word) { return TqLayout{word >> 8 & 15, 0}; }

// Coordinates j of a block with i & j of odd parity, as a mask.
__device__ __forceinline__ u64 tq_parity_mask(u32 i) {
    const u64 masks[6] = {0xaaaaaaaaaaaaaaaaull, 0xccccccccccccccccull, 0xf0f0f0f0f0f0f0f0ull,
                          0xff00ff00ff00ff00ull, 0xffff0000ffff0000ull, 0xffffffff00000000ull};
    u64 mask = 0;
#pragma unroll
    for (u32 k = 0; k < 6; ++k)
        if (i >> k & 1) mask ^= masks[k];
    return mask;
}

struct TurboTile {
    float x[DECODE_TILE][TQ_TILE_DIM + 1];  // padded: lanes read different keys
    u8 raw[DECODE_TILE * TQ_RAW_KEY];
};
struct TurboKv {
    using Tile = TurboTile;
    static constexpr bool LANE_SCORES = true;
    const u8* base;
    const float* tables;
    TqLayout layout;
    u32 row_blocks;  // blocks of a cell
    // Decodes the keys cells[0 .. n) of the head at kv_offset into dst (a row of `stride`
    // floats a key): their bytes first copied to `raw`, every load in flight at once, then a
    // warp per (key, block), a lane per two coordinates. All threads call it.
    template <u32 KEYS>
    __device__ __forceinline__ void decode(float* dst, u32 stride, u8* raw, const i32* cells, i32 n, u64 kv_offset,
                                           u32 head_dim) const {
        const u32 head_blocks = head_dim / TQ_BLOCK, first_block = (u32)(kv_offset / TQ_BLOCK);
        const TqSlice slice = tq_slice(layout, row_blocks, first_block, head_blocks);
        const u32 per_key = slice.stride();
        const u32 lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
        constexpr u32 PARTS = (TQ_RAW_KEY + 31) / 32;
        for (u32 first = warp; first < (u32)n; first += warps * KEYS) {
            u8 bytes[KEYS][PARTS];
#pragma unroll
            for (u32 r = 0; r < KEYS; ++r) {
                const u32 j = first + warps * r;
                const u8* row = base + (u64)cells[min(j, (u32)n - 1)] * slice.row_bytes;
#pragma unroll
                for (u32 p = 0; p < PARTS; ++p) {
                    const u32 b = lane + 32 * p;
                    if (j < (u32)n && b < per_key)
                        bytes[r][p] = row[b < slice.block_span ? slice.block_offset + b
                                                               : slice.index_offset + (b - slice.block_span)];
                }
            }
#pragma unroll
            for (u32 r = 0; r < KEYS; ++r) {
                const u32 j = first + warps * r;
#pragma unroll
                for (u32 p = 0; p < PARTS; ++p) {
                    const u32 b = lane + 32 * p;
                    if (j < (u32)n && b < per_key) raw[j * TQ_RAW_KEY + b] = bytes[r][p];
                }
            }
        }
        __syncthreads();
        const float* centroids = layout.centroids(tables);
        const float sketch_factor = tables[TQ_SKETCH_FACTOR];
        const u32 bb = layout.block_bytes();
        const u64 low_mask = tq_parity_mask(lane), high_mask = low_mask ^ 0xffffffff00000000ull;
        u64 rotation[2], sketch[2];
#pragma unroll
        for (u32 b = 0; b < 2; ++b) {
            rotation[b] = tq_signs(first_block + b, 0);
            sketch[b] = layout.sketch ? tq_signs(first_block + b, 1) : 0;
        }
        for (u32 unit = warp; unit < (u32)n * head_blocks; unit += warps) {
            const u32 j = unit / head_blocks, b = unit % head_blocks;
            const u8* key = raw + j * TQ_RAW_KEY;
            const u8* block = key + b * bb;
            const u8* codes = block + layout.code_offset();
            const u64 rot = b ? rotation[1] : rotation[0];
            const float norm = tq_f16(block);
            u32 index[TQ_OUTLIERS];
            float outlier[TQ_OUTLIERS];
#pragma unroll
            for (u32 o = 0; o < TQ_OUTLIERS; ++o) {
                index[o] = tq_index_at(key + slice.block_span, slice.index_bit + (b * TQ_OUTLIERS + o) * TQ_INDEX_BITS);
                const float v = tq_f16(block + layout.header() + 2 * o) * 0.125f;
                outlier[o] = rot >> index[o] & 1 ? -v : v;
            }
            float alpha = 0.0f;
            u64 signs = 0, sk = 0;
            i32 count = 0;
            if (layout.sketch) {
                alpha = sketch_factor * tq_f16(block + 2) * norm;
                const u8* s = block + layout.sign_offset();
#pragma unroll
                for (u32 k = 0; k < 8; ++k) signs |= (u64)s[k] << (8 * k);
                sk = b ? sketch[1] : sketch[0];
                count = -2 * __popcll(signs);
            }
            float* out = dst + j * stride + b * TQ_BLOCK;
#pragma unroll
            for (u32 half = 0; half < 2; ++half) {
                const u32 i = lane + 32 * half;
                float r = norm * __ldg(centroids + tq_code(codes, i, layout.bits));
                if (layout.sketch) {
                    const i32 h = count + 4 * __popcll(signs & (half ? high_mask : low_mask)) + (i == 0 ? 64 : 0);
                    const float t = alpha * (float)h;
                    r += sk >> i & 1 ? -t : t;
                }
#pragma unroll
                for (u32 o = 0; o < TQ_OUTLIERS; ++o) r += __popc(i & index[o]) & 1 ? -outlier[o] : outlier[o];
                out[i] = r;
            }
        }
    }
    __device__ __forceinline__ void fill(float* dst, u32 stride, const i32* cells, i32 n, u64 kv_offset,
                                         u32 head_dim) const {
        __shared__ u8 raw[DECODE_TILE * TQ_RAW_KEY];
        __syncthreads();  // the keys' decode has read `raw` when the values' starts
        // Prefill blocks have 16 warps (plan::PrefillPlan): two keys each cover a tile of 32.
        decode<2>(dst, stride, raw, cells, n, kv_offset, head_dim);
    }
    // Decode (attention_decode_tq): the tile decoded once for every query head of the block.
    __device__ __forceinline__ void stage(Tile& tile, const i32* cells, i32 n, u64 kv_offset, u32 head_dim) const {
        decode<DECODE_TILE / DECODE_WARPS>(&tile.x[0][0], TQ_TILE_DIM + 1, tile.raw, cells, n, kv_offset, head_dim);
    }
    __device__ __forceinline__ float tile_at(const Tile& tile, const i32*, i32 j, u64, u32 d) const {
        return tile.x[j][d];
    }
    // Scores of key `lane` (when below n) against query heads warp + DECODE_WARPS * k.
    __device__ __forceinline__ void lane_scores(const Tile& tile, const float* queries, i32 n, u32 n_heads,
                                                u32 head_dim, float scale, u32 lane, u32 warp,
                                                float (*scores)[DECODE_TILE]) const {
        constexpr u32 PER_WARP = MAX_HEADS_PER_BLOCK / DECODE_WARPS;
        if ((i32)lane >= n) return;
        float dot[PER_WARP];
#pragma unroll
        for (u32 k = 0; k < PER_WARP; ++k) dot[k] = 0.0f;
        const float* key = tile.x[lane];
        for (u32 d = 0; d < head_dim; d += 4) {
            const float k0 = key[d], k1 = key[d + 1], k2 = key[d + 2], k3 = key[d + 3];
#pragma unroll
            for (u32 k = 0; k < PER_WARP; ++k) {
                const u32 hh = warp + DECODE_WARPS * k;
                if (hh < n_heads) {
                    const float4 q = *(const float4*)&queries[hh * head_dim + d];
                    dot[k] += k0 * q.x + k1 * q.y + k2 * q.z + k3 * q.w;
                }
            }
        }
#pragma unroll
        for (u32 k = 0; k < PER_WARP; ++k) {
            const u32 hh = warp + DECODE_WARPS * k;
            if (hh < n_heads) scores[hh][lane] = dot[k] * scale;
        }
    }
};

// Rotates `width` values, vectors of head_dim of KV head kv_head, as a cache rotated its
// rows (`back`: as the output is rotated back): `rotation` 0 none; with TQ_ROTATION,
// TurboQuant's R of each block of 64 (back: R^T); else ggml's normalized Hadamard chunks of
// `rotation` values (its own inverse). All threads call it.
__device__ void rotate_like_cache(float* x, u32 width, u32 head_dim, u32 kv_head, u32 rotation, bool back) {
    if (rotation == 0) return;
    if (!(rotation & TQ_ROTATION)) {
        hadamard_chunks(x, width, rotation);
        return;
    }
    const u32 first_block = kv_head * (head_dim / TQ_BLOCK);
    if (!back) {
        for (u32 i = threadIdx.x; i < width; i += blockDim.x) {
            const u32 d = i % head_dim;
            const float v = x[i] * 0.125f;
            x[i] = tq_signs(first_block + d / TQ_BLOCK, 0) >> (d % TQ_BLOCK) & 1 ? -v : v;
        }
        __syncthreads();
    }
    for (u32 span = 1; span < TQ_BLOCK; span *= 2) {
        for (u32 p = threadIdx.x; p < width / 2; p += blockDim.x) {
            const u32 i = p / (TQ_BLOCK / 2) * TQ_BLOCK + (p % (TQ_BLOCK / 2) / span) * 2 * span + p % span;
            const float a = x[i], b = x[i + span];
            x[i] = a + b;
            x[i + span] = a - b;
        }
        __syncthreads();
    }
    if (back) {
        for (u32 i = threadIdx.x; i < width; i += blockDim.x) {
            const u32 d = i % head_dim;
            const float v = x[i] * 0.125f;
            x[i] = tq_signs(first_block + d / TQ_BLOCK, 0) >> (d % TQ_BLOCK) & 1 ? -v : v;
        }
        __syncthreads();
    }
}

// The span owning `row`, or -1 when no span's rows include it.
__device__ __forceinline__ i32 attention_span(const i32* step, const StepHeader* h, i32 row) {
    if (row < 0 || row >= h->tokens) return -1;
    const i32 span = step[h->row_span + row];
    if (span < 0 || span >= h->spans) return -1;
    const i32* info = step + h->span_info + span * 4;
    return row >= info[0] && row < info[0] + info[1] ? span : -1;
}

// First visible key position of a query at `position`.
__device__ __forceinline__ i32 first_visible(i32 position, u32 window) {
    return window == 0 ? 0 : max(0, position + 1 - (i32)window);
}

// Chunks that follow the row (chunk_len 0, attention_decode_tq_codes): a query seeing `len`
// positions from `lo` splits them into chunks of this many (whole tiles), chunk c holding
// [lo + c L, lo + (c + 1) L), so that every chunk of the grid has keys at any depth.
__device__ __forceinline__ i32 row_chunk_len(i32 len, u32 chunks) {
    const u32 tiles = ((u32)len + TQ_TILE - 1) / TQ_TILE;
    return (i32)(TQ_TILE * ((tiles + chunks - 1) / chunks));
}

// The positions [begin, end) of chunk `chunk` (of chunk_len, or 0: row_chunk_len) that decode
// row `row`'s query sees, and the row's span; begin >= end when none (no span owns the row,
// the chunk is past `chunks`, or it lies outside [lo, position]).
struct DecodeRange {
    i32 span = -1, begin = 0, end = 0;
    __device__ DecodeRange(const i32* step, i32 row, i32 chunk, u32 window, u32 chunk_len, u32 chunks) {
        const StepHeader* h = (const StepHeader*)step;
        span = attention_span(step, h, row);
        if (span < 0 || (u32)chunk >= chunks) return;
        const i32 position = step[h->positions + row], lo = first_visible(position, window);
        if (chunk_len == 0) {
            const i32 len = row_chunk_len(position + 1 - lo, chunks);
            begin = lo + chunk * len;
            end = min(position + 1, begin + len);
            return;
        }
        begin = max(lo, chunk * (i32)chunk_len);
        end = min(position + 1, (chunk + 1) * (i32)chunk_len);
    }
};

__device__ __forceinline__ float query_value(const float* q, u64 index, u32 round_q) {
    const float value = q[index];
    return round_q ? half_to_float(float_to_half(value)) : value;
}

// ---------------------------------------------------------------------------------------
// TurboQuant decode from the codes. attention_tq_query prepares the query side once per (row, KV
// head, slice of its query heads), TQ_Q_FLOATS floats: the rotated queries R q (TQ_QPAD floats a
// block: the two blocks' lanes of a warp read different banks), the plain queries (for the
// outliers), and for the sketch 4-bit tables of the sketched queries S R q (entry (block,
// position p, head, v): the sum of coordinates 4 p + k over the bits k of v) with each (block,
// head)'s total. attention_decode_tq_codes walks its chunk in tiles of TQ_TILE keys, the next
// tile's bytes copied while one is computed: a thread per (key, block) scores it from the codes
// (centroids against R q; the sketch's <S R q, s> as total - 2 x the tables' sums over the
// nibbles of negative signs; the outliers against q), the online softmax, then a thread per
// four coordinates sums the values in the rotated basis, the outliers rotated in. Partials as
// attention_decode_*'s (query heads and chunks alike); attention_combine rotates the merged
// rows back.
#define TQ_THREADS 128
#define TQ_QPAD 68
#define TQ_LUT 2064         // one block's tables: 16 positions x 8 heads x 16 values, 16 of padding
#define TQ_Q_ROTATED 0                                   // [8 heads][2 blocks][TQ_QPAD]
#define TQ_Q_PLAIN (TQ_Q_ROTATED + 8 * 2 * TQ_QPAD)      // [8 heads][TQ_TILE_DIM]
#define TQ_Q_TOTAL (TQ_Q_PLAIN + 8 * TQ_TILE_DIM)        // [2 blocks][8 heads]
#define TQ_Q_LUT (TQ_Q_TOTAL + 16)                       // [2 blocks][TQ_LUT]
#define TQ_Q_FLOATS (TQ_Q_LUT + 2 * TQ_LUT)

// The query heads of decode block y (of kv_heads * slices): their KV head, the first and how
// many.
struct HeadSlice {
    u32 kv_head, first, count;
    __device__ HeadSlice(u32 heads, u32 kv_heads, u32 heads_per_block, u32 y) {
        const u32 group = heads / kv_heads, slices = (group + heads_per_block - 1) / heads_per_block;
        kv_head = y / slices;
        first = kv_head * group + y % slices * heads_per_block;
        count = min(heads_per_block, group - y % slices * heads_per_block);
    }
};

// The unnormalized Hadamard transform of the 64 values a warp holds (lane l: values l and
// l + 32) in place: butterflies of spans 1, 2, .. 32, each pair (a, b) becoming (a + b, a - b).
__device__ __forceinline__ void tq_warp_hadamard(float& x0, float& x1, u32 lane) {
#pragma unroll
    for (u32 span = 1; span < 32; span *= 2) {
        const float p0 = __shfl_xor_sync(0xffffffffu, x0, span), p1 = __shfl_xor_sync(0xffffffffu, x1, span);
        if (lane & span) {
            x0 = p0 - x0;
            x1 = p1 - x1;
        } else {
            x0 = x0 + p0;
            x1 = x1 + p1;
        }
    }
    const float a = x0, b = x1;
    x0 = a + b;
    x1 = a - b;
}

// R x = H D x / 8 (the cache's rotation of block `block`) of the 64 values a warp holds
// (lane l: values l and l + 32), in place.
__device__ __forceinline__ void tq_warp_rotate(float& x0, float& x1, u32 block, u32 lane) {
    const u64 rotation = tq_signs(block, 0);
    x0 *= 0.125f;
    x1 *= 0.125f;
    if (rotation >> lane & 1) x0 = -x0;
    if (rotation >> (lane + 32) & 1) x1 = -x1;
    tq_warp_hadamard(x0, x1, lane);
}
// S y = H D' y (the sketch of block `block`) likewise.
__device__ __forceinline__ void tq_warp_sketch(float& x0, float& x1, u32 block, u32 lane) {
    const u64 signs = tq_signs(block, 1);
    if (signs >> lane & 1) x0 = -x0;
    if (signs >> (lane + 32) & 1) x1 = -x1;
    tq_warp_hadamard(x0, x1, lane);
}

// One warp's share of the prepared query side (query head g of a slice, its block b: the
// block's rotation `block`) into `out` (TQ_Q_FLOATS floats, global or shared memory): the
// plain and rotated queries R q, and with the sketch S R q's total and 4-bit tables.
// `query`: the head's values, or null past the slice's count (zeros); `sketched`: 64 floats
// of this warp's scratch.
__device__ __forceinline__ void tq_prepare_query(const float* query, u32 head_dim, u32 block, u32 g, u32 b,
                                                 u32 lane, float* out, float* sketched, bool sketch) {
    const u32 w = 2 * g + b, d0 = b * TQ_BLOCK + lane, d1 = d0 + 32;
    const float x0 = query && d0 < head_dim ? query[d0] : 0.0f;
    const float x1 = query && d1 < head_dim ? query[d1] : 0.0f;
    out[TQ_Q_PLAIN + g * TQ_TILE_DIM + d0] = x0;
    out[TQ_Q_PLAIN + g * TQ_TILE_DIM + d1] = x1;
    float r0 = x0, r1 = x1;
    tq_warp_rotate(r0, r1, block, lane);
    out[TQ_Q_ROTATED + w * TQ_QPAD + lane] = r0;
    out[TQ_Q_ROTATED + w * TQ_QPAD + lane + 32] = r1;
    if (!sketch) return;  // keys without the sketch
    float s0 = r0, s1 = r1;
    tq_warp_sketch(s0, s1, block, lane);
    const float total = warp_sum(s0 + s1);
    if (lane == 0) out[TQ_Q_TOTAL + b * 8 + g] = total;
    sketched[lane] = s0;
    sketched[lane + 32] = s1;
    __syncwarp();
    // The tables: entry (position p, value v) sums coordinates 4 p + k over the bits k of v.
#pragma unroll
    for (u32 t = 0; t < 8; ++t) {
        const u32 i = lane + 32 * t, pos = i / 16, v = i % 16;
        const float* x = sketched + 4 * pos;
        float sum = 0.0f;
#pragma unroll
        for (u32 k = 0; k < 4; ++k)
            if (v >> k & 1) sum += x[k];
        out[TQ_Q_LUT + b * TQ_LUT + (pos * 8 + g) * 16 + v] = sum;
    }
    __syncwarp();
}

// Launch: grid (kv_heads * slices, rows), TQ_QUERY_THREADS threads: warp w takes query head
// w / 2 of the slice and its block w % 2 (two values a lane), with no block-wide barrier.
// qdata: [rows][kv_heads * slices] of TQ_Q_FLOATS.
#define TQ_QUERY_THREADS 512
extern "C" __global__ void __launch_bounds__(TQ_QUERY_THREADS)
    attention_tq_query(const float* q, const i32* step, float* qdata, u32 heads, u32 kv_heads, u32 head_dim,
                       u32 heads_per_block, u32 turbo) {
    // Waits before it lets the decode launch: when attention_decode_tq_codes starts, every
    // kernel before this one (the cache's row writer) is complete, so it may copy its first
    // tile of the cache before its own wait for this kernel's qdata.
    pdl_wait();
    pdl_launch_dependents();
    __shared__ float sketched[16][TQ_BLOCK];
    const StepHeader* h = (const StepHeader*)step;
    const i32 row = blockIdx.y;
    if (attention_span(step, h, row) < 0) return;
    const HeadSlice hs(heads, kv_heads, heads_per_block, blockIdx.x);
    const u32 lane = threadIdx.x & 31, w = threadIdx.x >> 5, g = w >> 1, b = w & 1;
    const float* query = g < hs.count ? q + ((u64)row * heads + hs.first + g) * head_dim : nullptr;
    tq_prepare_query(query, head_dim, hs.kv_head * (head_dim / TQ_BLOCK) + b, g, b, lane,
                     qdata + ((u64)row * gridDim.x + blockIdx.x) * TQ_Q_FLOATS, sketched[w], turbo >> 4 & 1);
}

// Launch: grid (chunks, kv_heads * slices, rows), TQ_THREADS threads, TQ_SHARED_WORDS words of
// dynamic shared memory (plan::TURBO_SHARED_BYTES), at least TQ_MIN_BLOCKS blocks a
// multiprocessor (a timing knob). chunk_len 0: a row's chunks follow its visible length
// (tq_chunk_len), so every chunk of the grid holds keys at any depth.
//
// A block walks its chunk's tiles as a pipeline of two stages: while a tile is scored and
// summed, the next tile's key and value bytes are copied into the other stage with cp.async,
// as they lie in the cache rows (a warp per key, a lane per 4-byte word of the KV head's
// blocks and index bytes; rows are padded to 4 bytes, TqLayout::row_bytes), and the tile
// after it's cells are loaded. The prepared query side arrives with the first tile.
#ifndef TQ_MIN_BLOCKS
#define TQ_MIN_BLOCKS 3
#endif
#define TQ_KEY_WORDS 27    // a staged key: its head's blocks and index bytes, 26 words at most (odd: banks)
#define TQ_VALUE_WORDS 22  // a staged value: the same, 22 words at most
// Dynamic shared memory, in 4-byte words from its start.
#define TQ_S_QUERY 0                                              // the prepared query, TQ_Q_FLOATS
#define TQ_S_KEYS (TQ_S_QUERY + TQ_Q_FLOATS)                      // [2][TQ_TILE][TQ_KEY_WORDS]
#define TQ_S_VALUES (TQ_S_KEYS + 2 * TQ_TILE * TQ_KEY_WORDS)      // [2][TQ_TILE][TQ_VALUE_WORDS]
#define TQ_S_SCORES (TQ_S_VALUES + 2 * TQ_TILE * TQ_VALUE_WORDS)  // [8][TQ_TILE]
#define TQ_S_WEIGHTS (TQ_S_SCORES + 8 * TQ_TILE)                  // [TQ_TILE][8] (16-byte aligned)
#define TQ_S_VNORM (TQ_S_WEIGHTS + 8 * TQ_TILE)                   // [TQ_TILE][2]
#define TQ_S_VOUTLIER (TQ_S_VNORM + 2 * TQ_TILE)                  // [TQ_TILE][2][TQ_OUTLIERS]
#define TQ_S_VINDEX (TQ_S_VOUTLIER + 2 * TQ_OUTLIERS * TQ_TILE)   // [TQ_TILE][2][TQ_OUTLIERS]
#define TQ_S_PAIRS (TQ_S_VINDEX + 2 * TQ_OUTLIERS * TQ_TILE)      // key and value pair tables, [256] float2 each
#define TQ_S_SMALL (TQ_S_PAIRS + 2 * 2 * 256)                     // max, sum, rescale [8]
#define TQ_S_MMA (TQ_S_SMALL + 24)  // [4][2][4][32] uint2 B fragments, [2][256] half2 centroid pairs (hi, lo)
#define TQ_SHARED_WORDS (TQ_S_MMA + 4 * 2 * 4 * 32 * 2 + 2 * 256)
// 1: scores on the tensor cores (TQ_MMA_SCORES; a timing knob, RUNIT_CUDA_DEFINES): a warp per
// 16 keys, m16n8k16 f16 mma of the keys' centroids (split hi + lo halves) against R q (hi + lo),
// and of the sketch's signs (+-1, exact) against S R q (hi + lo), f32 accumulators; the
// product of the two lo halves (2^-22 relative) is left out.
#ifndef TQ_MMA_SCORES
#define TQ_MMA_SCORES 0
#endif

// x0, x1 as f16x2 hi + lo halves (hi the rounding of x, lo the rounding of what hi leaves).
__device__ __forceinline__ void tq_split_half2(float x0, float x1, u32& hi, u32& lo) {
    hi = pack_half2(x0, x1);
    lo = pack_half2(x0 - half_to_float((u16)(hi & 0xffffu)), x1 - half_to_float((u16)(hi >> 16)));
}
// Coordinates c, c + 1 of a sign sketch (bit set: -1) as f16x2 of +-1.
__device__ __forceinline__ u32 tq_sign_pair(u64 signs, u32 c) {
    const u32 bits = (u32)(signs >> c) & 3u;
    return 0x3c003c00u | (bits & 1u) << 15 | (bits & 2u) << 30;
}

// The 4-byte word of `bytes` (4-byte aligned) that starts at byte `at` (even).
__device__ __forceinline__ u32 tq_word_at(const u8* bytes, u32 at) {
    const u32* words = (const u32*)(bytes + (at & ~3u));
    return at & 3 ? __funnelshift_r(words[0], words[1], 16) : words[0];
}
__device__ __forceinline__ float tq_half_at(const u8* bytes, u32 at) { return half_to_float(*(const u16*)(bytes + at)); }

// The words of one KV head's slice of a cache row (blocks, then index bytes) that lane `lane`
// copies: its offset in the row, or ~0u when the lane copies none.
struct TqStaging {
    u32 block_shift, block_words, index_shift, index_words, lane_offset;
    __device__ TqStaging(const TqSlice& slice, u32 lane) {
        block_shift = slice.block_offset & 3;
        block_words = (block_shift + slice.block_span + 3) / 4;
        index_shift = (u32)(slice.index_offset & 3);
        index_words = (index_shift + slice.index_span + 3) / 4;
        lane_offset = lane < block_words                 ? slice.block_offset - block_shift + 4 * lane
                      : lane < block_words + index_words ? (u32)(slice.index_offset - index_shift) + 4 * (lane - block_words)
                                                         : ~0u;
    }
    // The staged copy's index bytes.
    __device__ const u8* indices(const u8* staged) const { return staged + 4 * block_words + index_shift; }
};

extern "C" __global__ void __launch_bounds__(TQ_THREADS, TQ_MIN_BLOCKS)
    attention_decode_tq_codes(const u8* k_cache, const u8* v_cache, const i32* step, const float* qdata,
                              const float* q, const float* tables, float* part_acc, float* part_stats, u32 heads,
                              u32 kv_heads, u32 head_dim, float scale, u32 window, u32 chunk_len, u32 chunks,
                              u32 heads_per_block, u32 turbo, u32 fused) {
    // The wait for the kernel before (attention_tq_query's qdata, or with `fused` the cache
    // writer itself) comes after the first tile's copies unless `fused` (see there).
    pdl_launch_dependents();
    extern __shared__ __align__(16) float tq_shared[];
    u32 shared_bytes;
    asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(shared_bytes));
    if (shared_bytes < 4 * TQ_SHARED_WORDS) __trap();  // plan::TURBO_SHARED_BYTES disagrees
    const float* query = tq_shared + TQ_S_QUERY;
    const float* lut = query + TQ_Q_LUT;
    const float* rotated = query + TQ_Q_ROTATED;
    const float* plain = query + TQ_Q_PLAIN;
    const float* totals = query + TQ_Q_TOTAL;
    u32* key_stage = (u32*)(tq_shared + TQ_S_KEYS);
    u32* value_stage = (u32*)(tq_shared + TQ_S_VALUES);
    float(*scores)[TQ_TILE] = (float(*)[TQ_TILE])(tq_shared + TQ_S_SCORES);
    float(*weights)[8] = (float(*)[8])(tq_shared + TQ_S_WEIGHTS);
    float(*value_norm)[2] = (float(*)[2])(tq_shared + TQ_S_VNORM);
    float(*value_outlier)[2][TQ_OUTLIERS] = (float(*)[2][TQ_OUTLIERS])(tq_shared + TQ_S_VOUTLIER);
    u32(*value_index)[2][TQ_OUTLIERS] = (u32(*)[2][TQ_OUTLIERS])(tq_shared + TQ_S_VINDEX);
    // Centroids of two neighbouring codes at once: entry c0 | c1 << bits is (c[c0], c[c1]).
    float2* k_pairs = (float2*)(tq_shared + TQ_S_PAIRS);
    float2* v_pairs = k_pairs + 256;
    float* running_max = tq_shared + TQ_S_SMALL;
    float* running_sum = running_max + 8;
    float* rescale = running_sum + 8;
    uint2(*b_frags)[2][4][32] = (uint2(*)[2][4][32])(tq_shared + TQ_S_MMA);  // [R q hi, lo, S R q hi, lo]
    u32(*k_halves)[256] = (u32(*)[256])(tq_shared + TQ_S_MMA + 4 * 2 * 4 * 32 * 2);

    const StepHeader* h = (const StepHeader*)step;
    const i32 row = blockIdx.z, chunk = blockIdx.x;
    const DecodeRange range(step, row, chunk, window, chunk_len, chunks);
    if (range.begin >= range.end) return;  // attention_combine skips these chunks (no wait)
    const i32 span = range.span, begin = range.begin, end = range.end;
    const u32 tiles = (u32)(end - begin + TQ_TILE - 1) / TQ_TILE;

    const HeadSlice hs(heads, kv_heads, heads_per_block, blockIdx.y);
    const u32 n_heads = hs.count;
    const TqLayout kl = tq_key_layout(turbo), vl = tq_value_layout(turbo);
    const u32 head_blocks = head_dim / TQ_BLOCK, first_block = hs.kv_head * head_blocks;
    const u32 row_blocks = kv_heads * head_blocks;
    const TqSlice ks = tq_slice(kl, row_blocks, first_block, head_blocks);
    const TqSlice vs = tq_slice(vl, row_blocks, first_block, head_blocks);
    const u32 k_block_bytes = kl.block_bytes(), v_block_bytes = vl.block_bytes();
    const u32 tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const TqStaging k_staging(ks, lane), v_staging(vs, lane);

    // Stage `s` of the pipeline: tile `t`'s keys, a warp per key (keys warp, warp + 4, ...;
    // lane r < 16 holds the cell of key warp + 4 r in `cell`).
    auto stage_tile = [&](u32 t, u32 s, i32 cell) {
        const i32 first = begin + (i32)t * TQ_TILE, n = min(TQ_TILE, end - first);
        u32* keys = key_stage + s * TQ_TILE * TQ_KEY_WORDS;
        u32* values = value_stage + s * TQ_TILE * TQ_VALUE_WORDS;
#pragma unroll 4
        for (u32 r = 0; r < TQ_TILE / 4; ++r) {
            const u32 j = warp + 4 * r;
            const i32 c = __shfl_sync(0xffffffffu, cell, r);
            if ((i32)j >= n) break;
            if (k_staging.lane_offset != ~0u)
                cp_async4(shared_address(keys + j * TQ_KEY_WORDS + lane),
                          k_cache + (u64)c * ks.row_bytes + k_staging.lane_offset);
            if (v_staging.lane_offset != ~0u)
                cp_async4(shared_address(values + j * TQ_VALUE_WORDS + lane),
                          v_cache + (u64)c * vs.row_bytes + v_staging.lane_offset);
        }
    };
    // The cells of tile t that lane r < 16 of this warp stages.
    auto tile_cells = [&](u32 t) -> i32 {
        const i32 position = begin + (i32)t * TQ_TILE + (i32)(warp + 4 * lane);
        return lane < TQ_TILE / 4 && position < end ? step_cell(step, h, span, position) : 0;
    };

    // The prepared query side: copied with the first tile (qdata: attention_tq_query), or with
    // `fused` prepared here while the first tile's copies are in flight, a warp per (query head,
    // block) as attention_tq_query's, the second key stage as scratch (free until tile 1).
    // Without `fused`, the kernel before is attention_tq_query, which let this one launch only
    // after its own wait: the cache rows are written, and tile 0's copies go out before this
    // kernel waits for the prepared query. With `fused`, the kernel before writes the cache.
    if (!fused) {
        stage_tile(0, 0, tile_cells(0));
        pdl_wait();
        const float* from = qdata + ((u64)row * gridDim.y + blockIdx.y) * TQ_Q_FLOATS;
        const u32 quads = (kl.sketch ? TQ_Q_FLOATS : TQ_Q_LUT) / 4;
        for (u32 i = tid; i < quads; i += TQ_THREADS) cp_async16(shared_address(tq_shared + TQ_S_QUERY + 4 * i), from + 4 * i);
    } else {
        pdl_wait();
        stage_tile(0, 0, tile_cells(0));
    }
    cp_async_commit();
    if (fused) {
        float* scratch = (float*)(key_stage + TQ_TILE * TQ_KEY_WORDS) + warp * TQ_BLOCK;
        for (u32 task = warp; task < 16; task += TQ_THREADS / 32) {
            const u32 g = task >> 1, b = task & 1;
            const float* query = g < n_heads ? q + ((u64)row * heads + hs.first + g) * head_dim : nullptr;
            tq_prepare_query(query, head_dim, first_block + b, g, b, lane, tq_shared + TQ_S_QUERY, scratch, kl.sketch);
        }
        __syncthreads();  // the scratch is tile 1's stage
    }
    i32 next_cells = tiles > 1 ? tile_cells(1) : 0;
    for (u32 i = tid; i < 256; i += TQ_THREADS) {
        const float* kc = kl.centroids(tables);
        const float* vc = vl.centroids(tables);
        const u32 km = (1u << kl.bits) - 1, vm = (1u << vl.bits) - 1;
        k_pairs[i] = make_float2(kc[i & km], kc[i >> kl.bits & km]);
        v_pairs[i] = make_float2(vc[i & vm], vc[i >> vl.bits & vm]);
        if (TQ_MMA_SCORES) tq_split_half2(kc[i & km], kc[i >> kl.bits & km], k_halves[0][i], k_halves[1][i]);
    }
    // Heads past the slice's count compute on zeros (their prepared queries are zero, their
    // weights stay zero) rather than test the count at every multiply.
    for (u32 i = tid; i < TQ_TILE * 8; i += TQ_THREADS) (&weights[0][0])[i] = 0.0f;
    if (tid < 8) {
        running_max[tid] = NEG_INF;
        running_sum[tid] = 0.0f;
    }
    const float sketch_factor = tables[TQ_SKETCH_FACTOR];
    // Values: thread tid takes coordinates 4 quad .. 4 quad + 3 of every head (one block's,
    // codes in neighbouring bits), keys part, part + parts, ...
    const u32 quads = head_dim / 4, parts = TQ_THREADS / quads, quad = tid % quads, part = tid / quads;
    const u32 vb = 4 * quad / TQ_BLOCK, ve = 4 * quad % TQ_BLOCK;
    const u32 code_byte = v_staging.block_shift + vb * v_block_bytes + vl.code_offset() + ve * vl.bits / 8;
    const u32 code_shift = ve * vl.bits % 8, pair_mask = (1u << 2 * vl.bits) - 1;
    float acc[8][4];
#pragma unroll
    for (u32 g = 0; g < 8; ++g)
#pragma unroll
        for (u32 k = 0; k < 4; ++k) acc[g][k] = 0.0f;

    for (u32 t = 0; t < tiles; ++t) {
        const u32 s = t & 1;
        // The next tile's copies go out before this tile's wait; the cells of the one after
        // are loaded while this tile is computed.
        if (t + 1 < tiles) stage_tile(t + 1, s ^ 1, next_cells);
        cp_async_commit();
        if (t + 2 < tiles) next_cells = tile_cells(t + 2);
        cp_async_wait<1>();
        __syncthreads();
        const i32 n = min(TQ_TILE, end - (begin + (i32)t * TQ_TILE));
        const u8* keys = (const u8*)(key_stage + s * TQ_TILE * TQ_KEY_WORDS);
        const u8* values = (const u8*)(value_stage + s * TQ_TILE * TQ_VALUE_WORDS);
        // Each value block's norm and outliers (index, value times d_i / 8), a thread each.
        if (tid < (u32)n * head_blocks) {
            const u32 j = tid / head_blocks, b = tid % head_blocks;
            const u8* value = values + j * 4 * TQ_VALUE_WORDS;
            const u32 at = v_staging.block_shift + b * v_block_bytes;
            const u64 rotation = tq_signs(first_block + b, 0);
            value_norm[j][b] = tq_half_at(value, at);
#pragma unroll
            for (u32 o = 0; o < TQ_OUTLIERS; ++o) {
                const u32 index =
                    tq_index_at(v_staging.indices(value), vs.index_bit + (b * TQ_OUTLIERS + o) * TQ_INDEX_BITS);
                const float v = tq_half_at(value, at + vl.header() + 2 * o) * 0.125f;
                value_index[j][b][o] = index;
                value_outlier[j][b][o] = rotation >> index & 1 ? -v : v;
            }
        }
        // The B fragments of R q and S R q (from the tables: entry (p, g, 1 << k) is
        // coordinate 4 p + k), once the prepared query is in: lane 4 g + t of k-step kk holds
        // coordinates 16 kk + 2 t, + 1 and + 8, + 9 of head g.
        if (TQ_MMA_SCORES && t == 0) {
            for (u32 e = tid; e < 2 * 4 * 32; e += TQ_THREADS) {
                const u32 b = e / 128, kk = e / 32 % 4, l = e % 32, g = l >> 2, c = 16 * kk + 2 * (l & 3);
                const float* r = rotated + (2 * g + b) * TQ_QPAD;
                uint2 hi, lo;
                tq_split_half2(r[c], r[c + 1], hi.x, lo.x);
                tq_split_half2(r[c + 8], r[c + 9], hi.y, lo.y);
                b_frags[0][b][kk][l] = hi;
                b_frags[1][b][kk][l] = lo;
                if (!kl.sketch) continue;
                auto s = [&](u32 coord) { return lut[b * TQ_LUT + (coord / 4 * 8 + g) * 16 + (1u << coord % 4)]; };
                tq_split_half2(s(c), s(c + 1), hi.x, lo.x);
                tq_split_half2(s(c + 8), s(c + 9), hi.y, lo.y);
                b_frags[2][b][kk][l] = hi;
                b_frags[3][b][kk][l] = lo;
            }
            __syncthreads();
        }
        if (TQ_MMA_SCORES) {
            // Scores on the tensor cores: warp w takes keys 16 w .. 16 w + 15; lane 4 g + t
            // ends with keys 16 w + g and + 8, heads 2 t and 2 t + 1.
            const u32 gid = lane >> 2, tig = lane & 3, r0 = 16 * warp + gid, r1 = r0 + 8;
            if (16 * warp < (u32)n) {
                const u8* key0 = keys + min(r0, (u32)n - 1) * 4 * TQ_KEY_WORDS;
                const u8* key1 = keys + min(r1, (u32)n - 1) * 4 * TQ_KEY_WORDS;
                float part[4] = {0.0f, 0.0f, 0.0f, 0.0f};
                for (u32 b = 0; b < head_blocks; ++b) {
                    const u32 at = k_staging.block_shift + b * k_block_bytes, codes = at + kl.code_offset();
                    float cd[4] = {0.0f, 0.0f, 0.0f, 0.0f}, sd[4] = {0.0f, 0.0f, 0.0f, 0.0f};
                    u64 signs0 = 0, signs1 = 0;
                    if (kl.sketch) {  // sketched keys' blocks are 4-byte aligned
                        const u32* w0 = (const u32*)(key0 + at + kl.sign_offset());
                        const u32* w1 = (const u32*)(key1 + at + kl.sign_offset());
                        signs0 = (u64)w0[0] | (u64)w0[1] << 32;
                        signs1 = (u64)w1[0] | (u64)w1[1] << 32;
                    }
#pragma unroll
                    for (u32 kk = 0; kk < 4; ++kk) {
                        const u32 byte = codes + 8 * kk + tig;  // 4-bit codes: coordinates 2 i, 2 i + 1
                        const u32 p00 = key0[byte], p10 = key1[byte], p01 = key0[byte + 4], p11 = key1[byte + 4];
                        const u32 a_hi[4] = {k_halves[0][p00], k_halves[0][p10], k_halves[0][p01], k_halves[0][p11]};
                        const u32 a_lo[4] = {k_halves[1][p00], k_halves[1][p10], k_halves[1][p01], k_halves[1][p11]};
                        const uint2 q_hi = b_frags[0][b][kk][lane], q_lo = b_frags[1][b][kk][lane];
                        mma_16816(cd, a_hi, q_hi.x, q_hi.y);
                        mma_16816(cd, a_lo, q_hi.x, q_hi.y);
                        mma_16816(cd, a_hi, q_lo.x, q_lo.y);
                        if (kl.sketch) {
                            const u32 c = 16 * kk + 2 * tig;
                            const u32 a_s[4] = {tq_sign_pair(signs0, c), tq_sign_pair(signs1, c),
                                                tq_sign_pair(signs0, c + 8), tq_sign_pair(signs1, c + 8)};
                            const uint2 s_hi = b_frags[2][b][kk][lane], s_lo = b_frags[3][b][kk][lane];
                            mma_16816(sd, a_s, s_hi.x, s_hi.y);
                            mma_16816(sd, a_s, s_lo.x, s_lo.y);
                        }
                    }
                    const float norm0 = tq_half_at(key0, at), norm1 = tq_half_at(key1, at);
                    part[0] += norm0 * cd[0];
                    part[1] += norm0 * cd[1];
                    part[2] += norm1 * cd[2];
                    part[3] += norm1 * cd[3];
                    if (kl.sketch) {
                        const float alpha0 = sketch_factor * tq_half_at(key0, at + 2) * norm0;
                        const float alpha1 = sketch_factor * tq_half_at(key1, at + 2) * norm1;
                        part[0] += alpha0 * sd[0];
                        part[1] += alpha0 * sd[1];
                        part[2] += alpha1 * sd[2];
                        part[3] += alpha1 * sd[3];
                    }
                    const float* q0 = plain + 2 * tig * TQ_TILE_DIM + b * TQ_BLOCK;
#pragma unroll
                    for (u32 o = 0; o < TQ_OUTLIERS; ++o) {
                        const u32 slot = ks.index_bit + (b * TQ_OUTLIERS + o) * TQ_INDEX_BITS;
                        const u32 i0 = tq_index_at(k_staging.indices(key0), slot);
                        const u32 i1 = tq_index_at(k_staging.indices(key1), slot);
                        const float v0 = tq_half_at(key0, at + kl.header() + 2 * o);
                        const float v1 = tq_half_at(key1, at + kl.header() + 2 * o);
                        part[0] += v0 * q0[i0];
                        part[1] += v0 * q0[TQ_TILE_DIM + i0];
                        part[2] += v1 * q0[i1];
                        part[3] += v1 * q0[TQ_TILE_DIM + i1];
                    }
                }
                const u32 h0 = 2 * tig, h1 = h0 + 1;
                if (r0 < (u32)n) {
                    if (h0 < n_heads) scores[h0][r0] = part[0] * scale;
                    if (h1 < n_heads) scores[h1][r0] = part[1] * scale;
                }
                if (r1 < (u32)n) {
                    if (h0 < n_heads) scores[h0][r1] = part[2] * scale;
                    if (h1 < n_heads) scores[h1][r1] = part[3] * scale;
                }
            }
        } else
        // Scores: a thread per (key, block); the blocks of a key in neighbouring lanes.
        {
            const u32 j = tid / head_blocks, b = tid % head_blocks;
            float part_score[8];
#pragma unroll
            for (u32 g = 0; g < 8; ++g) part_score[g] = 0.0f;
            if (j < (u32)n) {
                const u8* key = keys + j * 4 * TQ_KEY_WORDS;
                const u32 at = k_staging.block_shift + b * k_block_bytes;
                const float norm = tq_half_at(key, at);
                const u32 codes = at + kl.code_offset();
                const float* q = rotated + b * TQ_QPAD;
                float dot[8];
#pragma unroll
                for (u32 g = 0; g < 8; ++g) dot[g] = 0.0f;
#pragma unroll 2
                for (u32 w = 0; w < 8; ++w) {  // key codes are 4 bits (tq3 keys too)
                    const u32 word = tq_word_at(key, codes + 4 * w);
#pragma unroll
                    for (u32 quad = 0; quad < 2; ++quad) {
                        const float2 c01 = k_pairs[word >> (16 * quad) & 255], c23 = k_pairs[word >> (16 * quad + 8) & 255];
#pragma unroll
                        for (u32 g = 0; g < 8; ++g) {
                            const float4 qv = *(const float4*)(q + g * 2 * TQ_QPAD + 8 * w + 4 * quad);
                            dot[g] += c01.x * qv.x + c01.y * qv.y + c23.x * qv.z + c23.y * qv.w;
                        }
                    }
                }
#pragma unroll
                for (u32 g = 0; g < 8; ++g) part_score[g] = norm * dot[g];
                if (kl.sketch) {  // sketched keys' blocks are 4-byte aligned
                    const float alpha = sketch_factor * tq_half_at(key, at + 2) * norm;
                    const u32* signs = (const u32*)(key + at + kl.sign_offset());
                    const u32 low = signs[0], high = signs[1];
                    const float* table = lut + b * TQ_LUT;
                    float negative[8];
#pragma unroll
                    for (u32 g = 0; g < 8; ++g) negative[g] = 0.0f;
#pragma unroll 4
                    for (u32 pos = 0; pos < 16; ++pos) {
                        const u32 v = (pos < 8 ? low >> (4 * pos) : high >> (4 * pos - 32)) & 15;
#pragma unroll
                        for (u32 g = 0; g < 8; ++g) negative[g] += table[(pos * 8 + g) * 16 + v];
                    }
#pragma unroll
                    for (u32 g = 0; g < 8; ++g) part_score[g] += alpha * (totals[b * 8 + g] - 2.0f * negative[g]);
                }
#pragma unroll
                for (u32 o = 0; o < TQ_OUTLIERS; ++o) {
                    const u32 index =
                        tq_index_at(k_staging.indices(key), ks.index_bit + (b * TQ_OUTLIERS + o) * TQ_INDEX_BITS);
                    const float v = tq_half_at(key, at + kl.header() + 2 * o);
#pragma unroll
                    for (u32 g = 0; g < 8; ++g) part_score[g] += v * plain[g * TQ_TILE_DIM + b * TQ_BLOCK + index];
                }
            }
            if (head_blocks == 2)
#pragma unroll
                for (u32 g = 0; g < 8; ++g) part_score[g] += __shfl_xor_sync(0xffffffffu, part_score[g], 1);
            if (j < (u32)n && b == 0)
#pragma unroll
                for (u32 g = 0; g < 8; ++g)
                    if (g < n_heads) scores[g][j] = part_score[g] * scale;
        }
        __syncthreads();
        // Online softmax: a warp per head, two keys a lane.
        for (u32 g = warp; g < n_heads; g += TQ_THREADS / 32) {
            const float s0 = (i32)lane < n ? scores[g][lane] : NEG_INF;
            const float s1 = (i32)lane + 32 < n ? scores[g][lane + 32] : NEG_INF;
            const float old_max = running_max[g];
            const float new_max = fmaxf(old_max, warp_max(fmaxf(s0, s1)));
            const float w0 = (i32)lane < n ? expf(s0 - new_max) : 0.0f;
            const float w1 = (i32)lane + 32 < n ? expf(s1 - new_max) : 0.0f;
            const float tile_sum = warp_sum(w0 + w1);
            weights[lane][g] = w0;
            weights[lane + 32][g] = w1;
            if (lane == 0) {
                const float factor = old_max == NEG_INF ? 0.0f : expf(old_max - new_max);
                rescale[g] = factor;
                running_sum[g] = running_sum[g] * factor + tile_sum;
                running_max[g] = new_max;
            }
        }
        __syncthreads();
        // Values in the rotated basis (norm x centroid, then each outlier's sign-flipped share,
        // as the tile decoder adds them), four coordinates a thread.
#pragma unroll
        for (u32 g = 0; g < 8; ++g) {
            const float factor = g < n_heads ? rescale[g] : 0.0f;
#pragma unroll
            for (u32 k = 0; k < 4; ++k) acc[g][k] *= factor;
        }
        for (u32 j = part; j < (u32)n; j += parts) {
            const u8* value = values + j * 4 * TQ_VALUE_WORDS;
            const u32 word = ((u32)value[code_byte] | (u32)value[code_byte + 1] << 8) >> code_shift;
            const float norm = value_norm[j][vb];
            const float2 c01 = v_pairs[word & pair_mask], c23 = v_pairs[word >> (2 * vl.bits) & pair_mask];
            float v[4] = {norm * c01.x, norm * c01.y, norm * c23.x, norm * c23.y};
#pragma unroll
            for (u32 o = 0; o < TQ_OUTLIERS; ++o) {
                const u32 index = value_index[j][vb][o];
                const u32 base = __popc(ve & index) & 1;
                const u32 outlier = __float_as_uint(value_outlier[j][vb][o]);
#pragma unroll
                for (u32 k = 0; k < 4; ++k) {
                    const u32 flip = (base ^ (__popc(k & index) & 1)) << 31;
                    v[k] += __uint_as_float(outlier ^ flip);
                }
            }
            const float4 w0 = *(const float4*)&weights[j][0], w1 = *(const float4*)&weights[j][4];
            const float p[8] = {w0.x, w0.y, w0.z, w0.w, w1.x, w1.y, w1.z, w1.w};
#pragma unroll
            for (u32 g = 0; g < 8; ++g)
#pragma unroll
                for (u32 k = 0; k < 4; ++k) acc[g][k] += p[g] * v[k];
        }
        __syncthreads();  // stage s is free for tile t + 2
    }
    // The key parts' sums added in part order, through the key stages (free now).
    float* sums = (float*)key_stage;  // 8 x head_dim floats
    for (u32 p = 1; p < parts; ++p) {
        if (part == p)
#pragma unroll
            for (u32 g = 0; g < 8; ++g)
#pragma unroll
                for (u32 k = 0; k < 4; ++k) sums[g * head_dim + 4 * quad + k] = acc[g][k];
        __syncthreads();
        if (part == 0)
#pragma unroll
            for (u32 g = 0; g < 8; ++g)
#pragma unroll
                for (u32 k = 0; k < 4; ++k) acc[g][k] += sums[g * head_dim + 4 * quad + k];
        __syncthreads();
    }
#pragma unroll
    for (u32 g = 0; g < 8; ++g) {
        if (g >= n_heads) break;
        const u64 at = ((u64)row * heads + hs.first + g) * chunks + chunk;
        if (part == 0)
            *(float4*)(part_acc + at * head_dim + 4 * quad) = make_float4(acc[g][0], acc[g][1], acc[g][2], acc[g][3]);
        if (tid == 0) {
            part_stats[2 * at] = running_max[g];
            part_stats[2 * at + 1] = running_sum[g];
        }
    }
}

// ---------------------------------------------------------------------------------------
// TurboQuant decode on the tensor cores (RUNIT_CUDA_TQ_DECODE=codes takes
// attention_decode_tq_codes instead): attention_decode_mma's shape over the codes. A block
// serves (chunk, KV head, slice of at most 8 query heads, row) with TQ_MMA_WARPS warps; each
// warp walks its own sub-tiles of 16 keys (positions begin + 16 (warp + TQ_MMA_WARPS i)),
// copying a sub-tile's key and value bytes as they lie in the cache rows (TqStaging) while the
// one before is computed. A sub-tile's keys are decoded once into f16 tiles in shared memory,
// the rotated basis's |x| c (centroid pairs looked up by code byte, times the block's norm)
// and, with the sketch, alpha (+-1) (alpha = sqrt(pi/2) / 64 |r| |x|, signs by nibble); the
// scores are R q against the first plus S R q against the second (mma.m16n8k16, the query
// heads as the 16 rows, rounded to f16 as the f16 cache's queries are), plus each key's
// outliers against the plain queries. After the online softmax (flash_softmax_step) the
// values are decoded into the same tile and summed by mma: |x| c plus their outliers rotated
// in as attention_decode_tq_codes adds them (R e_i v = H[., i] D_i v / 8: for coordinates
// 8 w + e, +-v / 8 times (-1)^parity(w & i >> 3) times row i & 7 of the 8-point Hadamard
// matrix). Partials as attention_decode_*'s; the last block of a (row, head slice) merges
// them into the output and rotates it back (tq_mma_merge): no combine kernel.
#define TQ_MMA_WARPS 4
#define TQ_MMA_THREADS (TQ_MMA_WARPS * 32)
#define TQ_MMA_SUB 16                 // keys of a warp's sub-tile
#define TQ_MMA_STRIDE (TQ_TILE_DIM + 8)  // halves of a decoded row (16-byte rows, no bank conflicts)
#define TQ_MMA_RAW (TQ_KEY_WORDS + TQ_VALUE_WORDS)  // words of a staged key and value
// Blocks a multiprocessor (plan::TURBO_MMA_BLOCKS_PER_MULTIPROCESSOR). A measuring knob
// (RUNIT_CUDA_DEFINES, with RUNIT_CUDA_TQ_CHUNKS): 3 caps the registers at 168, which spills.
#ifndef TQ_MMA_MIN_BLOCKS
#define TQ_MMA_MIN_BLOCKS 2
#endif
// Dynamic shared memory, in 4-byte words: the block's part, then each warp's.
#define TQM_QROT 0                                                // [8][TQ_MMA_STRIDE] f16: R q
#define TQM_QSKETCH (TQM_QROT + 4 * TQ_MMA_STRIDE)                // [8][TQ_MMA_STRIDE] f16: S R q
#define TQM_QPLAIN (TQM_QSKETCH + 4 * TQ_MMA_STRIDE)              // [8][TQ_TILE_DIM] f32: q
#define TQM_KPAIRS (TQM_QPLAIN + 8 * TQ_TILE_DIM)                 // [256] f16x2: key centroid pairs
#define TQM_VPAIRS (TQM_KPAIRS + 256)                             // [256] f16x2: value centroid pairs
#define TQM_SIGNS (TQM_VPAIRS + 256)                              // [16] 4 f16 of +-1 by nibble
#define TQM_H8 (TQM_SIGNS + 32)                                   // [8] 4 f16x2: rows of the 8-point Hadamard
#define TQM_WMAX (TQM_H8 + 32)                                    // [TQ_MMA_WARPS][8]
#define TQM_WSUM (TQM_WMAX + 8 * TQ_MMA_WARPS)                    // [TQ_MMA_WARPS][8]
#define TQM_WARPS (TQM_WSUM + 8 * TQ_MMA_WARPS)                   // first warp's part
#define TQMW_RAW 0                                                // [2][TQ_MMA_SUB][TQ_MMA_RAW]
#define TQMW_TILE (TQMW_RAW + 2 * TQ_MMA_SUB * TQ_MMA_RAW)        // [TQ_MMA_SUB][TQ_MMA_STRIDE] f16: keys, then values
#define TQMW_SKETCH (TQMW_TILE + TQ_MMA_SUB * TQ_MMA_STRIDE / 2)  // [TQ_MMA_SUB][TQ_MMA_STRIDE] f16: signs
#define TQMW_VOUT (TQMW_SKETCH + TQ_MMA_SUB * TQ_MMA_STRIDE / 2)  // [TQ_MMA_SUB][2][TQ_OUTLIERS]: index << 16 | f16 +-v/8
#define TQMW_BIAS (TQMW_VOUT + TQ_MMA_SUB * 2 * TQ_OUTLIERS)      // [TQ_MMA_SUB][8] f32: key outliers' scores
#define TQMW_WORDS (TQMW_BIAS + 8 * TQ_MMA_SUB)
#define TQ_MMA_SHARED_WORDS (TQM_WARPS + TQ_MMA_WARPS * TQMW_WORDS)  // plan::TURBO_MMA_SHARED_BYTES / 4
static_assert(TQMW_VOUT - TQMW_TILE >= 8 * TQ_TILE_DIM, "the merge reuses a warp's tiles");
// The step, the tables and the first two sub-tiles' rows are read before waiting for the
// kernel before (pdl_wait), where those rows lie before the first position this step writes
// (earlier steps wrote them). A measuring knob (RUNIT_CUDA_DEFINES): TQ_MMA_PRE_WAIT=0 waits
// first, as every kernel's pdl_start.
#ifndef TQ_MMA_PRE_WAIT
#define TQ_MMA_PRE_WAIT 1
#endif

__device__ __forceinline__ u32 hmul2(u32 a, u32 b) {
    u32 r;
    asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
    return r;
}
__device__ __forceinline__ u32 hfma2(u32 a, u32 b, u32 c) {
    u32 r;
    asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(c));
    return r;
}
// The 4 bytes of `bytes` (4-byte aligned) from byte `at` on, at any offset.
__device__ __forceinline__ u32 tq_bytes_at(const u8* bytes, u32 at) {
    const u32* words = (const u32*)(bytes + (at & ~3u));
    return __funnelshift_r(words[0], words[1], 8 * (at & 3));
}
__device__ __forceinline__ void store_shared_16(u32 address, u32 a, u32 b, u32 c, u32 d) {
    asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};" ::"r"(address), "r"(a), "r"(b), "r"(c), "r"(d) : "memory");
}

// The tensor-core kernels' shared tables, filled by a block's threads: the centroid pairs of
// the key and value codebooks by code byte (f16x2, `kpairs`/`vpairs`, 256 words each), the
// signs +-1 by nibble (`signs`: 16 x 4 f16) and the rows of the 8-point Hadamard matrix
// (`h8`: 8 x 4 f16x2, row r's entries 2 k and 2 k + 1 (-1)^parity(e & r) in word 4 r + k).
template <u32 THREADS>
__device__ __forceinline__ void tq_mma_tables(u32* kpairs, u32* vpairs, u32* signs, u32* h8, const TqLayout& kl,
                                              const TqLayout& vl, const float* tables) {
    const u32 tid = threadIdx.x;
    for (u32 i = tid; i < 256; i += THREADS) {
        const float* kc = kl.centroids(tables);
        const float* vc = vl.centroids(tables);
        const u32 km = (1u << kl.bits) - 1, vm = (1u << vl.bits) - 1;
        kpairs[i] = pack_half2(kc[i & km], kc[i >> kl.bits & km]);
        vpairs[i] = pack_half2(vc[i & vm], vc[i >> vl.bits & vm]);
    }
    const u32 one = 0x3c00u, minus = 0xbc00u;
    if (tid < 16) {
        signs[2 * tid] = (tid & 1 ? minus : one) | (tid & 2 ? minus : one) << 16;
        signs[2 * tid + 1] = (tid & 4 ? minus : one) | (tid & 8 ? minus : one) << 16;
    }
    if (tid < 32) {
        const u32 r = tid / 4, e = 2 * (tid % 4);
        h8[tid] = (__popc(e & r) & 1 ? minus : one) | (__popc((e + 1) & r) & 1 ? minus : one) << 16;
    }
}

// 8 coordinates' |x| c as 4 f16x2 pairs: `codes` holds their 8 codes of `bits` bits from bit
// 0, looked up two at a time in `pairs`, times the block's norm (f16 bits).
__device__ __forceinline__ void tq_centroids8(u32 (&w)[4], const u32* pairs, u32 codes, u32 bits, u32 norm) {
    const u32 norms = norm | norm << 16, pair_bits = 2 * bits, mask = (1u << pair_bits) - 1;
#pragma unroll
    for (u32 k = 0; k < 4; ++k) w[k] = hmul2(pairs[codes >> k * pair_bits & mask], norms);
}

// An outlier of a block for tq_add_outliers: its index and R's sign times v / 8, as f16.
__device__ __forceinline__ u32 tq_outlier_word(u32 index, float v, u64 rotation) {
    const float x = v * 0.125f;
    return index << 16 | float_to_half(rotation >> index & 1 ? -x : x);
}

// Adds a block's outliers (TQ_OUTLIERS words of tq_outlier_word) rotated, R e_i v = H[., i]
// D_i v / 8, to the pairs of coordinates 8 within + e: +-v / 8 times (-1)^parity(within &
// i >> 3) times row i & 7 of the 8-point Hadamard matrix (`h8`, tq_mma_tables).
__device__ __forceinline__ void tq_add_outliers(u32 (&w)[4], const u32* outliers, u32 within, const u32* h8) {
#pragma unroll
    for (u32 o = 0; o < TQ_OUTLIERS; ++o) {
        const u32 outlier = outliers[o], index = outlier >> 16;
        const u32 half = (outlier & 0xffffu) ^ (__popc(within & index >> 3) & 1) << 15;
        const u32 halves = half | half << 16;
        const uint4 row = *(const uint4*)(h8 + 4 * (index & 7));
        w[0] = hfma2(row.x, halves, w[0]);
        w[1] = hfma2(row.y, halves, w[1]);
        w[2] = hfma2(row.z, halves, w[2]);
        w[3] = hfma2(row.w, halves, w[3]);
    }
}

// A warp's copies of 16 keys' and values' words of one KV head (TqStaging's, a word a lane)
// into TQ_MMA_RAW words each by cp.async: key j's cell in lane j's `cell` (-1: zeros, which
// decode to zeros).
struct TqRowStager {
    const u8 *k_cache, *v_cache;
    u64 k_row_bytes, v_row_bytes;
    u32 k_offset, v_offset;  // this lane's word of a row (~0u: none)
    __device__ __forceinline__ void stage16(u32* rows, i32 cell, u32 lane) const {
#pragma unroll 4
        for (u32 j = 0; j < 16; ++j) {
            const i32 c = __shfl_sync(0xffffffffu, cell, j);
            u32* row = rows + j * TQ_MMA_RAW;
            if (c >= 0) {
                if (k_offset != ~0u) cp_async4(shared_address(row + lane), k_cache + (u64)c * k_row_bytes + k_offset);
                if (v_offset != ~0u)
                    cp_async4(shared_address(row + TQ_KEY_WORDS + lane), v_cache + (u64)c * v_row_bytes + v_offset);
            } else {
                if (lane < TQ_KEY_WORDS) row[lane] = 0u;
                if (lane < TQ_VALUE_WORDS) row[TQ_KEY_WORDS + lane] = 0u;
            }
        }
    }
};

// The sketch's alpha (+-1) of 8 coordinates (sign bits `byte`, looked up by nibble in
// `signs`) as 4 f16x2 pairs, stored at shared address `address`.
__device__ __forceinline__ void tq_store_signs8(u32 address, const u32* signs, u32 byte, float alpha) {
    const u32 alphas = pack_half2(alpha, alpha);
    const u32* low = signs + 2 * (byte & 15);
    const u32* high = signs + 2 * (byte >> 4);
    store_shared_16(address, hmul2(low[0], alphas), hmul2(low[1], alphas), hmul2(high[0], alphas),
                    hmul2(high[1], alphas));
}

// R^T x = D H x / 8 (the inverse of tq_warp_rotate) of the 64 values a warp holds, in place.
__device__ __forceinline__ void tq_warp_unrotate(float& x0, float& x1, u32 block, u32 lane) {
    tq_warp_hadamard(x0, x1, lane);
    const u64 rotation = tq_signs(block, 0);
    x0 *= 0.125f;
    x1 *= 0.125f;
    if (rotation >> lane & 1) x0 = -x0;
    if (rotation >> (lane + 32) & 1) x1 = -x1;
}

// The last block of a (row, head slice) of attention_decode_tq_mma_*: merges the slice's `n`
// chunk partials (rotated basis) into `out`, rotated back, as attention_combine does (each
// chunk's weight exp(m_c - max) / sum_c(s_c exp(m_c - max)), then the weighted values). Its
// dynamic shared memory is free: the weights, then the merged rows.
template <int D>
__device__ __forceinline__ void tq_mma_merge(float* out, const float* part_acc, const float* part_stats, i32 row,
                                          u32 heads, const HeadSlice& hs, u32 chunks, u32 n, u32 first_block) {
    extern __shared__ __align__(16) float tqm_shared[];
    const u32 tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    float* weights = tqm_shared;                                  // [hs.count][n]
    float* merged = tqm_shared + (hs.count * n + 3) / 4 * 4;  // [hs.count][D]
    const u64 first_part = ((u64)row * heads + hs.first) * chunks;
    for (u32 hq = warp; hq < hs.count; hq += TQ_MMA_WARPS) {
        const float* stats = part_stats + 2 * (first_part + hq * chunks);
        float max_all = NEG_INF;
        for (u32 c = lane; c < n; c += 32) max_all = fmaxf(max_all, __ldcg(stats + 2 * c));
        max_all = warp_max(max_all);
        float total = 0.0f;
        for (u32 c = lane; c < n; c += 32) {
            const float weight = expf(__ldcg(stats + 2 * c) - max_all);
            weights[hq * n + c] = weight;
            total += __ldcg(stats + 2 * c + 1) * weight;
        }
        total = warp_sum(total);
        const float inverse = total == 0.0f ? 0.0f : 1.0f / total;
        for (u32 c = lane; c < n; c += 32) weights[hq * n + c] *= inverse;
    }
    __syncthreads();
    // A thread per (head, 4 coordinates), at most TASKS of them (8 heads at most), summed
    // together so that both tasks' loads of many chunks are in flight at once.
    constexpr u32 TASKS = (8 * (D / 4) + TQ_MMA_THREADS - 1) / TQ_MMA_THREADS;
    const float4* acc_c[TASKS];
    const float* w[TASKS];
    float4 value[TASKS];
#pragma unroll
    for (u32 k = 0; k < TASKS; ++k) {
        const u32 i = min(tid + k * TQ_MMA_THREADS, hs.count * (D / 4) - 1);  // past the end: a copy
        const u32 hq = i / (D / 4), d = 4 * (i % (D / 4));
        acc_c[k] = (const float4*)(part_acc + (first_part + hq * chunks) * D + d);
        w[k] = weights + hq * n;
        value[k] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
#pragma unroll 8
    for (u32 c = 0; c < n; ++c) {
#pragma unroll
        for (u32 k = 0; k < TASKS; ++k) {
            const float4 a = __ldcg(acc_c[k] + (u64)c * (D / 4));
            const float wc = w[k][c];
            value[k].x += a.x * wc;
            value[k].y += a.y * wc;
            value[k].z += a.z * wc;
            value[k].w += a.w * wc;
        }
    }
#pragma unroll
    for (u32 k = 0; k < TASKS; ++k) {
        const u32 i = tid + k * TQ_MMA_THREADS;
        if (i < hs.count * (D / 4)) *(float4*)(merged + i / (D / 4) * D + 4 * (i % (D / 4))) = value[k];
    }
    __syncthreads();
    for (u32 task = warp; task < hs.count * (D / TQ_BLOCK); task += TQ_MMA_WARPS) {
        const u32 hq = task / (D / TQ_BLOCK), b = task % (D / TQ_BLOCK);
        const float* x = merged + hq * D + b * TQ_BLOCK;
        float r0 = x[lane], r1 = x[lane + 32];
        tq_warp_unrotate(r0, r1, first_block + b, lane);
        float* o = out + ((u64)row * heads + hs.first + hq) * D + b * TQ_BLOCK;
        o[lane] = r0;
        o[lane + 32] = r1;
    }
}

template <int D>
__device__ __forceinline__ void decode_tq_mma(const u8* k_cache, const u8* v_cache, const i32* step, const float* q,
                                              const float* tables, float* out, float* part_acc, float* part_stats,
                                              u32 heads, u32 kv_heads, float scale, u32 window, u32 chunks,
                                              u32 heads_per_block, u32 turbo, u32* counters) {
    static_assert(D % TQ_BLOCK == 0 && D <= TQ_TILE_DIM, "heads of whole blocks, at most TQ_TILE_DIM");
    constexpr u32 BLOCKS = D / TQ_BLOCK, GROUPS = D / 8;  // blocks of a head, groups of 8 coordinates
    extern __shared__ __align__(16) float tqm_shared[];
    u32 shared_bytes;
    asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(shared_bytes));
    if (shared_bytes < 4 * TQ_MMA_SHARED_WORDS) __trap();  // plan::TURBO_MMA_SHARED_BYTES disagrees
    u32* words = (u32*)tqm_shared;
    const u32 tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;

    const StepHeader* h = (const StepHeader*)step;
    const i32 row = blockIdx.z;
    const DecodeRange range(step, row, blockIdx.x, window, 0, chunks);
    if (range.begin >= range.end) return;  // attention_combine skips these chunks
    const i32 span = range.span, begin = range.begin, end = range.end;
    const HeadSlice hs(heads, kv_heads, heads_per_block, blockIdx.y);
    const TqLayout kl = tq_key_layout(turbo), vl = tq_value_layout(turbo);
    const u32 first_block = hs.kv_head * BLOCKS, row_blocks = kv_heads * BLOCKS;
    const TqSlice ks = tq_slice(kl, row_blocks, first_block, BLOCKS);
    const TqSlice vs = tq_slice(vl, row_blocks, first_block, BLOCKS);
    const TqStaging k_staging(ks, lane), v_staging(vs, lane);
    const u32 kbb = kl.block_bytes(), vbb = vl.block_bytes();

    u32* warp_words = words + TQM_WARPS + warp * TQMW_WORDS;
    u32* raw = warp_words + TQMW_RAW;
    u32* value_outliers = warp_words + TQMW_VOUT;
    float(*bias)[8] = (float(*)[8])(warp_words + TQMW_BIAS);
    const u32 tile_at = shared_address(warp_words + TQMW_TILE), sketch_at = shared_address(warp_words + TQMW_SKETCH);
    const float* qplain = tqm_shared + TQM_QPLAIN;

    // The cell of key `lane` of the sub-tile at `sub` (lanes 0-15; -1 past `end`).
    auto sub_cell = [&](i32 sub) {
        const i32 position = sub + (i32)lane;
        return lane < TQ_MMA_SUB && position < end ? step_cell(step, h, span, position) : -1;
    };
    // Stage sub-tile `sub`'s raw key and value bytes (key j's cell in lane j's `cell`) into
    // stage `s` (rows past `end`: zeros, so that they decode to zeros).
    const TqRowStager stager{k_cache, v_cache, ks.row_bytes, vs.row_bytes, k_staging.lane_offset, v_staging.lane_offset};
    auto stage = [&](i32 cell, u32 s) { stager.stage16(raw + s * TQ_MMA_SUB * TQ_MMA_RAW, cell, lane); };
    i32 sub = begin + (i32)warp * TQ_MMA_SUB;
    const i32 step_keys = TQ_MMA_WARPS * TQ_MMA_SUB;
    // The first two sub-tiles' rows, before the wait where an earlier step wrote them all
    // (the kernel before may be writing this step's: from the span's start position on).
    auto stage_first = [&]() {
        if (sub < end) stage(sub_cell(sub), 0);
        cp_async_commit();
        if (sub + step_keys < end) stage(sub_cell(sub + step_keys), 1);
        cp_async_commit();
    };
    const i32 written = step[h->span_info + 4 * span + 2];
    const bool early = !TQ_MMA_PRE_WAIT || min(sub + 2 * step_keys, end) <= written;
    if (early) stage_first();

    // The tables, the queries (a warp per (query head, block): plain, R q = H D q / 8 and
    // S R q = H D' R q, as tq_prepare_query), this warp's outlier accumulator.
    tq_mma_tables<TQ_MMA_THREADS>(words + TQM_KPAIRS, words + TQM_VPAIRS, words + TQM_SIGNS, words + TQM_H8, kl, vl, tables);
    if (TQ_MMA_PRE_WAIT) pdl_wait();  // the queries, this step's rows
    if (!early) stage_first();
    // A warp's tasks (query head, block): every value loaded first (all in flight), then each
    // task rotated and sketched.
    constexpr u32 TASKS = 8 * BLOCKS / TQ_MMA_WARPS;
    float values[TASKS][2];
#pragma unroll
    for (u32 i = 0; i < TASKS; ++i) {
        const u32 task = warp + i * TQ_MMA_WARPS, hq = task / BLOCKS, d0 = task % BLOCKS * TQ_BLOCK + lane;
        const float* query = hq < hs.count ? q + ((u64)row * heads + hs.first + hq) * D : nullptr;
        values[i][0] = query ? query[d0] : 0.0f;
        values[i][1] = query ? query[d0 + 32] : 0.0f;
    }
#pragma unroll
    for (u32 i = 0; i < TASKS; ++i) {
        const u32 task = warp + i * TQ_MMA_WARPS;
        const u32 hq = task / BLOCKS, b = task % BLOCKS, d0 = b * TQ_BLOCK + lane, d1 = d0 + 32;
        const float x0 = values[i][0], x1 = values[i][1];
        tqm_shared[TQM_QPLAIN + hq * TQ_TILE_DIM + d0] = x0;
        tqm_shared[TQM_QPLAIN + hq * TQ_TILE_DIM + d1] = x1;
        float r0 = x0, r1 = x1;
        tq_warp_rotate(r0, r1, first_block + b, lane);
        u16* qrot = (u16*)(words + TQM_QROT) + hq * TQ_MMA_STRIDE;
        qrot[d0] = float_to_half(r0);
        qrot[d1] = float_to_half(r1);
        float s0 = r0, s1 = r1;
        tq_warp_sketch(s0, s1, first_block + b, lane);
        u16* qsketch = (u16*)(words + TQM_QSKETCH) + hq * TQ_MMA_STRIDE;
        qsketch[d0] = float_to_half(s0);
        qsketch[d1] = float_to_half(s1);
    }
    __syncthreads();

    // A fragments of the warp's 16 rows: query heads g (rows g + 8 are zero).
    u32 qa[D / 16][4], qs[D / 16][4];
    {
        const u32* qrot = words + TQM_QROT + g * TQ_MMA_STRIDE / 2;
        const u32* qsketch = words + TQM_QSKETCH + g * TQ_MMA_STRIDE / 2;
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) {
            qa[kk][0] = qrot[kk * 8 + t];
            qa[kk][2] = qrot[kk * 8 + t + 4];
            qs[kk][0] = qsketch[kk * 8 + t];
            qs[kk][2] = qsketch[kk * 8 + t + 4];
            qa[kk][1] = qa[kk][3] = qs[kk][1] = qs[kk][3] = 0u;
        }
    }
    const float scale_log2 = scale * LOG2E, sketch_factor = tables[TQ_SKETCH_FACTOR];
    float running_max[2] = {NEG_INF, NEG_INF}, sum[2] = {0.0f, 0.0f};
    float acc[D / 8][4];
#pragma unroll
    for (int n = 0; n < D / 8; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;

    for (u32 s = 0; sub < end; sub += step_keys, s ^= 1) {
        cp_async_wait<1>();  // this sub-tile's bytes
        __syncwarp();
        const u8* keys = (const u8*)(raw + s * TQ_MMA_SUB * TQ_MMA_RAW);
        // Keys into the tiles: a lane per (key, group of 8 coordinates), 8 each.
#pragma unroll 2
        for (u32 unit = lane; unit < TQ_MMA_SUB * GROUPS; unit += 32) {
            const u32 j = unit / GROUPS, group = unit % GROUPS, b = group / 8, within = group % 8;
            const u8* key = keys + j * 4 * TQ_MMA_RAW;
            const u32 at = k_staging.block_shift + b * kbb;
            const u32 norm = tq_word_at(key, at) & 0xffffu;
            u32 w[4];
            tq_centroids8(w, words + TQM_KPAIRS, tq_word_at(key, at + kl.code_offset() + 4 * within), 4, norm);
            store_shared_16(tile_at + (j * TQ_MMA_STRIDE + 8 * group) * 2, w[0], w[1], w[2], w[3]);
            if (kl.sketch) {
                const float alpha = sketch_factor * tq_half_at(key, at + 2) * half_to_float((u16)norm);
                tq_store_signs8(sketch_at + (j * TQ_MMA_STRIDE + 8 * group) * 2, words + TQM_SIGNS,
                                key[at + kl.sign_offset() + within], alpha);
            }
        }
        // Each key's outliers against the plain queries: a lane per (key, block).
        {
            float part[8];
#pragma unroll
            for (u32 hq = 0; hq < 8; ++hq) part[hq] = 0.0f;
            const u32 j = lane / BLOCKS, b = lane % BLOCKS;
            if (j < TQ_MMA_SUB) {
                const u8* key = keys + j * 4 * TQ_MMA_RAW;
                const u32 at = k_staging.block_shift + b * kbb;
#pragma unroll
                for (u32 o = 0; o < TQ_OUTLIERS; ++o) {
                    const u32 index = tq_index_at(k_staging.indices(key), ks.index_bit + (b * TQ_OUTLIERS + o) * TQ_INDEX_BITS);
                    const float v = tq_half_at(key, at + kl.header() + 2 * o);
#pragma unroll
                    for (u32 hq = 0; hq < 8; ++hq) part[hq] += v * qplain[hq * TQ_TILE_DIM + b * TQ_BLOCK + index];
                }
            }
#pragma unroll
            for (u32 hq = 0; hq < 8; ++hq) {
                if (BLOCKS == 2) part[hq] += __shfl_xor_sync(0xffffffffu, part[hq], 1);
                if (j < TQ_MMA_SUB && b == 0) bias[j][hq] = part[hq];
            }
            // The value's outliers of this (key, block) for the value tile: index and D_i v / 8.
            if (j < TQ_MMA_SUB) {
                const u8* value = keys + j * 4 * TQ_MMA_RAW + 4 * TQ_KEY_WORDS;
                const u32 at = v_staging.block_shift + b * vbb;
                const u64 rotation = tq_signs(first_block + b, 0);
#pragma unroll
                for (u32 o = 0; o < TQ_OUTLIERS; ++o) {
                    const u32 index =
                        tq_index_at(v_staging.indices(value), vs.index_bit + (b * TQ_OUTLIERS + o) * TQ_INDEX_BITS);
                    value_outliers[(j * 2 + b) * TQ_OUTLIERS + o] =
                        tq_outlier_word(index, tq_half_at(value, at + vl.header() + 2 * o), rotation);
                }
            }
        }
        __syncwarp();
        // Scores: R q against the centroid tile, S R q against the sign tile.
        float sc[2][4];
#pragma unroll
        for (int n = 0; n < 2; ++n) sc[n][0] = sc[n][1] = sc[n][2] = sc[n][3] = 0.0f;
        {
            const u32 i = lane >> 3, r = lane & 7;
#pragma unroll
            for (int kk = 0; kk < D / 16; ++kk) {
                const u32 offset = (((i >> 1) * 8 + r) * TQ_MMA_STRIDE + kk * 16 + (i & 1) * 8) * 2;
                u32 b[4];
                load_matrix_x4(b, tile_at + offset);
                mma_16816(sc[0], qa[kk], b[0], b[1]);
                mma_16816(sc[1], qa[kk], b[2], b[3]);
                if (kl.sketch) {
                    load_matrix_x4(b, sketch_at + offset);
                    mma_16816(sc[0], qs[kk], b[0], b[1]);
                    mma_16816(sc[1], qs[kk], b[2], b[3]);
                }
            }
        }
#pragma unroll
        for (int n = 0; n < 2; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const u32 j = n * 8 + 2 * t + (e & 1);
                sc[n][e] = e < 2 && sub + (i32)j < end ? (sc[n][e] + bias[j][g]) * scale_log2 : NEG_INF;
            }
        u32 p[1][4];
        flash_softmax_step<2, D / 8>(sc, running_max, sum, acc, p);
        __syncwarp();  // the key tile is read
        // Values into the tile: |x| c, plus the outliers rotated in (8 coordinates d = 8 within
        // + e: +-v / 8 times (-1)^parity(within & i >> 3) times row i & 7 of the 8-point H).
#pragma unroll 2
        for (u32 unit = lane; unit < TQ_MMA_SUB * GROUPS; unit += 32) {
            const u32 j = unit / GROUPS, group = unit % GROUPS, b = group / 8, within = group % 8;
            const u8* value = keys + j * 4 * TQ_MMA_RAW + 4 * TQ_KEY_WORDS;
            const u32 at = v_staging.block_shift + b * vbb;
            u32 w[4];
            tq_centroids8(w, words + TQM_VPAIRS, tq_bytes_at(value, at + vl.code_offset() + vl.bits * within),
                          vl.bits, tq_word_at(value, at) & 0xffffu);
            tq_add_outliers(w, value_outliers + (j * 2 + b) * TQ_OUTLIERS, within, words + TQM_H8);
            store_shared_16(tile_at + (j * TQ_MMA_STRIDE + 8 * group) * 2, w[0], w[1], w[2], w[3]);
        }
        __syncwarp();
        flash_accumulate<D, TQ_MMA_STRIDE, 1>(acc, p, tile_at);
        __syncwarp();  // stage s and the tile are free
        if (sub + 2 * step_keys < end) stage(sub_cell(sub + 2 * step_keys), s);
        cp_async_commit();
    }
    cp_async_wait<0>();
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        sum[r] += __shfl_xor_sync(0xffffffffu, sum[r], 1);
        sum[r] += __shfl_xor_sync(0xffffffffu, sum[r], 2);
    }

    // Merge the warps: a common max per head; each warp's accumulator rescaled into its tiles'
    // space.
    float* wmax = tqm_shared + TQM_WMAX;
    float* wsum = tqm_shared + TQM_WSUM;
    if (t == 0) {
        wmax[warp * 8 + g] = running_max[0];
        wsum[warp * 8 + g] = sum[0];
    }
    __syncthreads();
    float block_max = NEG_INF;
#pragma unroll
    for (int w = 0; w < TQ_MMA_WARPS; ++w) block_max = fmaxf(block_max, wmax[w * 8 + g]);
    {
        const float f = fast_exp2(running_max[0] - (block_max == NEG_INF ? 0.0f : block_max));
        float* merged = (float*)(warp_words + TQMW_TILE) + g * D + 2 * t;
#pragma unroll
        for (int n = 0; n < D / 8; ++n) *(float2*)(merged + n * 8) = make_float2(acc[n][0] * f, acc[n][1] * f);
    }
    __syncthreads();
    for (u32 i = tid; i < hs.count * D; i += TQ_MMA_THREADS) {
        const u32 hq = i / D, d = i % D;
        float head_max = NEG_INF;
#pragma unroll
        for (int w = 0; w < TQ_MMA_WARPS; ++w) head_max = fmaxf(head_max, wmax[w * 8 + hq]);
        const float base = head_max == NEG_INF ? 0.0f : head_max;
        float total = 0.0f, value = 0.0f;
#pragma unroll
        for (int w = 0; w < TQ_MMA_WARPS; ++w) {
            total += wsum[w * 8 + hq] * fast_exp2(wmax[w * 8 + hq] - base);
            value += ((float*)(words + TQM_WARPS + w * TQMW_WORDS + TQMW_TILE))[hq * D + d];
        }
        const u64 part = ((u64)row * heads + hs.first + hq) * chunks + blockIdx.x;
        part_acc[part * D + d] = value;
        if (d == 0) {
            part_stats[2 * part] = base * LN2;  // natural-log units, as attention_combine reads them
            part_stats[2 * part + 1] = total;
        }
    }

    // Publish this block's partials, then count it: the last of the (row, head slice)'s chunks
    // to finish (counted in counters[row][blockIdx.y], zero at rest: that block resets it)
    // merges them into `out` as attention_combine would, so no combine kernel follows.
    __threadfence();
    __syncthreads();
    __shared__ bool last_block;
    const i32 position = step[h->positions + row], lo = first_visible(position, window);
    const u32 n = (u32)(position - lo) / (u32)row_chunk_len(position + 1 - lo, chunks) + 1;  // chunks with keys
    if (tid == 0) {
        u32* counter = counters + (u64)row * gridDim.y + blockIdx.y;
        const u32 done = atomicAdd(counter, 1u);
        last_block = done == n - 1;
        if (last_block) *counter = 0u;  // every other block of the slice has counted
    }
    __syncthreads();
    if (!last_block) return;
    __threadfence();
    tq_mma_merge<D>(out, part_acc, part_stats, row, heads, hs, chunks, n, first_block);
}

// Launch: grid (chunks, kv_heads * slices, rows), TQ_MMA_THREADS threads, TQ_MMA_SHARED_WORDS
// words of dynamic shared memory; chunk_len 0 (row_chunk_len); heads_per_block <= 8.
#define TQ_MMA_KERNEL(name, d)                                                                                  \
    extern "C" __global__ void __launch_bounds__(TQ_MMA_THREADS, TQ_MMA_MIN_BLOCKS)                            \
        name(const u8* k_cache, const u8* v_cache, const i32* step, const float* q, const float* tables,        \
             float* out, float* part_acc, float* part_stats, u32 heads, u32 kv_heads, float scale, u32 window,  \
             u32 chunks, u32 heads_per_block, u32 turbo, u32* counters) {                                       \
        pdl_launch_dependents();                                                                                \
        if (!TQ_MMA_PRE_WAIT) pdl_wait();                                                                       \
        decode_tq_mma<d>(k_cache, v_cache, step, q, tables, out, part_acc, part_stats, heads, kv_heads, scale,  \
                         window, chunks, heads_per_block, turbo, counters);                                     \
    }
TQ_MMA_KERNEL(attention_decode_tq_mma_d64, 64)
TQ_MMA_KERNEL(attention_decode_tq_mma_d128, 128)

// ---------------------------------------------------------------------------------------
// TurboQuant prefill on the tensor cores: attention_prefill_mma's flash-attention 2 over the
// codes. A block serves (tile of 64 query rows of one span, head) with TQ_MMA_WARPS warps of
// 16 rows each. The warps rotate their rows (R q and S R q as f16 rows); each 64-key tile's
// key and value words are staged by cp.async one tile ahead (TqRowStager) and decoded once
// per block into f16 tiles in the rotated basis: keys |x| c plus their outliers rotated in
// (tq_add_outliers), the sketch's alpha (+-1) beside them, values |x| c plus theirs. Scores
// R q · K + S R q · (alpha s) and P · V on mma.m16n8k16 with the online softmax
// (flash_mma.cuh); each output row is rotated back (R^T) into `out`.
#define TQP_KEYS 64                                           // keys of a tile (query rows of a block alike)
#define TQP_ROW (TQ_MMA_STRIDE / 2)                           // words of an f16 tile row
// Dynamic shared memory, in 4-byte words:
#define TQP_QSKETCH 0                                         // [64][TQP_ROW]: S R q rows
#define TQP_KTILE (TQP_QSKETCH + TQP_KEYS * TQP_ROW)          // [64][TQP_ROW]: keys (first the R q rows)
#define TQP_STILE (TQP_KTILE + TQP_KEYS * TQP_ROW)            // [64][TQP_ROW]: alpha (+-1)
#define TQP_VTILE (TQP_STILE + TQP_KEYS * TQP_ROW)            // [64][TQP_ROW]: values
#define TQP_RAW (TQP_VTILE + TQP_KEYS * TQP_ROW)              // [2][64][TQ_MMA_RAW]: staged words
#define TQP_KOUT (TQP_RAW + 2 * TQP_KEYS * TQ_MMA_RAW)         // [64][2][TQ_OUTLIERS]: tq_outlier_word
#define TQP_VOUT (TQP_KOUT + TQP_KEYS * 2 * TQ_OUTLIERS)       // the same for the values
#define TQP_KPAIRS (TQP_VOUT + TQP_KEYS * 2 * TQ_OUTLIERS)     // tq_mma_tables
#define TQP_VPAIRS (TQP_KPAIRS + 256)
#define TQP_SIGNS (TQP_VPAIRS + 256)
#define TQP_H8 (TQP_SIGNS + 32)
#define TQP_SHARED_WORDS (TQP_H8 + 32)  // plan::TURBO_PREFILL_SHARED_BYTES / 4
static_assert(2 * TQP_KEYS * TQP_ROW >= TQP_KEYS * TQ_TILE_DIM, "the output rows fit the key and sign tiles");
static_assert(TQ_MMA_WARPS * 16 == TQP_KEYS, "a block's query rows (plan::MMA_QUERY_TILE)");
static_assert(TQP_H8 % 4 == 0, "the Hadamard rows are read as 16 bytes");

template <int D>
__device__ __forceinline__ void prefill_tq_mma(const u8* k_cache, const u8* v_cache, const i32* step, const float* q,
                                               const float* tables, float* out, u32 heads, u32 kv_heads, float scale,
                                               u32 window, u32 turbo) {
    static_assert(D % TQ_BLOCK == 0 && D <= TQ_TILE_DIM, "heads of whole blocks, at most TQ_TILE_DIM");
    constexpr u32 BLOCKS = D / TQ_BLOCK, GROUPS = D / 8;
    extern __shared__ __align__(16) float tqp_shared[];
    u32 shared_bytes;
    asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(shared_bytes));
    if (shared_bytes < 4 * TQP_SHARED_WORDS) __trap();  // plan::TURBO_PREFILL_SHARED_BYTES disagrees
    u32* words = (u32*)tqp_shared;
    __shared__ i32 warp_begin[TQ_MMA_WARPS], warp_end[TQ_MMA_WARPS];
    const u32 tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;

    const StepHeader* h = (const StepHeader*)step;
    // This block's span and tile; the last tiles (the longest rows) start first.
    const PrefillTile tile_of(step, gridDim.x - 1 - blockIdx.x, TQP_KEYS);
    const i32 span = tile_of.span, span_end = tile_of.span_end;
    if (span < 0) return;  // block-uniform
    const u32 head = blockIdx.y, kv_head = head / (heads / kv_heads);
    const i32 warp_first = tile_of.first_row + (i32)(warp * 16);
    const MmaPrefillRows rr(step, warp_first, span_end, window);
    if (lane == 0) {
        warp_begin[warp] = rr.begin;
        warp_end[warp] = rr.end;
    }
    const TqLayout kl = tq_key_layout(turbo), vl = tq_value_layout(turbo);
    const u32 first_block = kv_head * BLOCKS, row_blocks = kv_heads * BLOCKS;
    const TqSlice ks = tq_slice(kl, row_blocks, first_block, BLOCKS);
    const TqSlice vs = tq_slice(vl, row_blocks, first_block, BLOCKS);
    const TqStaging k_staging(ks, lane), v_staging(vs, lane);
    const u32 kbb = kl.block_bytes(), vbb = vl.block_bytes();
    tq_mma_tables<TQ_MMA_THREADS>(words + TQP_KPAIRS, words + TQP_VPAIRS, words + TQP_SIGNS, words + TQP_H8, kl, vl,
                                  tables);

    // The warp's rows rotated (zeros past the span): R q into the key tile's rows, S R q into
    // TQP_QSKETCH, as f16; the R q rows become the A fragments. Eight (row, block) tasks at a
    // time, their values loaded first (all in flight).
    constexpr u32 TASKS = 8;
    for (u32 first = 0; first < 16 * BLOCKS; first += TASKS) {
        float values[TASKS][2];
#pragma unroll
        for (u32 i = 0; i < TASKS; ++i) {
            const u32 task = first + i, b = task % BLOCKS;
            const i32 row = warp_first + (i32)(task / BLOCKS);
            const float* query = row < span_end ? q + ((u64)row * heads + head) * D + b * TQ_BLOCK : nullptr;
            values[i][0] = query ? query[lane] : 0.0f;
            values[i][1] = query ? query[lane + 32] : 0.0f;
        }
#pragma unroll
        for (u32 i = 0; i < TASKS; ++i) {
            const u32 task = first + i, r = task / BLOCKS, b = task % BLOCKS;
            const u32 at = (warp * 16 + r) * TQ_MMA_STRIDE + b * TQ_BLOCK;
            float x0 = values[i][0], x1 = values[i][1];
            tq_warp_rotate(x0, x1, first_block + b, lane);
            u16* rotated = (u16*)(words + TQP_KTILE) + at;
            rotated[lane] = float_to_half(x0);
            rotated[lane + 32] = float_to_half(x1);
            if (kl.sketch) {
                tq_warp_sketch(x0, x1, first_block + b, lane);
                u16* sketched = (u16*)(words + TQP_QSKETCH) + at;
                sketched[lane] = float_to_half(x0);
                sketched[lane + 32] = float_to_half(x1);
            }
        }
    }
    __syncwarp();
    // Lane l addresses row l & 15 and column 8 (l >> 4) of each 16 x 16 A tile.
    const u32 a_offset = ((warp * 16 + (lane & 15)) * TQ_MMA_STRIDE + (lane >> 4) * 8) * 2;
    u32 query[D / 16][4];
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) load_matrix_x4(query[kk], shared_address(words + TQP_KTILE) + a_offset + kk * 32);
    __syncthreads();  // the warps' ranges; every R q row is read before the first keys land
    const int2 block_range = mma_block_range<TQ_MMA_WARPS>(warp_begin, warp_end);
    const i32 block_begin = block_range.x, block_end = block_range.y;
    if (block_begin >= block_end) return;  // block-uniform (no valid row)

    const TqRowStager stager{k_cache, v_cache, ks.row_bytes, vs.row_bytes, k_staging.lane_offset, v_staging.lane_offset};
    // The cell of this lane's key of tile `tile` (warp w: keys 16 w .. 16 w + 15; lanes 0-15,
    // -1 past the end), loaded a tile before its copies need it; the copies into stage `s`.
    auto tile_cell = [&](i32 tile) {
        const i32 position = tile + (i32)(warp * 16 + lane);
        return lane < 16 && position < block_end ? step_cell(step, h, span, position) : -1;
    };
    auto stage = [&](i32 cell, u32 s) {
        stager.stage16(words + TQP_RAW + (s * TQP_KEYS + warp * 16) * TQ_MMA_RAW, cell, lane);
    };
    stage(tile_cell(block_begin), 0);
    cp_async_commit();
    i32 next_cell = tile_cell(block_begin + TQP_KEYS);

    const float scale_log2 = scale * LOG2E, sketch_factor = tables[TQ_SKETCH_FACTOR];
    const u32 ktile_at = shared_address(words + TQP_KTILE), stile_at = shared_address(words + TQP_STILE);
    const u32 vtile_at = shared_address(words + TQP_VTILE);
    float running_max[2] = {NEG_INF, NEG_INF}, sum[2] = {0.0f, 0.0f};
    float acc[D / 8][4];
#pragma unroll
    for (int n = 0; n < D / 8; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;

    u32 s = 0;
    for (i32 tile = block_begin; tile < block_end; tile += TQP_KEYS, s ^= 1) {
        const i32 next = tile + TQP_KEYS;
        if (next < block_end) stage(next_cell, s ^ 1);  // its stage was last read before the last scores
        cp_async_commit();
        if (next + TQP_KEYS < block_end) next_cell = tile_cell(next + TQP_KEYS);
        cp_async_wait<1>();  // this tile's words
        __syncthreads();     // every thread's copies landed; every warp is done with the tiles
        const u8* raw = (const u8*)(words + TQP_RAW + s * TQP_KEYS * TQ_MMA_RAW);
        // Each (key, block)'s outliers, keys' and values', as tq_outlier_word.
        if (tid < TQP_KEYS * BLOCKS) {
            const u32 j = tid / BLOCKS, b = tid % BLOCKS;
            const u8* key = raw + j * 4 * TQ_MMA_RAW;
            const u8* value = key + 4 * TQ_KEY_WORDS;
            const u64 rotation = tq_signs(first_block + b, 0);
#pragma unroll
            for (u32 o = 0; o < TQ_OUTLIERS; ++o) {
                const u32 slot = (j * 2 + b) * TQ_OUTLIERS + o, bit = (b * TQ_OUTLIERS + o) * TQ_INDEX_BITS;
                words[TQP_KOUT + slot] =
                    tq_outlier_word(tq_index_at(k_staging.indices(key), ks.index_bit + bit),
                                    tq_half_at(key, k_staging.block_shift + b * kbb + kl.header() + 2 * o), rotation);
                words[TQP_VOUT + slot] =
                    tq_outlier_word(tq_index_at(v_staging.indices(value), vs.index_bit + bit),
                                    tq_half_at(value, v_staging.block_shift + b * vbb + vl.header() + 2 * o), rotation);
            }
        }
        __syncthreads();
        // The tiles: a thread per (key, 8 coordinates), its key (and sketch) and its value.
        for (u32 unit = tid; unit < TQP_KEYS * GROUPS; unit += TQ_MMA_THREADS) {
            const u32 j = unit / GROUPS, group = unit % GROUPS, b = group / 8, within = group % 8;
            const u8* key = raw + j * 4 * TQ_MMA_RAW;
            const u8* value = key + 4 * TQ_KEY_WORDS;
            const u32 offset = (j * TQ_MMA_STRIDE + 8 * group) * 2, slot = (j * 2 + b) * TQ_OUTLIERS;
            const u32 at = k_staging.block_shift + b * kbb, norm = tq_word_at(key, at) & 0xffffu;
            u32 w[4];
            tq_centroids8(w, words + TQP_KPAIRS, tq_word_at(key, at + kl.code_offset() + 4 * within), 4, norm);
            tq_add_outliers(w, words + TQP_KOUT + slot, within, words + TQP_H8);
            store_shared_16(ktile_at + offset, w[0], w[1], w[2], w[3]);
            if (kl.sketch)
                tq_store_signs8(stile_at + offset, words + TQP_SIGNS, key[at + kl.sign_offset() + within],
                                sketch_factor * tq_half_at(key, at + 2) * half_to_float((u16)norm));
            const u32 vat = v_staging.block_shift + b * vbb;
            tq_centroids8(w, words + TQP_VPAIRS, tq_bytes_at(value, vat + vl.code_offset() + vl.bits * within), vl.bits,
                          tq_word_at(value, vat) & 0xffffu);
            tq_add_outliers(w, words + TQP_VOUT + slot, within, words + TQP_H8);
            store_shared_16(vtile_at + offset, w[0], w[1], w[2], w[3]);
        }
        __syncthreads();
        // Warp-uniform: does this tile meet the warp's rows?
        if (tile < rr.end && next > rr.begin) {
            float sc[TQP_KEYS / 8][4];
            flash_scores<D, TQ_MMA_STRIDE, TQP_KEYS / 16>(sc, query, ktile_at);
            if (kl.sketch) {
                u32 sketched[D / 16][4];
#pragma unroll
                for (int kk = 0; kk < D / 16; ++kk)
                    load_matrix_x4(sketched[kk], shared_address(words + TQP_QSKETCH) + a_offset + kk * 32);
                flash_scores<D, TQ_MMA_STRIDE, TQP_KEYS / 16, true>(sc, sketched, stile_at);
            }
            rr.mask<TQP_KEYS / 8>(sc, tile, scale_log2);
            u32 p[TQP_KEYS / 16][4];
            flash_softmax_step<TQP_KEYS / 8, D / 8>(sc, running_max, sum, acc, p);
            flash_accumulate<D, TQ_MMA_STRIDE, TQP_KEYS / 16>(acc, p, vtile_at);
        }
    }
    cp_async_wait<0>();

    // The rows normalized into the key and sign tiles' space (f32, D a row), then rotated
    // back by a warp per (row, block).
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        sum[r] += __shfl_xor_sync(0xffffffffu, sum[r], 1);
        sum[r] += __shfl_xor_sync(0xffffffffu, sum[r], 2);
    }
    __syncthreads();  // every warp is done with the tiles
    float* rows_out = tqp_shared + TQP_KTILE;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const float inverse = sum[r] == 0.0f ? 0.0f : 1.0f / sum[r];
        float* destination = rows_out + (warp * 16 + g + 8 * r) * D + 2 * t;
#pragma unroll
        for (int n = 0; n < D / 8; ++n)
            *(float2*)(destination + n * 8) = make_float2(acc[n][2 * r] * inverse, acc[n][2 * r + 1] * inverse);
    }
    __syncwarp();
    for (u32 task = 0; task < 16 * BLOCKS; ++task) {
        const u32 r = task / BLOCKS, b = task % BLOCKS;
        const i32 row = warp_first + (i32)r;
        if (row >= span_end) break;  // warp-uniform; rows in order
        const float* x = rows_out + (warp * 16 + r) * D + b * TQ_BLOCK;
        float r0 = x[lane], r1 = x[lane + 32];
        tq_warp_unrotate(r0, r1, first_block + b, lane);
        float* o = out + ((u64)row * heads + head) * D + b * TQ_BLOCK;
        o[lane] = r0;
        o[lane + 32] = r1;
    }
}

// Launch: grid (tiles, heads) with tiles >= Σ ceil(rows_s / 64) over spans, TQ_MMA_THREADS
// threads, TQP_SHARED_WORDS words of dynamic shared memory.
#define TQ_PREFILL_KERNEL(name, d)                                                                           \
    extern "C" __global__ void __launch_bounds__(TQ_MMA_THREADS)                                             \
        name(const u8* k_cache, const u8* v_cache, const i32* step, const float* q, const float* tables,     \
             float* out, u32 heads, u32 kv_heads, float scale, u32 window, u32 turbo) {                      \
        pdl_start();                                                                                         \
        prefill_tq_mma<d>(k_cache, v_cache, step, q, tables, out, heads, kv_heads, scale, window, turbo);    \
    }
TQ_PREFILL_KERNEL(attention_prefill_tq_mma_d64, 64)
TQ_PREFILL_KERNEL(attention_prefill_tq_mma_d128, 128)

// ---------------------------------------------------------------------------------------
// Decode. grid (chunks, kv_heads * slices, rows), DECODE_THREADS threads; dynamic shared
// memory: heads_per_block * head_dim floats (queries). Partials: [rows, heads, chunks] of
// (max, sum) in part_stats and head_dim accumulators in part_acc. Caches of blocks have
// their rows rotated in chunks (kv.cu): the queries are rotated alike here (`k_rotation`),
// the output back by attention_combine (`v_rotation`: rotating the merged sum equals
// merging rotated chunks).
template <typename KC, typename VC>
__device__ __forceinline__ void decode_chunk(const float* q, KC k_cache, VC v_cache, const i32* step,
                                             float* part_acc, float* part_stats, u32 heads, u32 kv_heads,
                                             u32 head_dim, float scale, u32 window, u32 chunk_len, u32 chunks,
                                             u32 heads_per_block, u32 round_q, u32 k_rotation) {
    extern __shared__ float queries[];  // [heads_per_block][head_dim]
    __shared__ float scores[MAX_HEADS_PER_BLOCK][DECODE_TILE];
    __shared__ i32 cells[DECODE_TILE];
    __shared__ float running_max[MAX_HEADS_PER_BLOCK], running_sum[MAX_HEADS_PER_BLOCK];
    __shared__ float rescale[MAX_HEADS_PER_BLOCK];
    __shared__ typename KC::Tile k_tile;
    __shared__ typename VC::Tile v_tile;

    const StepHeader* h = (const StepHeader*)step;
    const i32 row = blockIdx.z, chunk = blockIdx.x;
    const DecodeRange range(step, row, chunk, window, chunk_len, chunks);
    if (range.begin >= range.end) return;  // attention_combine skips these chunks
    const i32 span = range.span, begin = range.begin, end = range.end;

    const HeadSlice hs(heads, kv_heads, heads_per_block, blockIdx.y);
    const u32 kv_head = hs.kv_head, first_head = hs.first, n_heads = hs.count;
    const u64 kv_offset = (u64)kv_head * head_dim;
    const u32 lane = threadIdx.x & 31, warp = threadIdx.x >> 5;

    for (u32 i = threadIdx.x; i < n_heads * head_dim; i += blockDim.x) {
        const u32 hh = i / head_dim, d = i % head_dim;
        queries[i] = query_value(q, ((u64)row * heads + first_head + hh) * head_dim + d, round_q);
    }
    __syncthreads();
    // Chunks of k_rotation never cross heads (head_dim is a multiple of it).
    rotate_like_cache(queries, n_heads * head_dim, head_dim, kv_head, k_rotation, false);
    if (threadIdx.x < MAX_HEADS_PER_BLOCK) {
        running_max[threadIdx.x] = NEG_INF;
        running_sum[threadIdx.x] = 0.0f;
    }
    float acc[MAX_HEADS_PER_BLOCK][THREAD_DIMS];
#pragma unroll
    for (u32 hh = 0; hh < MAX_HEADS_PER_BLOCK; ++hh)
#pragma unroll
        for (u32 i = 0; i < THREAD_DIMS; ++i) acc[hh][i] = 0.0f;
    __syncthreads();

    for (i32 tile = begin; tile < end; tile += DECODE_TILE) {
        const i32 n = min(DECODE_TILE, end - tile);
        // The tile's cells, all at once (one dependent read of the block table).
        if ((i32)threadIdx.x < n) cells[threadIdx.x] = step_cell(step, h, span, tile + (i32)threadIdx.x);
        __syncthreads();
        k_cache.stage(k_tile, cells, n, kv_offset, head_dim);
        v_cache.stage(v_tile, cells, n, kv_offset, head_dim);
        __syncthreads();
        if constexpr (KC::LANE_SCORES) {
            k_cache.lane_scores(k_tile, queries, n, n_heads, head_dim, scale, lane, warp, scores);
        } else {
            // Scores: one warp per key, lanes over the head dimension; unrolled so that the
            // loads of a warp's keys are in flight together.
#pragma unroll
            for (u32 round = 0; round < DECODE_TILE / DECODE_WARPS; ++round) {
                const i32 j = (i32)(warp + round * DECODE_WARPS);
                if (j >= n) continue;  // warp-uniform
                float partial[MAX_HEADS_PER_BLOCK];
#pragma unroll
                for (u32 hh = 0; hh < MAX_HEADS_PER_BLOCK; ++hh) partial[hh] = 0.0f;
#pragma unroll
                for (u32 i = 0; i < LANE_DIMS; ++i) {
                    const u32 d = lane + 32 * i;
                    if (d < head_dim) {
                        const float kd = k_cache.tile_at(k_tile, cells, j, kv_offset, d);
#pragma unroll
                        for (u32 hh = 0; hh < MAX_HEADS_PER_BLOCK; ++hh)
                            if (hh < n_heads) partial[hh] += queries[hh * head_dim + d] * kd;
                    }
                }
#pragma unroll
                for (u32 hh = 0; hh < MAX_HEADS_PER_BLOCK; ++hh) {
                    const float dot = warp_sum(partial[hh]);
                    if (lane == 0 && hh < n_heads) scores[hh][j] = dot * scale;
                }
            }
        }
        __syncthreads();
        // Online softmax: one warp per head, lanes over the tile's keys.
        for (u32 hh = warp; hh < n_heads; hh += DECODE_WARPS) {
            const float score = (i32)lane < n ? scores[hh][lane] : NEG_INF;
            const float old_max = running_max[hh];
            const float new_max = fmaxf(old_max, warp_max(score));
            const float weight = (i32)lane < n ? expf(score - new_max) : 0.0f;
            const float tile_sum = warp_sum(weight);
            if ((i32)lane < n) scores[hh][lane] = weight;
            if (lane == 0) {
                const float factor = old_max == NEG_INF ? 0.0f : expf(old_max - new_max);
                rescale[hh] = factor;
                running_sum[hh] = running_sum[hh] * factor + tile_sum;
                running_max[hh] = new_max;
            }
        }
        __syncthreads();
        // V: each thread owns dims threadIdx.x + DECODE_THREADS * i of every head.
        float factor[MAX_HEADS_PER_BLOCK];
#pragma unroll
        for (u32 hh = 0; hh < MAX_HEADS_PER_BLOCK; ++hh) factor[hh] = hh < n_heads ? rescale[hh] : 0.0f;
#pragma unroll
        for (u32 hh = 0; hh < MAX_HEADS_PER_BLOCK; ++hh)
#pragma unroll
            for (u32 i = 0; i < THREAD_DIMS; ++i) acc[hh][i] *= factor[hh];
#pragma unroll 4
        for (i32 j = 0; j < n; ++j) {
#pragma unroll
            for (u32 i = 0; i < THREAD_DIMS; ++i) {
                const u32 d = threadIdx.x + DECODE_THREADS * i;
                if (d < head_dim) {
                    const float vd = v_cache.tile_at(v_tile, cells, j, kv_offset, d);
#pragma unroll
                    for (u32 hh = 0; hh < MAX_HEADS_PER_BLOCK; ++hh)
                        if (hh < n_heads) acc[hh][i] += scores[hh][j] * vd;
                }
            }
        }
        __syncthreads();
    }

#pragma unroll
    for (u32 hh = 0; hh < MAX_HEADS_PER_BLOCK; ++hh) {
        if (hh >= n_heads) break;
        const u64 part = ((u64)row * heads + first_head + hh) * chunks + chunk;
#pragma unroll
        for (u32 i = 0; i < THREAD_DIMS; ++i) {
            const u32 d = threadIdx.x + DECODE_THREADS * i;
            if (d < head_dim) part_acc[part * head_dim + d] = acc[hh][i];
        }
        if (threadIdx.x == 0) {
            part_stats[2 * part] = running_max[hh];
            part_stats[2 * part + 1] = running_sum[hh];
        }
    }
}

// One signature for every decode kernel: `last` is the query rounding of the float caches
// and the keys' rotation of the others (queries rotated as the keys were); `tables` only
// TurboQuant's read (its codebooks, src/ops/turbo.rs `tables`).
#define ATTENTION_DECODE(name, T, K_VIEW, V_VIEW, ROUND_Q, ROTATION)                                             \
    extern "C" __global__ void __launch_bounds__(DECODE_THREADS)                                                 \
        name(const float* q, const T* k_cache, const T* v_cache, const i32* step, float* part_acc,               \
             float* part_stats, u32 heads, u32 kv_heads, u32 head_dim, float scale, u32 window, u32 chunk_len,   \
             u32 chunks, u32 heads_per_block, u32 last, const float* tables) {                                   \
        pdl_start();                                                                                             \
        const u64 width = (u64)kv_heads * head_dim;                                                              \
        decode_chunk(q, K_VIEW, V_VIEW, step, part_acc, part_stats, heads, kv_heads, head_dim, scale, window,     \
                     chunk_len, chunks, heads_per_block, ROUND_Q, ROTATION);                                     \
    }
#define PLAIN(T, cache) PlainKv<T>{cache, width}
#define BLOCKS(Q8, cache) BlockKv<Q8>{cache, width / 32 * BlockKv<Q8>::BLOCK_BYTES}
#define TURBO(layout, cache) TurboKv{cache, tables, layout, (u32)(width / TQ_BLOCK)}
ATTENTION_DECODE(attention_decode_f16, u16, PLAIN(u16, k_cache), PLAIN(u16, v_cache), last, 0)
ATTENTION_DECODE(attention_decode_f32, float, PLAIN(float, k_cache), PLAIN(float, v_cache), last, 0)
ATTENTION_DECODE(attention_decode_q8_0_q8_0, u8, BLOCKS(true, k_cache), BLOCKS(true, v_cache), 0, last)
ATTENTION_DECODE(attention_decode_q8_0_q4_0, u8, BLOCKS(true, k_cache), BLOCKS(false, v_cache), 0, last)
ATTENTION_DECODE(attention_decode_q4_0_q8_0, u8, BLOCKS(false, k_cache), BLOCKS(true, v_cache), 0, last)
ATTENTION_DECODE(attention_decode_q4_0_q4_0, u8, BLOCKS(false, k_cache), BLOCKS(false, v_cache), 0, last)
ATTENTION_DECODE(attention_decode_tq, u8, TURBO(tq_key_layout(last), k_cache), TURBO(tq_value_layout(last), v_cache),
                 0, last)

// Merges the chunks of each (row, head): grid (heads, rows), any block size. Reads exactly
// the chunks attention_decode_* wrote: those meeting [lo, position]. With `direct` (the
// attention_decode_mma_* kernels), rows whose range lies in one chunk are already in `out`.
// With `v_rotation`, the merged row is rotated back in chunks of it (caches of blocks).
extern "C" __global__ void attention_combine(float* out, const float* part_acc, const float* part_stats,
                                             const i32* step, u32 heads, u32 head_dim, u32 window,
                                             u32 chunk_len, u32 chunks, u32 direct, u32 v_rotation) { pdl_start();
    const StepHeader* h = (const StepHeader*)step;
    const i32 row = blockIdx.y;
    const u32 head = blockIdx.x;
    if (attention_span(step, h, row) < 0) return;
    const i32 position = step[h->positions + row], lo = first_visible(position, window);
    // chunk_len 0: chunks that follow the row (DecodeRange), the first from lo.
    const u32 first = chunk_len == 0 ? 0 : (u32)lo / chunk_len;
    const u32 last = chunk_len == 0 ? (u32)(position - lo) / (u32)row_chunk_len(position + 1 - lo, chunks)
                                    : min((u32)position / chunk_len, chunks - 1);
    if (direct && first == last) return;
    // Each chunk's weight exp(max_c - max) / sum, once, in shared memory (chunks <=
    // MAX_CHUNKS: plan::MAX_CHUNKS); thread i takes chunks i, i + blockDim.x, ...
    __shared__ float weights[MAX_CHUNKS];
    __shared__ float scratch[32];
    const u32 n = last - first + 1;
    const u64 base = ((u64)row * heads + head) * chunks + first;
    float chunk_max = NEG_INF;
    for (u32 c = threadIdx.x; c < n; c += blockDim.x) chunk_max = fmaxf(chunk_max, part_stats[2 * (base + c)]);
    const float max_all = block_max(chunk_max, scratch);
    float partial = 0.0f;
    for (u32 c = threadIdx.x; c < n; c += blockDim.x) {
        const float weight = expf(part_stats[2 * (base + c)] - max_all);
        weights[c] = weight;
        partial += part_stats[2 * (base + c) + 1] * weight;
    }
    const float sum = block_sum(partial, scratch);
    const float inverse = sum == 0.0f ? 0.0f : 1.0f / sum;
    for (u32 c = threadIdx.x; c < n; c += blockDim.x) weights[c] *= inverse;
    __syncthreads();
    __shared__ float merged[MAX_HEAD_DIM];
    for (u32 d = threadIdx.x; d < head_dim; d += blockDim.x) {
        float value = 0.0f;
        // Unrolled so that many chunks' loads are in flight (a row may have hundreds).
#pragma unroll 16
        for (u32 c = 0; c < n; ++c) value += part_acc[(base + c) * head_dim + d] * weights[c];
        if (v_rotation > 0)
            merged[d] = value;
        else
            out[((u64)row * heads + head) * head_dim + d] = value;
    }
    if (v_rotation == 0) return;
    __syncthreads();
    const u32 kv_head = v_rotation & TQ_ROTATION ? head / (v_rotation >> 16 & 0x7fffu) : 0;
    rotate_like_cache(merged, head_dim, head_dim, kv_head, v_rotation, true);
    for (u32 d = threadIdx.x; d < head_dim; d += blockDim.x) out[((u64)row * heads + head) * head_dim + d] = merged[d];
}

// ---------------------------------------------------------------------------------------
// Prefill. grid (tiles, heads) with tiles >= Σ ceil(rows_s / tile_rows) over spans, one warp
// per query row (blockDim.x = 32 * tile_rows), key_tile <= 32 keys per step. Dynamic shared
// memory: queries [tile_rows][head_dim], keys [key_tile][head_dim + 1] (padded: lanes read
// different keys), values [key_tile][head_dim], cells [key_tile] (all 4-byte words).
// Caches of blocks have their rows rotated in chunks (kv.cu): the queries are rotated alike
// (`k_rotation`), the output rows back (`v_rotation`).
template <typename KC, typename VC>
__device__ __forceinline__ void prefill_tile(const float* q, KC k_cache, VC v_cache, const i32* step, float* out,
                                             u32 heads, u32 kv_heads, u32 head_dim, float scale, u32 window,
                                             u32 key_tile, u32 round_q, u32 k_rotation, u32 v_rotation) {
    extern __shared__ float shared[];
    const u32 tile_rows = blockDim.x / 32;
    float* queries = shared;
    float* keys = queries + tile_rows * head_dim;
    float* values = keys + key_tile * (head_dim + 1);
    i32* cells = (i32*)(values + key_tile * head_dim);
    __shared__ i32 key_begin, key_end;

    const StepHeader* h = (const StepHeader*)step;
    // This block's span and tile within it.
    const PrefillTile tile_of(step, blockIdx.x, tile_rows);
    const i32 span = tile_of.span, first_row = tile_of.first_row, span_end = tile_of.span_end;
    if (span < 0) return;  // block-uniform

    const u32 head = blockIdx.y;
    const u32 kv_head = head / (heads / kv_heads);
    const u64 kv_offset = (u64)kv_head * head_dim;
    const u32 lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const i32 row = first_row + (i32)warp;
    const bool valid = row < span_end;
    const i32 position = valid ? step[h->positions + row] : 0;
    const i32 lo = first_visible(position, window);

    if (threadIdx.x == 0) {
        key_begin = 0x7fffffff;
        key_end = 0;
    }
    for (u32 d = lane; d < head_dim; d += 32)
        queries[warp * head_dim + d] = valid ? query_value(q, ((u64)row * heads + head) * head_dim + d, round_q) : 0.0f;
    __syncthreads();
    // Chunks of k_rotation never cross rows (head_dim is a multiple of it).
    rotate_like_cache(queries, tile_rows * head_dim, head_dim, kv_head, k_rotation, false);
    if (valid && lane == 0) {
        atomicMin(&key_begin, lo);
        atomicMax(&key_end, position + 1);
    }
    __syncthreads();
    const i32 begin = key_begin, end = key_end;

    float running_max = NEG_INF, running_sum = 0.0f;
    float acc[LANE_DIMS];
#pragma unroll
    for (u32 i = 0; i < LANE_DIMS; ++i) acc[i] = 0.0f;

    for (i32 tile = begin; tile < end; tile += (i32)key_tile) {
        const i32 n = min((i32)key_tile, end - tile);
        __syncthreads();  // the previous tile is consumed
        if ((i32)threadIdx.x < n) cells[threadIdx.x] = step_cell(step, h, span, tile + (i32)threadIdx.x);
        __syncthreads();
        k_cache.fill(keys, head_dim + 1, cells, n, kv_offset, head_dim);
        v_cache.fill(values, head_dim, cells, n, kv_offset, head_dim);
        __syncthreads();
        if (valid) {  // warp-uniform
            const i32 key_position = tile + (i32)lane;
            const bool visible = (i32)lane < n && key_position >= lo && key_position <= position;
            float score = NEG_INF;
            if (visible) {
                const float* query = queries + warp * head_dim;
                const float* key = keys + lane * (head_dim + 1);
                float dot = 0.0f;
                for (u32 d = 0; d < head_dim; ++d) dot += query[d] * key[d];
                score = dot * scale;
            }
            const float new_max = fmaxf(running_max, warp_max(score));
            if (new_max != NEG_INF) {  // some key of this row is visible by now
                const float weight = visible ? expf(score - new_max) : 0.0f;
                const float factor = running_max == NEG_INF ? 0.0f : expf(running_max - new_max);
                running_sum = running_sum * factor + warp_sum(weight);
                running_max = new_max;
#pragma unroll
                for (u32 i = 0; i < LANE_DIMS; ++i) acc[i] *= factor;
                for (i32 j = 0; j < n; ++j) {
                    const float w = __shfl_sync(0xffffffffu, weight, j);
#pragma unroll
                    for (u32 i = 0; i < LANE_DIMS; ++i) {
                        const u32 d = lane + 32 * i;
                        if (d < head_dim) acc[i] += w * values[j * head_dim + d];
                    }
                }
            }
        }
    }
    const float inverse = running_sum == 0.0f ? 0.0f : 1.0f / running_sum;
    float* dst = out + ((u64)row * heads + head) * head_dim;
    if (v_rotation > 0) {
        // Each warp's query row is its own: the rows become the outputs, rotated together.
        float* result = queries + warp * head_dim;
#pragma unroll
        for (u32 i = 0; i < LANE_DIMS; ++i) {
            const u32 d = lane + 32 * i;
            if (d < head_dim) result[d] = acc[i] * inverse;
        }
        __syncthreads();
        rotate_like_cache(queries, tile_rows * head_dim, head_dim, kv_head, v_rotation, true);
        if (valid)
            for (u32 d = lane; d < head_dim; d += 32) dst[d] = result[d];
        return;
    }
    if (!valid) return;
#pragma unroll
    for (u32 i = 0; i < LANE_DIMS; ++i) {
        const u32 d = lane + 32 * i;
        if (d < head_dim) dst[d] = acc[i] * inverse;
    }
}

// One signature for every cache kind: the float caches take the query rounding and no
// rotations, the others no rounding; `tables` only TurboQuant's read. Blocks of at most
// PREFILL_THREADS threads (plan::PrefillPlan's 16 rows of 32), so at most 128 registers each.
#define PREFILL_THREADS 512
#define ATTENTION_PREFILL(name, T, K_VIEW, V_VIEW)                                                               \
    extern "C" __global__ void __launch_bounds__(PREFILL_THREADS)                                                \
        name(const float* q, const T* k_cache, const T* v_cache, const i32* step, float* out, u32 heads,          \
             u32 kv_heads, u32 head_dim, float scale, u32 window, u32 key_tile, u32 round_q, u32 k_rotation,     \
             u32 v_rotation, const float* tables) {                                                              \
        pdl_start();                                                                                             \
        const u64 width = (u64)kv_heads * head_dim;                                                              \
        prefill_tile(q, K_VIEW, V_VIEW, step, out, heads, kv_heads, head_dim, scale, window, key_tile, round_q,   \
                     k_rotation, v_rotation);                                                                    \
    }
ATTENTION_PREFILL(attention_prefill_f16, u16, PLAIN(u16, k_cache), PLAIN(u16, v_cache))
ATTENTION_PREFILL(attention_prefill_f32, float, PLAIN(float, k_cache), PLAIN(float, v_cache))
ATTENTION_PREFILL(attention_prefill_q8_0_q8_0, u8, BLOCKS(true, k_cache), BLOCKS(true, v_cache))
ATTENTION_PREFILL(attention_prefill_q8_0_q4_0, u8, BLOCKS(true, k_cache), BLOCKS(false, v_cache))
ATTENTION_PREFILL(attention_prefill_q4_0_q8_0, u8, BLOCKS(false, k_cache), BLOCKS(true, v_cache))
ATTENTION_PREFILL(attention_prefill_q4_0_q4_0, u8, BLOCKS(false, k_cache), BLOCKS(false, v_cache))
ATTENTION_PREFILL(attention_prefill_tq, u8, TURBO(tq_key_layout(k_rotation), k_cache),
                  TURBO(tq_value_layout(k_rotation), v_cache))

