// Pipelined batched matmul for decode batches of quantized weights:
// out[t][r] = sum_k W[r][k] * x[t][k] on the tensor cores (mma.sync m16n8k16, f16 inputs,
// f32 accumulators), every packed weight byte read from memory once per tile of 8 NT tokens.
//
// A block of 4 warps works on MMQ_BLOCK_ROWS weight rows at a time (32 per warp: two m16
// tiles) and 8 NT tokens; its share of the matrix is a run of stages that may start and end
// inside a row block's length (`mmqp` below). A run is walked in stages of MmqpLayout::K
// elements: the rows' raw bytes of a stage (whole blocks; each row's 16-byte-aligned window)
// and the stage's f16 activations are copied into shared memory with cp.async, MMQP_STAGES
// stages in flight, so that the loads of the next stages overlap the work on this one.
//
// The tensor cores take k in a permuted order (the same for weights and activations, so the
// sums are the same products): within each span of 128 elements, lane 4 g + t owns the 32
// elements 32 t .. 32 t + 31 (one scale sub-block of every K-quant and legacy type) of rows g
// and g + 8 and of token g, and its elements 8 j .. 8 j + 7 fill the fragment slots of k 2t,
// 2t+1, 2t+8, 2t+9 of the two m16n8k16 steps of the span's j-th 32 elements. So each lane
// decodes a sub-block's scales once per row and span, and turns its eight values into f16 with
// integer tricks (1024 + q is the f16 whose mantissa is q) and f16x2 arithmetic for Q4_K,
// Q6_K and Q8_0 (`Frag<W>`); the other types go through dequant.cuh's float path.
// Activations are f16 as convert.cu's activation_f16_cpu rounds them, once per input.
#include "mmq.cuh"
#include "quantize.cuh"

// Elements of one stage: 256 for the K-quants (one block), MMQP_SMALL_K (128, or 256) for the
// types of 32-element blocks, whose 128-element stages take half the shared memory of 256
// (twice the blocks per multiprocessor for Q8_0). The host reads the same define
// (matmul/mmq.rs `pipe_stage`).
#ifndef MMQP_SMALL_K
#define MMQP_SMALL_K 128
#endif
#ifndef MMQP_STAGES
#define MMQP_STAGES 2
#endif
// Warps that only copy (mmqp_segment_producers) beside the four that compute, or 0: every warp
// copies its share and computes (mmqp_segment). The host reads the same define for the
// block's threads (matmul/mmq.rs `pipe_threads`).
#ifndef MMQP_PRODUCERS
#define MMQP_PRODUCERS 0
#endif
#define MMQP_THREADS (MMQ_THREADS + 32 * MMQP_PRODUCERS)
#if MMQP_PRODUCERS > 0
// Two blocks a multiprocessor, as shared memory allows: at most 170 registers a thread.
#define MMQP_BOUNDS __launch_bounds__(MMQP_THREADS, 2)
#else
#define MMQP_BOUNDS __launch_bounds__(MMQ_THREADS)
#endif
// Activation rows of one stage: K f16 (2 K bytes) in 16-byte chunks, placed by mmqp_chunk_at
// so that the 8 lanes of a load phase (tokens g and g + 1, lanes t 0..3, which read chunks
// 16 s + 4 t + j) hit 32 distinct banks (any whole number of 128-byte rows).
__device__ __forceinline__ u32 mmqp_chunk_at(u32 chunk, u32 token) {
    return chunk ^ (((chunk >> 3) & 1) << 1) ^ (token & 1);
}

// f16x2 arithmetic (no cuda_fp16.h under NVRTC here).
__device__ __forceinline__ u32 h2_sub(u32 a, u32 b) {
    u32 r;
    asm("sub.rn.f16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
    return r;
}
__device__ __forceinline__ u32 h2_mul(u32 a, u32 b) {
    u32 r;
    asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
    return r;
}
__device__ __forceinline__ u32 h2_fma(u32 a, u32 b, u32 c) {
    u32 r;
    asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(c));
    return r;
}
// A float as the f16 pair (x, x).
__device__ __forceinline__ u32 h2_splat(float x) { return pack_half2(x, x); }
// Bytes 0 and 1 of `word` (each a q below 256) as the f16 pair (1024 + q0, 1024 + q1) (one
// byte_perm that takes 0x64, the f16 1024's high byte, from a second word), then minus `bias`
// (an f16 pair): exact small integers.
__device__ __forceinline__ u32 h2_bytes01(u32 word, u32 bias) {
    return h2_sub(__byte_perm(word, 0x64646464u, 0x4140), bias);
}
__device__ __forceinline__ u32 h2_bytes23(u32 word, u32 bias) {
    return h2_sub(__byte_perm(word, 0x64646464u, 0x4342), bias);
}

