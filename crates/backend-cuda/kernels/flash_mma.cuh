// Warp-level pieces of the tensor-core flash attention (mma.sync.m16n8k16, f32
// accumulators), shared by kernels/attention_mma.cu (f16 caches) and kernels/attention.cu
// (TurboQuant's decode on the tensor cores): a warp's 16 query rows (fragment rows g and
// g + 8) against tiles of keys and values stored row-major as f16 in shared memory.
#pragma once
#include "common.cuh"
#include "mma.cuh"

#define LOG2E 1.4426950408889634f
#define LN2 0.6931471805599453f
#define NEG_INF (-__int_as_float(0x7f800000))

__device__ __forceinline__ float fast_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

// One online-softmax step for a warp's 16 rows over N n-tiles of scores (already in log2
// units, masked keys at -inf): rescales `out` and `sum`, turns `s` into probabilities and
// returns them as A fragments (pairs of n-tiles per 16-key k-step).
template <int N, int DT>
__device__ __forceinline__ void flash_softmax_step(float (&s)[N][4], float (&running_max)[2], float (&sum)[2],
                                             float (&out)[DT][4], u32 (&p)[N / 2][4]) {
    float tile_max[2] = {NEG_INF, NEG_INF};
#pragma unroll
    for (int n = 0; n < N; ++n) {
        tile_max[0] = fmaxf(tile_max[0], fmaxf(s[n][0], s[n][1]));
        tile_max[1] = fmaxf(tile_max[1], fmaxf(s[n][2], s[n][3]));
    }
    float base[2], factor[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(0xffffffffu, tile_max[r], 1));
        tile_max[r] = fmaxf(tile_max[r], __shfl_xor_sync(0xffffffffu, tile_max[r], 2));
        const float new_max = fmaxf(running_max[r], tile_max[r]);
        base[r] = new_max == NEG_INF ? 0.0f : new_max;  // no visible key yet: every p is 0
        factor[r] = fast_exp2(running_max[r] - base[r]);
        running_max[r] = new_max;
        sum[r] *= factor[r];
    }
#pragma unroll
    for (int n = 0; n < N; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            s[n][e] = fast_exp2(s[n][e] - base[e >> 1]);
            sum[e >> 1] += s[n][e];
        }
    }
#pragma unroll
    for (int n = 0; n < DT; ++n) {
        out[n][0] *= factor[0];
        out[n][1] *= factor[0];
        out[n][2] *= factor[1];
        out[n][3] *= factor[1];
    }
#pragma unroll
    for (int k = 0; k < N / 2; ++k) {
        p[k][0] = pack_half2(s[2 * k][0], s[2 * k][1]);
        p[k][1] = pack_half2(s[2 * k][2], s[2 * k][3]);
        p[k][2] = pack_half2(s[2 * k + 1][0], s[2 * k + 1][1]);
        p[k][3] = pack_half2(s[2 * k + 1][2], s[2 * k + 1][3]);
    }
}