// The fast fragment decoders: `scales(block, offset)` once per row and lane sub-block (the
// 32 elements from `offset` in the block), then `values(block, offset, j, scales, out)`: the
// sub-block's elements 8 j .. 8 j + 7 as four f16 pairs.
struct FragScales {
    u32 a, b;
};
template <class W>
struct Frag {
    static constexpr bool FAST = false;
};

// Q4_K: element 64 p + 32 s + l is nibble s of qs[32 p + l]; x = d sc q - dmin m.
template <>
struct Frag<Q4_K> {
    static constexpr bool FAST = true;
    static __device__ __forceinline__ FragScales scales(const u8* b, u32 offset) {
        int scale, min;
        scale_min_k4((int)(offset / 32), b + 4, &scale, &min);
        return {h2_splat(load_half(b) * (float)scale), h2_splat(-(load_half(b + 2) * (float)min))};
    }
    static __device__ __forceinline__ void values(const u8* b, u32 offset, int j, FragScales s, u32 (&out)[4]) {
        const u8* qs = b + 16 + 32 * (offset / 64) + 8 * j;
        const u32 shift = 4 * ((offset / 32) & 1);
        const u32 w0 = (load_u32_a4(qs) >> shift) & 0x0F0F0F0Fu, w1 = (load_u32_a4(qs + 4) >> shift) & 0x0F0F0F0Fu;
        const u32 bias = 0x64006400u;  // 1024
        out[0] = h2_fma(h2_bytes01(w0, bias), s.a, s.b);
        out[1] = h2_fma(h2_bytes23(w0, bias), s.a, s.b);
        out[2] = h2_fma(h2_bytes01(w1, bias), s.a, s.b);
        out[3] = h2_fma(h2_bytes23(w1, bias), s.a, s.b);
    }
};

// Q6_K: element 128 h + 32 g + l: low nibble (g < 2) or high nibble of ql[64 h + 32 (g & 1)
// + l], top two bits at bits 2g of qh[32 h + l]; x = d sc (q - 32), sc per 16 elements.
template <>
struct Frag<Q6_K> {
    static constexpr bool FAST = true;
    static __device__ __forceinline__ FragScales scales(const u8* b, u32 offset) {
        const float d = load_half(b + 208);
        const u32 h = offset / 128, g = (offset / 32) & 3;
        const i8* sc = (const i8*)(b + 192 + 8 * h + 2 * g);
        return {h2_splat(d * (float)sc[0]), h2_splat(d * (float)sc[1])};
    }
    static __device__ __forceinline__ void values(const u8* b, u32 offset, int j, FragScales s, u32 (&out)[4]) {
        const u32 h = offset / 128, g = (offset / 32) & 3;
        const u8* ql = b + 64 * h + 32 * (g & 1) + 8 * j;
        const u8* qh = b + 128 + 32 * h + 8 * j;
        const u32 low_shift = 4 * (g >> 1), high_shift = 2 * g;
        const u32 scale = j < 2 ? s.a : s.b;
        const u32 bias = 0x64206420u;  // 1056 = 1024 + 32
#pragma unroll
        for (int k = 0; k < 2; k++) {
            const u32 q = ((load_u32_a2(ql + 4 * k) >> low_shift) & 0x0F0F0F0Fu) |
                          (((load_u32_a2(qh + 4 * k) >> high_shift) & 0x03030303u) << 4);
            out[2 * k] = h2_mul(h2_bytes01(q, bias), scale);
            out[2 * k + 1] = h2_mul(h2_bytes23(q, bias), scale);
        }
    }
};

// Q8_0: x = d q, q signed bytes (q + 128 is what 1024 + (q ^ 0x80) - 1152 undoes).
template <>
struct Frag<Q8_0> {
    static constexpr bool FAST = true;
    static __device__ __forceinline__ FragScales scales(const u8* b, u32) { return {h2_splat(load_half(b)), 0u}; }
    static __device__ __forceinline__ void values(const u8* b, u32, int j, FragScales s, u32 (&out)[4]) {
        const u8* qs = b + 2 + 8 * j;
        const u32 bias = 0x64806480u;  // 1152 = 1024 + 128
#pragma unroll
        for (int k = 0; k < 2; k++) {
            const u32 q = load_u32_a2(qs + 4 * k) ^ 0x80808080u;
            out[2 * k] = h2_mul(h2_bytes01(q, bias), s.a);
            out[2 * k + 1] = h2_mul(h2_bytes23(q, bias), s.a);
        }
    }
};

// Bytes of one row's window in shared memory: a stage's whole blocks after the misalignment
// of their first byte. Weights start 256-byte aligned (one allocation each) and a stage starts
// a whole number of super-blocks into them for the super-block types (rows and stream-K runs
// are whole super-blocks), so the misalignment is a multiple of ALIGN, the largest power of
// two dividing a super-block's bytes (at most 16): Q4_K's (144 bytes) start at 0. For the
// super-block types W_STRIDE is that window rounded up to an odd number of 16-byte chunks;
// blocks of 32 keep a window of up to 15 bytes either side. On an H100 (session 43) the tight
// window decoded 8 rows of qwen2.5-7b Q4_K_M 2.3% faster (4.28 against 4.38 ms a step: four
// blocks a multiprocessor instead of three) and 64 rows the same, but Q8_0's (176 -> 144
// bytes: three blocks of 64-token tiles a multiprocessor instead of two) 3-9% slower.
// (matmul/mmq.rs `pipe_row_stride` computes the same on the host.)
template <class W>
struct MmqpLayout {
    static constexpr u32 K = W::QK >= 256 ? 256 : MMQP_SMALL_K;
    static constexpr u32 X_ROW_BYTES = 2 * K;
    static constexpr int STAGE_BYTES = K / W::QK * W::BYTES;
    // Super-blocks start a whole number of BYTES into the weight: their misalignment's unit.
    static constexpr int ALIGN = (W::BYTES & -W::BYTES) < 16 ? (W::BYTES & -W::BYTES) : 16;
    static constexpr int WINDOW = (16 - ALIGN + STAGE_BYTES + 15) / 16 * 16;
    static constexpr int W_STRIDE = W::QK < 256 ? (STAGE_BYTES + 30 + 15) / 16 * 16
                                    : (WINDOW / 16) % 2 == 1 ? WINDOW : WINDOW + 16;
    static constexpr int W_CHUNKS = W_STRIDE / 16;
};
#if MMQP_SMALL_K == 128
// The host's twin (matmul/mmq.rs `pipe_row_stride`) asserts the same values in its tests.
static_assert(MmqpLayout<Q8_0>::W_STRIDE == 176 && MmqpLayout<Q4_K>::W_STRIDE == 144 && MmqpLayout<Q6_K>::W_STRIDE == 240,
              "mmqp row strides");
#endif

// Shared bytes of one stage for tiles of 8 NT tokens (the host computes the same:
// matmul/mmq.rs `pipe_shared_bytes`).
template <class W, int NT>
__device__ __forceinline__ constexpr u32 mmqp_stage_bytes() {
    return MMQ_BLOCK_ROWS * MmqpLayout<W>::W_STRIDE + 8 * NT * MmqpLayout<W>::X_ROW_BYTES;
}

// Issues the copies of the weight windows of stage elements k0 .. k0 + len into `wsm`. A window
// ends at the 16-byte boundary after its last block: at most 15 bytes past the weight's end,
// inside the same aligned 16 bytes (and so the same page) as its last byte. Copy i (of the
// rows' W_CHUNKS chunks, row by row) is thread i % MMQ_THREADS's: in a row block that lies
// inside the matrix a thread steps from its row, chunk and byte offset to the next ones by
// additions (no division or 64-bit product a copy); a row block past the last row clamps its
// rows to it. (Session 44 measured two adjacent threads a row at compile-time offsets, with the
// activations copied by token rows: fewer instructions, yet 10-24% slower steps at 8-128 rows.)
template <class W, u32 THREADS>
__device__ __forceinline__ void mmqp_load_weights(u32 wsm, const u8* __restrict__ w, u64 row_bytes, u32 n_out,
                                                  u32 block_row0, u32 k0, u32 len, u32 tid) {
    using L = MmqpLayout<W>;
    constexpr u32 ROW_STEP = THREADS / L::W_CHUNKS, CHUNK_STEP = THREADS % L::W_CHUNKS;
    const u64 byte0 = (u64)(k0 / W::QK) * W::BYTES;
    const u32 bytes = len / W::QK * W::BYTES;
    // The copy of `chunk` of `row`, whose window starts at byte `start` of w.
    auto copy = [&](u32 row, u32 chunk, u64 start) {
        const u32 misalign = (u32)start & 15;
        if (16 * chunk < ((misalign + bytes + 15) & ~15u))
            cp_async16(wsm + row * L::W_STRIDE + 16 * chunk, w + (start - misalign) + 16 * chunk);
    };
    if (block_row0 + MMQ_BLOCK_ROWS <= n_out) {
        u32 row = tid / L::W_CHUNKS, chunk = tid % L::W_CHUNKS;
        u64 start = (u64)(block_row0 + row) * row_bytes + byte0;
        const u64 rows_step = ROW_STEP * row_bytes;
        for (u32 i = tid; i < MMQ_BLOCK_ROWS * L::W_CHUNKS; i += THREADS) {
            copy(row, chunk, start);
            row += ROW_STEP, chunk += CHUNK_STEP, start += rows_step;
            if (chunk >= L::W_CHUNKS) chunk -= L::W_CHUNKS, row++, start += row_bytes;
        }
        return;
    }
    for (u32 i = tid; i < MMQ_BLOCK_ROWS * L::W_CHUNKS; i += THREADS) {
        const u32 row = i / L::W_CHUNKS, chunk = i % L::W_CHUNKS;
        copy(row, chunk, (u64)min(block_row0 + row, n_out - 1) * row_bytes + byte0);
    }
}