// s[n] = Q · K^T for 16 * N2 keys stored row-major (stride STRIDE halves) from `keys`.
// With ADD, s[n] += Q · K^T.
template <int D, int STRIDE, int N2, bool ADD = false>
__device__ __forceinline__ void flash_scores(float (&s)[2 * N2][4], const u32 (&q)[D / 16][4], u32 keys) {
    const u32 lane = threadIdx.x & 31, i = lane >> 3, r = lane & 7;
    if (!ADD)
#pragma unroll
        for (int n = 0; n < 2 * N2; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
    for (int ks = 0; ks < D / 16; ++ks) {
#pragma unroll
        for (int np = 0; np < N2; ++np) {
            u32 b[4];
            const u32 key = np * 16 + (i >> 1) * 8 + r, dim = ks * 16 + (i & 1) * 8;
            load_matrix_x4(b, keys + (key * STRIDE + dim) * 2);
            mma_16816(s[2 * np], q[ks], b[0], b[1]);
            mma_16816(s[2 * np + 1], q[ks], b[2], b[3]);
        }
    }
}

// out += P · V for 16 * K2 keys stored row-major (stride STRIDE halves) from `values`.
template <int D, int STRIDE, int K2>
__device__ __forceinline__ void flash_accumulate(float (&out)[D / 8][4], const u32 (&p)[K2][4], u32 values) {
    const u32 lane = threadIdx.x & 31, i = lane >> 3, r = lane & 7;
#pragma unroll
    for (int kk = 0; kk < K2; ++kk) {
#pragma unroll
        for (int dp = 0; dp < D / 16; ++dp) {
            u32 b[4];
            const u32 key = kk * 16 + (i & 1) * 8 + r, dim = dp * 16 + (i >> 1) * 8;
            load_matrix_x4_trans(b, values + (key * STRIDE + dim) * 2);
            mma_16816(out[2 * dp], p[kk], b[0], b[1]);
            mma_16816(out[2 * dp + 1], p[kk], b[2], b[3]);
        }
    }
}

// A tensor-core prefill warp's rows (g and g + 8 of its 16, from `first_row`) below
// `span_end`: their positions (-1 past the span: no key visible) and first visible keys, the
// warp's key range [begin, end) and the range [full_begin, full_end) all its rows see whole.
struct MmaPrefillRows {
    i32 rows[2], positions[2], lows[2], begin, end, full_begin, full_end;
    __device__ __forceinline__ MmaPrefillRows(const i32* step, i32 first_row, i32 span_end, u32 window) {
        const StepHeader* h = (const StepHeader*)step;
        const u32 lane = threadIdx.x & 31, g = lane >> 2;
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            rows[r] = first_row + (i32)(g + 8 * r);
            const bool valid = rows[r] < span_end;
            positions[r] = valid ? step[h->positions + rows[r]] : -1;
            lows[r] = valid ? (window == 0 ? 0 : max(0, positions[r] + 1 - (i32)window)) : 0x7fffffff;
        }
        begin = min(lows[0], lows[1]);
        end = max(positions[0], positions[1]) + 1;
        full_begin = max(lows[0] == 0x7fffffff ? 0 : lows[0], lows[1] == 0x7fffffff ? 0 : lows[1]);
        full_end = min(positions[0], positions[1]) + 1;
#pragma unroll
        for (int offset = 4; offset < 32; offset <<= 1) {
            begin = min(begin, __shfl_xor_sync(0xffffffffu, begin, offset));
            end = max(end, __shfl_xor_sync(0xffffffffu, end, offset));
            full_begin = max(full_begin, __shfl_xor_sync(0xffffffffu, full_begin, offset));
            full_end = min(full_end, __shfl_xor_sync(0xffffffffu, full_end, offset));
        }
    }
    // Log2-unit scores of key tile `tile` (16 N keys) masked: keys outside a row's range at -inf.
    template <int N>
    __device__ __forceinline__ void mask(float (&s)[N][4], i32 tile, float scale_log2) const {
        const u32 t = threadIdx.x & 3;
        const bool masked = !(tile >= full_begin && tile + 8 * N <= full_end);
#pragma unroll
        for (int n = 0; n < N; ++n) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const i32 key = tile + n * 8 + 2 * (i32)t + (e & 1);
                const int r = e >> 1;
                const bool visible = !masked || (key >= lows[r] && key <= positions[r]);
                s[n][e] = visible ? s[n][e] * scale_log2 : NEG_INF;
            }
        }
    }
};

// A tensor-core prefill block's key range, the union of its WARPS warps' [begin, end) as they
// published them in shared memory before a barrier (begin >= end: no valid row).
template <int WARPS>
__device__ __forceinline__ int2 mma_block_range(const i32* warp_begin, const i32* warp_end) {
    int2 range = make_int2(0x7fffffff, 0);
#pragma unroll
    for (int w = 0; w < WARPS; ++w) {
        range.x = min(range.x, warp_begin[w]);
        range.y = max(range.y, warp_end[w]);
    }
    return range;
}