// Issues the copies of the activations of stage elements k0 .. k0 + len (zeros past `tokens`),
// `chunks` = len / 8 16-byte chunks a token row.
template <class W, int NT, u32 THREADS>
__device__ __forceinline__ void mmqp_load_activation_chunks(u32 xsm, const u16* __restrict__ x, u32 n_in, u32 tokens,
                                                            u32 token0, u32 k0, u32 chunks, u32 tid) {
    for (u32 i = tid; i < 8 * NT * chunks; i += THREADS) {
        const u32 r = i / chunks, j = i % chunks;
        const u32 at = xsm + r * MmqpLayout<W>::X_ROW_BYTES + 16 * mmqp_chunk_at(j, r);
        const u32 token = token0 + r;
        if (token < tokens)
            cp_async16(at, x + (u64)token * n_in + k0 + 8 * j);
        else
            cp_async16_zero(at, x);
    }
}

// mmqp_load_activation_chunks of a stage: a whole one (every stage but a row's last when the
// length is not a multiple of K) with its chunk count known at compile time, so that the
// loop's divisions are shifts (about 11 instructions a copy instead of 18 on sm_90).
template <class W, int NT, u32 THREADS>
__device__ __forceinline__ void mmqp_load_activations(u32 xsm, const u16* __restrict__ x, u32 n_in, u32 tokens,
                                                      u32 token0, u32 k0, u32 len, u32 tid) {
    constexpr u32 K = MmqpLayout<W>::K;
    if (len == K)
        mmqp_load_activation_chunks<W, NT, THREADS>(xsm, x, n_in, tokens, token0, k0, K / 8, tid);
    else
        mmqp_load_activation_chunks<W, NT, THREADS>(xsm, x, n_in, tokens, token0, k0, len / 8, tid);
}

// The products of one stage (elements k0 .. k0 + len, its weights at wsm in shared memory,
// the activations after them) added to a consumer warp's accumulators: rows row0 .. + 32 of
// the warp (row_at: the shared offsets of this lane's four rows).
template <class W, int NT>
__device__ __forceinline__ void mmqp_stage_products(float (&acc)[2][NT][4], const u8* wsm, u32 k0, u32 len,
                                                    const u32 (&row_at)[2][2], u32 row0, u64 row_bytes, u32 n_out,
                                                    int g, int t) {
    using L = MmqpLayout<W>;
    const u8* xsm = wsm + MMQ_BLOCK_ROWS * L::W_STRIDE;
    // Each row's window starts at its first block's address rounded down to 16 bytes.
    const u64 byte0 = (u64)(k0 / W::QK) * W::BYTES;
    u32 misalign[2][2];
#pragma unroll
    for (int m = 0; m < 2; m++)
#pragma unroll
        for (int h = 0; h < 2; h++)
            misalign[m][h] =
                (u32)(((u64)min(row0 + 16 * m + 8 * h + g, n_out - 1) * row_bytes + byte0) & 15);

    for (u32 span = 0; span < len / 128; span++) {
        // This lane's 32 elements of the span: block e / QK from byte `at`, at `offset` in it.
        const u32 e = 128 * span + 32 * t;
        const u32 at = e / W::QK * W::BYTES, offset = e % W::QK;
        const u8* rows[2][2];
        FragScales scales[2][2];
#pragma unroll
        for (int m = 0; m < 2; m++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                rows[m][h] = wsm + row_at[m][h] + misalign[m][h] + at;
                if constexpr (Frag<W>::FAST) scales[m][h] = Frag<W>::scales(rows[m][h], offset);
            }
#pragma unroll
        for (int j = 0; j < 4; j++) {
            u32 a[2][2][4];
#pragma unroll
            for (int m = 0; m < 2; m++) {
                u32 p[2][4];
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    if constexpr (Frag<W>::FAST) {
                        Frag<W>::values(rows[m][h], offset, j, scales[m][h], p[h]);
                    } else {
                        // Elements offset + 8 j .. of the row's block (a block of 32 when
                        // QK is 32: offset is 0 there).
                        float v[8];
                        W::dequant8(rows[m][h], (int)((offset + 8 * j) / 8), v);
#pragma unroll
                        for (int i = 0; i < 4; i++) p[h][i] = pack_half2(v[2 * i], v[2 * i + 1]);
                    }
                }
                a[m][0][0] = p[0][0];
                a[m][0][1] = p[1][0];
                a[m][0][2] = p[0][1];
                a[m][0][3] = p[1][1];
                a[m][1][0] = p[0][2];
                a[m][1][1] = p[1][2];
                a[m][1][2] = p[0][3];
                a[m][1][3] = p[1][3];
            }
#pragma unroll
            for (int n = 0; n < NT; n++) {
                const u32 r = 8 * n + g;
                const uint4 b =
                    *(const uint4*)(xsm + r * L::X_ROW_BYTES + 16 * mmqp_chunk_at(16 * span + 4 * t + j, r));
#pragma unroll
                for (int m = 0; m < 2; m++) {
                    mma_16816(acc[m][n], a[m][0], b.x, b.y);
                    mma_16816(acc[m][n], a[m][1], b.z, b.w);
                }
            }
        }
    }
}

// One segment of a block's work: rows block_row0 .. + MMQ_BLOCK_ROWS, tokens token0 .. + 8 NT,
// elements k_begin .. k_end of the rows, written to target[token][row] (plus `bias` when
// given). The first segment of a block starts its weight copies before the programmatic-launch
// wait (`wait` true), the others after. Every thread copies and computes (MMQP_PRODUCERS 0).
template <class W, int NT>
__device__ __forceinline__ void mmqp_segment(const u8* __restrict__ w, u64 row_bytes, u32 n_in, u32 n_out,
                                             const u16* __restrict__ x, u32 tokens, u32 block_row0, u32 token0,
                                             u32 k_begin, u32 k_end, bool wait, float* target,
                                             const float* __restrict__ bias) {
    using L = MmqpLayout<W>;
    extern __shared__ __align__(16) u8 smem[];
    constexpr u32 STAGE = mmqp_stage_bytes<W, NT>();
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int g = lane >> 2, t = lane & 3;
    const u32 row0 = block_row0 + warp * MMQ_WARP_ROWS;
    const u32 base = shared_address(smem);
    float acc[2][NT][4];
#pragma unroll
    for (int m = 0; m < 2; m++)
#pragma unroll
        for (int n = 0; n < NT; n++)
#pragma unroll
            for (int i = 0; i < 4; i++) acc[m][n][i] = 0.0f;

    // The weights never come from an earlier kernel: the first stages' copies start before
    // the dependency wait, the activations' after it.
    const u32 stages = (k_end - k_begin + L::K - 1) / L::K;
#pragma unroll
    for (u32 s = 0; s < MMQP_STAGES - 1; s++) {
        const u32 k0 = k_begin + s * L::K;
        if (s < stages)
            mmqp_load_weights<W, MMQ_THREADS>(base + s * STAGE, w, row_bytes, n_out, block_row0, k0,
                                              min((u32)L::K, k_end - k0), threadIdx.x);
    }
    if (wait) pdl_wait();
#pragma unroll
    for (u32 s = 0; s < MMQP_STAGES - 1; s++) {
        const u32 k0 = k_begin + s * L::K;
        if (s < stages)
            mmqp_load_activations<W, NT, MMQ_THREADS>(base + s * STAGE + MMQ_BLOCK_ROWS * L::W_STRIDE, x, n_in,
                                                      tokens, token0, k0, min((u32)L::K, k_end - k0), threadIdx.x);
        cp_async_commit();
    }

    // The shared offsets of this lane's four rows (rows g and g + 8 of each m16 tile).
    u32 row_at[2][2];
#pragma unroll
    for (int m = 0; m < 2; m++)
#pragma unroll
        for (int h = 0; h < 2; h++) row_at[m][h] = (warp * MMQ_WARP_ROWS + 16 * m + 8 * h + g) * L::W_STRIDE;

    for (u32 s = 0; s < stages; s++) {
        // Start the copies of stage s + STAGES - 1 (an empty group past the end).
        const u32 ahead = s + MMQP_STAGES - 1;
        if (ahead < stages) {
            const u32 slot = base + (ahead % MMQP_STAGES) * STAGE, k0 = k_begin + ahead * L::K;
            const u32 len = min((u32)L::K, k_end - k0);
            mmqp_load_weights<W, MMQ_THREADS>(slot, w, row_bytes, n_out, block_row0, k0, len, threadIdx.x);
            mmqp_load_activations<W, NT, MMQ_THREADS>(slot + MMQ_BLOCK_ROWS * L::W_STRIDE, x, n_in, tokens, token0,
                                                      k0, len, threadIdx.x);
        }
        cp_async_commit();
        cp_async_wait<MMQP_STAGES - 1>();
        __syncthreads();
        const u32 k0 = k_begin + s * L::K;
        mmqp_stage_products<W, NT>(acc, smem + (s % MMQP_STAGES) * STAGE, k0, min((u32)L::K, k_end - k0), row_at,
                                   row0, row_bytes, n_out, g, t);
        __syncthreads();
    }
    cp_async_wait<0>();

    mmq_store<NT>(acc, target, bias, row0, token0, tokens, n_out, g, t);
}

// mmqp_segment with MMQP_PRODUCERS copying warps (warps 4 ..) beside the four computing ones:
// the producers copy stage s + 1 into the other slot while the consumers compute stage s,
// then wait for their copies; one barrier a stage (two slots: MMQP_STAGES 2). The consumers
// issue no copy, so their instructions are the products' alone.
template <class W, int NT>
__device__ __forceinline__ void mmqp_segment_producers(const u8* __restrict__ w, u64 row_bytes, u32 n_in,
                                                       u32 n_out, const u16* __restrict__ x, u32 tokens,
                                                       u32 block_row0, u32 token0, u32 k_begin, u32 k_end, bool wait,
                                                       float* target, const float* __restrict__ bias) {
    static_assert(MMQP_STAGES == 2, "producer warps fill the one slot the consumers do not read");
    using L = MmqpLayout<W>;
    constexpr u32 PRODUCER_THREADS = 32 * MMQP_PRODUCERS;
    extern __shared__ __align__(16) u8 smem[];
    constexpr u32 STAGE = mmqp_stage_bytes<W, NT>();
    const bool producer = threadIdx.x >= MMQ_THREADS;
    const u32 tid = threadIdx.x - MMQ_THREADS;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int g = lane >> 2, t = lane & 3;
    const u32 row0 = block_row0 + warp * MMQ_WARP_ROWS;
    const u32 base = shared_address(smem);
    const u32 stages = (k_end - k_begin + L::K - 1) / L::K;
    // Stage s's copies into its slot (committed as one group).
    auto copy = [&](u32 s, bool weights, bool activations) {
        const u32 slot = base + (s % 2) * STAGE, k0 = k_begin + s * L::K;
        const u32 len = min((u32)L::K, k_end - k0);
        if (weights) mmqp_load_weights<W, PRODUCER_THREADS>(slot, w, row_bytes, n_out, block_row0, k0, len, tid);
        if (activations)
            mmqp_load_activations<W, NT, PRODUCER_THREADS>(slot + MMQ_BLOCK_ROWS * L::W_STRIDE, x, n_in, tokens,
                                                           token0, k0, len, tid);
    };
    if (producer) {
        // The weights never come from an earlier kernel: stage 0's start before the wait.
        copy(0, true, false);
        if (wait) pdl_wait();
        copy(0, false, true);
        cp_async_commit();
        cp_async_wait<0>();
    } else if (wait) {
        pdl_wait();
    }
    __syncthreads();

    float acc[2][NT][4];
#pragma unroll
    for (int m = 0; m < 2; m++)
#pragma unroll
        for (int n = 0; n < NT; n++)
#pragma unroll
            for (int i = 0; i < 4; i++) acc[m][n][i] = 0.0f;
    u32 row_at[2][2];
#pragma unroll
    for (int m = 0; m < 2; m++)
#pragma unroll
        for (int h = 0; h < 2; h++) row_at[m][h] = (warp * MMQ_WARP_ROWS + 16 * m + 8 * h + g) * L::W_STRIDE;

    for (u32 s = 0; s < stages; s++) {
        if (producer) {
            if (s + 1 < stages) {
                copy(s + 1, true, true);
                cp_async_commit();
                cp_async_wait<0>();
            }
        } else {
            const u32 k0 = k_begin + s * L::K;
            mmqp_stage_products<W, NT>(acc, smem + (s % 2) * STAGE, k0, min((u32)L::K, k_end - k0), row_at, row0,
                                       row_bytes, n_out, g, t);
        }
        __syncthreads();
    }
    if (!producer) mmq_store<NT>(acc, target, bias, row0, token0, tokens, n_out, g, t);
}

// The stages of the rows (MmqpLayout::K elements, the last one shorter when the length is not
// a multiple) are the units of mmqp_slots.cuh: every block of a grid sized to what the device
// holds at once does the same work however many row blocks the matrix has.
template <class W, int NT>
__device__ __forceinline__ void mmqp(const u8* __restrict__ w, u64 row_bytes, u32 n_in, u32 n_out,
                                     const u16* __restrict__ x, u32 tokens, u32 share, float* __restrict__ out,
                                     const float* __restrict__ bias, float* __restrict__ partial) {
    using L = MmqpLayout<W>;
    pdl_launch_dependents();
    const u32 n_stages = (n_in + L::K - 1) / L::K;
    const u32 row_blocks = (n_out + MMQ_BLOCK_ROWS - 1) / MMQ_BLOCK_ROWS;
    const u32 total = row_blocks * n_stages;
    const u32 token0 = blockIdx.y * 8 * NT;
    const u64 values = (u64)tokens * n_out;
    u32 unit = blockIdx.x * share;
    const u32 end = min(total, unit + share);
    bool wait = true;
    while (unit < end) {
        const u32 row_block = unit / n_stages, first = unit % n_stages;
        const u32 last = min(n_stages, first + (end - unit));
        const u32 first_block = mmqp_first_block(row_block, n_stages, share);
        const bool whole = first_block == mmqp_last_block(row_block, n_stages, share);
        float* target = whole ? out : partial + (u64)(blockIdx.x - first_block) * values;
        if constexpr (MMQP_PRODUCERS > 0)
            mmqp_segment_producers<W, NT>(w, row_bytes, n_in, n_out, x, tokens, row_block * MMQ_BLOCK_ROWS, token0,
                                          first * L::K, min(n_in, last * L::K), wait, target,
                                          whole ? bias : nullptr);
        else
            mmqp_segment<W, NT>(w, row_bytes, n_in, n_out, x, tokens, row_block * MMQ_BLOCK_ROWS, token0,
                                first * L::K, min(n_in, last * L::K), wait, target, whole ? bias : nullptr);
        wait = false;
        unit += last - first;
    }
    if (wait) pdl_wait();
}

// out[i] (i = token n_out + row) = mmqp_slot_sum where several grid blocks share the row's row
// block; the others are written already. `values` = tokens n_out; `n_stages`: the stages of a
// row (its length over the kernel's MmqpLayout::K).
__device__ __forceinline__ void mmqp_merge_at(const float* __restrict__ partial, u64 values, u32 n_out, u32 n_stages,
                                              u32 share, const float* __restrict__ bias, float* __restrict__ out,
                                              u64 i) {
    const u32 row = (u32)(i % n_out), slots = mmqp_slots(row, n_stages, share);
    if (slots > 1) out[i] = mmqp_slot_sum(partial, values, i, slots, bias, row);
}

// The merge of one pipelined matmul (mmqp_merge_at over its tokens n_out values).
extern "C" __global__ void mmqp_merge(const float* __restrict__ partial, u32 tokens, u32 n_out, u32 n_stages,
                                      u32 share, const float* __restrict__ bias, float* __restrict__ out) {
    pdl_start();
    const u64 values = (u64)tokens * n_out;
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < values; i += (u64)gridDim.x * blockDim.x)
        mmqp_merge_at(partial, values, n_out, n_stages, share, bias, out, i);
}

// The merges of three pipelined matmuls of one input (a batched matmul_qkv) in one launch:
// the grid walks the first's values, then the second's, then the third's; a matmul with no
// cut row block has no partial sums (nullptr) and is skipped.
struct MmqpMergeArgs {
    const float* partial;
    u32 n_out, n_stages, share;
    const float* bias;
    float* out;
};
extern "C" __global__ void mmqp_merge3(u32 tokens, MmqpMergeArgs a, MmqpMergeArgs b, MmqpMergeArgs c) {
    pdl_start();
    const u64 va = (u64)tokens * a.n_out, vb = (u64)tokens * b.n_out, vc = (u64)tokens * c.n_out;
    // Each matmul's fields read in a branch of its own (a reference chosen among the three
    // would copy the parameters to the stack).
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < va + vb + vc; i += (u64)gridDim.x * blockDim.x) {
        if (i < va) {
            if (a.partial != nullptr) mmqp_merge_at(a.partial, va, a.n_out, a.n_stages, a.share, a.bias, a.out, i);
        } else if (i < va + vb) {
            if (b.partial != nullptr)
                mmqp_merge_at(b.partial, vb, b.n_out, b.n_stages, b.share, b.bias, b.out, i - va);
        } else if (c.partial != nullptr) {
            mmqp_merge_at(c.partial, vc, c.n_out, c.n_stages, c.share, c.bias, c.out, i - va - vb);
        }
    }
}

// The batched SwiGLU over the gate's and up's pipelined matmuls, their merges included:
// gate[i] = silu(g) * u and up[i] = u with g, u the merged values (mmqp_merge's, from
// `gate_partial` / `up_partial` where a row block was cut; both matmuls have one plan:
// `n_stages`, `share`, rows of `width`, a multiple of 256), then out = their
// activation_f16_cpu conversion in q8 mode `mode` (0-2) for the down projection, as
// silu_mul_f16_cpu (convert.cu) writes it. One warp per group of 256 values, eight
// consecutive values a lane (one row block's, so the slot count is worked out once a lane),
// read and written as float4; the conversion from registers (activation_f16_lane8).
extern "C" __global__ void silu_mul_merge_f16_cpu(float* gate, float* up, u16* __restrict__ out, u64 n, u32 mode,
                                                  u32 width, const float* __restrict__ gate_partial,
                                                  const float* __restrict__ up_partial, u32 n_stages, u32 share) {
    pdl_start();
    const int lane = threadIdx.x & 31;
    const u64 warps = ((u64)gridDim.x * blockDim.x) >> 5;
    for (u64 group = ((u64)blockIdx.x * blockDim.x + threadIdx.x) >> 5; group < n / 256; group += warps) {
        const u64 i = group * 256 + 8 * lane;
        const u32 slots = mmqp_slots((u32)(i % width), n_stages, share);
        float g[8], u[8];
        auto load8 = [](const float* p, float (&v)[8]) {
            const float4 x = __ldcg((const float4*)p), y = __ldcg((const float4*)(p + 4));
            v[0] = x.x, v[1] = x.y, v[2] = x.z, v[3] = x.w, v[4] = y.x, v[5] = y.y, v[6] = y.z, v[7] = y.w;
        };
        if (slots == 1) {
            load8(gate + i, g);
            load8(up + i, u);
        } else {
            // mmqp_slot_sum's order: the slots' partial sums in turn from 0, then + 0.
#pragma unroll
            for (int k = 0; k < 8; k++) g[k] = u[k] = 0.0f;
#pragma unroll 2
            for (u32 s = 0; s < slots; s++) {
                float pg[8], pu[8];
                load8(gate_partial + s * n + i, pg);
                load8(up_partial + s * n + i, pu);
#pragma unroll
                for (int k = 0; k < 8; k++) g[k] += pg[k], u[k] += pu[k];
            }
#pragma unroll
            for (int k = 0; k < 8; k++) g[k] = __fadd_rn(g[k], 0.0f), u[k] = __fadd_rn(u[k], 0.0f);
        }
        float h[8];
#pragma unroll
        for (int k = 0; k < 8; k++) h[k] = silu_mul_value(g[k], u[k]);
        *(float4*)(up + i) = make_float4(u[0], u[1], u[2], u[3]);
        *(float4*)(up + i + 4) = make_float4(u[4], u[5], u[6], u[7]);
        *(float4*)(gate + i) = make_float4(h[0], h[1], h[2], h[3]);
        *(float4*)(gate + i + 4) = make_float4(h[4], h[5], h[6], h[7]);
        u16 q[8];
        activation_f16_lane8(h, lane, mode, q);
        *(uint4*)(out + i) = make_uint4(q[0] | (u32)q[1] << 16, q[2] | (u32)q[3] << 16, q[4] | (u32)q[5] << 16,
                                        q[6] | (u32)q[7] << 16);
    }
}

#define MMQP_KERNEL(W, name, NT)                                                                             \
    extern "C" __global__ void MMQP_BOUNDS mmqp_##name##_n##NT(                                                \
        const u8* w, u64 row_bytes, u32 n_in, u32 n_out, const u16* x, u32 tokens, u32 share, float* out,   \
        const float* bias, float* partial) {                                                  \
        mmqp<W, NT>(w, row_bytes, n_in, n_out, x, tokens, share, out, bias, partial);              \
    }

// Tiles of 8 (2-8 rows: matmul/mmq.rs `tile8_enabled`), 16, 32 and 64 token rows.
#define MMQP_ENTRIES(W, name) \
    MMQP_KERNEL(W, name, 1) MMQP_KERNEL(W, name, 2) MMQP_KERNEL(W, name, 4) MMQP_KERNEL(W, name, 8)

MMQP_ENTRIES(Q4_0, q4_0)
MMQP_ENTRIES(Q4_1, q4_1)
MMQP_ENTRIES(Q5_0, q5_0)
MMQP_ENTRIES(Q5_1, q5_1)
MMQP_ENTRIES(Q8_0, q8_0)
MMQP_ENTRIES(IQ4_NL, iq4_nl)
MMQP_ENTRIES(Q2_K, q2_k)
MMQP_ENTRIES(Q3_K, q3_k)
MMQP_ENTRIES(Q4_K, q4_k)
MMQP_ENTRIES(Q5_K, q5_k)
MMQP_ENTRIES(Q6_K, q6_k)
MMQP_ENTRIES(IQ4_XS, iq4_xs)
