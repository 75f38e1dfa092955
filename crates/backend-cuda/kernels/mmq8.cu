// Integer batched matmul of the quantized types (mmq8_<type>_n<NT>): the activations are the
// matvecs' q8 quantization (quantize.cuh: int8 values, one scale per 32), the weights are
// unpacked per warp into int8 slabs with one float scale d (and offset m) per sub-block of
// SUB elements, x = d * q + m, and the tensor cores multiply int8 by int8 (mma.sync
// m16n8k32 for 32-element sub-blocks, two m16n8k16 for 16-element ones). Each sub-block's
// integer sums are scaled once: sum_k x_k a_k = d * da * sum(q * qa) + m * da * sum(qa).
// The layout of the tiles is the f16 kernel's (an int8 k32 fragment is a f16 k16 fragment of
// the same bytes), as are the split ranges and their merge (mmq_finish).

#include "mmq.cuh"

#define MMQ8_CHUNK 256
#define MMQ8_SLAB 64
// 16 bytes of padding per row: the 8 rows of an ldmatrix read start 4 banks apart.
#define MMQ8_X_STRIDE (MMQ8_CHUNK + 16)
#define MMQ8_W_STRIDE (MMQ8_SLAB + 16)

// Bytes v (each below 2c) minus c as int8, eight at once with no carry between bytes.
__device__ __forceinline__ u64 bytes_minus(u64 v, u32 c) {
    return (v + (u64)(0x80u - c) * 0x0101010101010101ull) ^ 0x8080808080808080ull;
}
// Bits 0..7 of x as bit 4 of bytes 0..7.
__device__ __forceinline__ u64 bits_to_bit4(u32 x) {
    const u64 spread = ((u64)(x & 0xffu) * 0x0101010101010101ull) & 0x8040201008040201ull;
    return ((spread + 0x7f7f7f7f7f7f7f7full) & 0x8080808080808080ull) >> 3;
}
// Low nibbles (shift 0) or high nibbles (shift 4) of eight bytes.
__device__ __forceinline__ u64 nibbles(u64 bytes, int shift) { return (bytes >> shift) & 0x0f0f0f0f0f0f0f0full; }
// IQ4_NL_VALUES of eight nibbles (one per byte).
__device__ __forceinline__ u64 iq4_lookup8(u64 n) {
    return (u64)(u32)iq4_lookup((u32)n) | ((u64)(u32)iq4_lookup((u32)(n >> 32)) << 32);
}

// Per type: SUB (elements per scale), MIN (an offset m per sub-block), and
// unpack(block, c, q, d, m): elements 8c .. 8c+7 of the block as int8 q with x = d * q + m.
template <class W> struct I8;
template <> struct I8<Q4_0> {
    static constexpr int SUB = 32;
    static constexpr bool MIN = false;
    static __device__ __forceinline__ void unpack(const u8* b, int c, u64& q, float& d, float& m) {
        q = bytes_minus(nibbles(load_8_a2(b + 2 + 8 * (c & 1)), (c >> 1) * 4), 8);
        d = load_half(b);
        m = 0.0f;
    }
};
template <> struct I8<Q4_1> {
    static constexpr int SUB = 32;
    static constexpr bool MIN = true;
    static __device__ __forceinline__ void unpack(const u8* b, int c, u64& q, float& d, float& m) {
        q = nibbles(load_8_a2(b + 4 + 8 * (c & 1)), (c >> 1) * 4);
        d = load_half(b);
        m = load_half(b + 2);
    }
};
template <> struct I8<Q5_0> {
    static constexpr int SUB = 32;
    static constexpr bool MIN = false;
    static __device__ __forceinline__ void unpack(const u8* b, int c, u64& q, float& d, float& m) {
        const u32 qh = load_u32_a2(b + 2);
        q = bytes_minus(nibbles(load_8_a2(b + 6 + 8 * (c & 1)), (c >> 1) * 4) | bits_to_bit4(qh >> (8 * c)), 16);
        d = load_half(b);
        m = 0.0f;
    }
};
template <> struct I8<Q5_1> {
    static constexpr int SUB = 32;
    static constexpr bool MIN = true;
    static __device__ __forceinline__ void unpack(const u8* b, int c, u64& q, float& d, float& m) {
        const u32 qh = load_u32_a4(b + 4);
        q = nibbles(load_8_a2(b + 8 + 8 * (c & 1)), (c >> 1) * 4) | bits_to_bit4(qh >> (8 * c));
        d = load_half(b);
        m = load_half(b + 2);
    }
};
template <> struct I8<Q8_0> {
    static constexpr int SUB = 32;
    static constexpr bool MIN = false;
    static __device__ __forceinline__ void unpack(const u8* b, int c, u64& q, float& d, float& m) {
        q = load_8_a2(b + 2 + 8 * c);
        d = load_half(b);
        m = 0.0f;
    }
};
template <> struct I8<IQ4_NL> {
    static constexpr int SUB = 32;
    static constexpr bool MIN = false;
    static __device__ __forceinline__ void unpack(const u8* b, int c, u64& q, float& d, float& m) {
        q = iq4_lookup8(nibbles(load_8_a2(b + 2 + 8 * (c & 1)), (c >> 1) * 4));
        d = load_half(b);
        m = 0.0f;
    }
};
template <> struct I8<Q2_K> {
    static constexpr int SUB = 16;
    static constexpr bool MIN = true;
    static __device__ __forceinline__ void unpack(const u8* b, int c, u64& q, float& d, float& m) {
        const KGroup at(c);
        const int sc = b[8 * at.h + 2 * at.g + (at.k0 >> 4)];
        q = (load_8_a2(b + 16 + 32 * at.h + at.k0) >> (2 * at.g)) & 0x0303030303030303ull;
        d = load_half(b + 80) * (float)(sc & 15);
        m = -load_half(b + 82) * (float)(sc >> 4);
    }
};
template <> struct I8<Q3_K> {
    static constexpr int SUB = 16;
    static constexpr bool MIN = false;
    static __device__ __forceinline__ void unpack(const u8* b, int c, u64& q, float& d, float& m) {
        const KGroup at(c);
        const u64 low = (load_8_a2(b + 32 + 32 * at.h + at.k0) >> (2 * at.g)) & 0x0303030303030303ull;
        const u64 high = (load_8_a2(b + at.k0) >> (4 * at.h + at.g)) & 0x0101010101010101ull;
        // low - 4 where the high bit is clear, low where it is set: (low + 4 high) - 4.
        q = bytes_minus(low | (high << 2), 4);
        d = load_half(b + 108) * (float)q3_k_scale(8 * at.h + 2 * at.g + (at.k0 >> 4), b + 96);
        m = 0.0f;
    }
};
template <> struct I8<Q4_K> {
    static constexpr int SUB = 32;
    static constexpr bool MIN = true;
    static __device__ __forceinline__ void unpack(const u8* b, int c, u64& q, float& d, float& m) {
        const int pair = c >> 3, s = (c >> 2) & 1, l0 = 8 * (c & 3);
        int scale, min;
        scale_min_k4(2 * pair + s, b + 4, &scale, &min);
        q = nibbles(load_8_a8(b + 16 + 32 * pair + l0), 4 * s);
        d = load_half(b) * (float)scale;
        m = -load_half(b + 2) * (float)min;
    }
};
template <> struct I8<Q5_K> {
    static constexpr int SUB = 32;
    static constexpr bool MIN = true;
    static __device__ __forceinline__ void unpack(const u8* b, int c, u64& q, float& d, float& m) {
        const int pair = c >> 3, s = (c >> 2) & 1, l0 = 8 * (c & 3);
        int scale, min;
        scale_min_k4(2 * pair + s, b + 4, &scale, &min);
        const u64 high = (load_8_a8(b + 16 + l0) >> (2 * pair + s)) & 0x0101010101010101ull;
        q = nibbles(load_8_a8(b + 48 + 32 * pair + l0), 4 * s) | (high << 4);
        d = load_half(b) * (float)scale;
        m = -load_half(b + 2) * (float)min;
    }
};
template <> struct I8<Q6_K> {
    static constexpr int SUB = 16;
    static constexpr bool MIN = false;
    static __device__ __forceinline__ void unpack(const u8* b, int c, u64& q, float& d, float& m) {
        const KGroup at(c);
        const u64 low = nibbles(load_8_a2(b + 64 * at.h + 32 * (at.g & 1) + at.k0), 4 * (at.g >> 1));
        const u64 high = (load_8_a2(b + 128 + 32 * at.h + at.k0) >> (2 * at.g)) & 0x0303030303030303ull;
        q = bytes_minus(low | (high << 4), 32);
        d = load_half(b + 208) * (float)(i8)b[192 + 8 * at.h + (at.k0 >> 4) + 2 * at.g];
        m = 0.0f;
    }
};
template <> struct I8<IQ4_XS> {
    static constexpr int SUB = 32;
    static constexpr bool MIN = false;
    static __device__ __forceinline__ void unpack(const u8* b, int c, u64& q, float& d, float& m) {
        const int ib = c >> 2, s = (c >> 1) & 1, j0 = 8 * (c & 1);
        const int low = (b[4 + (ib >> 1)] >> (4 * (ib & 1))) & 15;
        const int high = (load_u16(b + 2) >> (2 * ib)) & 3;
        q = iq4_lookup8(nibbles(load_8_a2(b + 8 + 16 * ib + j0), 4 * s));
        d = load_half(b) * (float)((low | (high << 4)) - 32);
        m = 0.0f;
    }
};

// c += a · b for one 16x8x32 int8 tile (fragments as mma_16816's, four int8 per register).
__device__ __forceinline__ void mma_s8_k32(int (&c)[4], const u32 (&a)[4], u32 b0, u32 b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
// c += a · b for one 16x8x16 int8 tile (a: rows g and g + 8 at k 4t .. 4t+3; b: k 4t .. 4t+3).
__device__ __forceinline__ void mma_s8_k16(int (&c)[4], u32 a0, u32 a1, u32 b0) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5}, {%6}, {%0, %1, %2, %3};"
                 : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
                 : "r"(a0), "r"(a1), "r"(b0));
}

// acc += the sub-block's integer sums c scaled: rows wd/wm (rows g, g + 8), tokens xd/xs
// (tokens 2t, 2t + 1).
template <bool MIN>
__device__ __forceinline__ void mmq8_scale(float (&acc)[4], const int (&c)[4], const float (&wd)[2],
                                           const float (&wm)[2], const float (&xd)[2], const float (&xs)[2]) {
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const int r = i >> 1, k = i & 1;
        acc[i] = fmaf((float)c[i], wd[r] * xd[k], acc[i]);
        if constexpr (MIN) acc[i] = fmaf(wm[r], xs[k], acc[i]);
    }
}

template <class W, int NT>
__device__ __forceinline__ void mmq8(const u8* __restrict__ w, u64 row_bytes, u32 n_in, u32 n_out,
                                     const i8* __restrict__ aq, const float2* __restrict__ ads, u32 tokens,
                                     u32 split, float* __restrict__ out, const float* __restrict__ bias,
                                     float* __restrict__ partial) {
    constexpr int SUB = I8<W>::SUB;
    constexpr bool MIN = I8<W>::MIN;
    constexpr int TOKENS = 8 * NT;
    constexpr int WSUBS = MMQ8_SLAB / SUB;
    __shared__ __align__(16) i8 staged[TOKENS][MMQ8_X_STRIDE];
    __shared__ float staged_d[TOKENS][MMQ8_CHUNK / 32];
    __shared__ float staged_s[MIN ? TOKENS : 1][MMQ8_CHUNK / SUB];
    __shared__ __align__(16) i8 slab[MMQ_THREADS / 32][MMQ_WARP_ROWS][MMQ8_W_STRIDE];
    __shared__ float slab_d[MMQ_THREADS / 32][MMQ_WARP_ROWS][WSUBS];
    __shared__ float slab_m[MIN ? MMQ_THREADS / 32 : 1][MMQ_WARP_ROWS][WSUBS];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int g = lane >> 2, t = lane & 3;
    const u32 row0 = blockIdx.x * MMQ_BLOCK_ROWS + warp * MMQ_WARP_ROWS;
    const u32 token0 = blockIdx.y * TOKENS;
    const u32 k_begin = blockIdx.z * split;
    const u32 k_end = min(n_in, k_begin + split);
    i8 (*rows)[MMQ8_W_STRIDE] = slab[warp];
    float (*rows_d)[WSUBS] = slab_d[warp];
    float (*rows_m)[WSUBS] = slab_m[MIN ? warp : 0];
    // ldmatrix addresses (bytes): A lanes 0-15 rows 0-15 at k 0, lanes 16-31 at k 16; B lane
    // group q = lane / 8 reads token tile q / 2 at k 16 (q % 2).
    const u32 a_address = shared_address(&rows[lane & 15][(lane >> 4) * 16]);
    const u32 b_address = shared_address(&staged[8 * (lane >> 4) + (lane & 7)][((lane >> 3) & 1) * 16]);
    float acc[2][NT][4];
#pragma unroll
    for (int m = 0; m < 2; m++)
#pragma unroll
        for (int n = 0; n < NT; n++)
#pragma unroll
            for (int i = 0; i < 4; i++) acc[m][n][i] = 0.0f;
    mmq_prefetch_then_wait(w, row_bytes, n_in, n_out, k_begin, k_end);
    mmq_prefetch_rows_l1(w, row_bytes, n_in, n_out, row0, k_begin, min((u32)MMQ8_CHUNK, k_end - k_begin));

    constexpr int GROUPS = W::QK / 8;
    for (u32 k0 = k_begin; k0 < k_end; k0 += MMQ8_CHUNK) {
        // A multiple of MMQ8_SLAB (ranges and rows are multiples of 128).
        const u32 chunk = min((u32)MMQ8_CHUNK, k_end - k0);
        if (k0 + chunk < k_end)
            mmq_prefetch_rows_l1(w, row_bytes, n_in, n_out, row0, k0 + chunk, min((u32)MMQ8_CHUNK, k_end - k0 - chunk));
        const u32 parts = chunk / 16;
        __syncthreads();
        for (u32 p = threadIdx.x; p < TOKENS * parts; p += MMQ_THREADS) {
            const u32 token = p / parts, part = p % parts;
            uint4 v = make_uint4(0, 0, 0, 0);
            if (token0 + token < tokens) v = *(const uint4*)(aq + (u64)(token0 + token) * n_in + k0 + 16 * part);
            *(uint4*)&staged[token][16 * part] = v;
        }
        for (u32 p = threadIdx.x; p < TOKENS * (chunk / 32); p += MMQ_THREADS) {
            const u32 token = p / (chunk / 32), block = p % (chunk / 32);
            staged_d[token][block] =
                token0 + token < tokens ? ads[((u64)(token0 + token) * n_in + k0) / 32 + block].x : 0.0f;
        }
        __syncthreads();
        if constexpr (MIN) {
            // The activations' sums per sub-block (d times the integer sum).
            for (u32 p = threadIdx.x; p < TOKENS * (chunk / SUB); p += MMQ_THREADS) {
                const u32 token = p / (chunk / SUB), sub = p % (chunk / SUB);
                const int* words = (const int*)&staged[token][SUB * sub];
                int sum = 0;
#pragma unroll
                for (int i = 0; i < SUB / 4; i++) sum = __dp4a(words[i], 0x01010101, sum);
                staged_s[token][sub] = staged_d[token][SUB * sub / 32] * (float)sum;
            }
            __syncthreads();
        }
        for (u32 step = 0; step < chunk; step += MMQ8_SLAB) {
            // The warp's 32 rows x MMQ8_SLAB elements as int8: lane l takes group l % 8 of
            // rows l / 8, l / 8 + 4, ... (neighbouring lanes read one row).
            const u64 group = (k0 + step) / 8 + (lane & 7);
            u64 q[MMQ_WARP_ROWS / 4];
            float d[MMQ_WARP_ROWS / 4], m[MMQ_WARP_ROWS / 4];
#pragma unroll
            for (int i = 0; i < MMQ_WARP_ROWS / 4; i++) {
                const u8* row = w + (u64)min(row0 + 4 * i + (lane >> 3), n_out - 1) * row_bytes;
                I8<W>::unpack(row + (group / GROUPS) * W::BYTES, (int)(group % GROUPS), q[i], d[i], m[i]);
            }
            __syncwarp();
#pragma unroll
            for (int i = 0; i < MMQ_WARP_ROWS / 4; i++) {
                const int r = 4 * i + (lane >> 3);
                *(u64*)&rows[r][8 * (lane & 7)] = q[i];
                if ((8 * (lane & 7)) % SUB == 0) {
                    rows_d[r][8 * (lane & 7) / SUB] = d[i];
                    if constexpr (MIN) rows_m[r][8 * (lane & 7) / SUB] = m[i];
                }
            }
            __syncwarp();
#pragma unroll
            for (int kk = 0; kk < MMQ8_SLAB; kk += 32) {
                u32 a[2][4];
#pragma unroll
                for (int mt = 0; mt < 2; mt++) load_matrix_x4(a[mt], a_address + 16 * mt * MMQ8_W_STRIDE + kk);
                // Weight scales of rows g, g + 8 of each m16 tile, per 16 or 32 elements.
                constexpr int HALVES = SUB == 16 ? 2 : 1;
                float wd[2][HALVES][2], wm[2][HALVES][2];
#pragma unroll
                for (int mt = 0; mt < 2; mt++)
#pragma unroll
                    for (int h = 0; h < HALVES; h++)
#pragma unroll
                        for (int r = 0; r < 2; r++) {
                            const int sub = (kk + 16 * h) / SUB;
                            wd[mt][h][r] = rows_d[16 * mt + 8 * r + g][sub];
                            wm[mt][h][r] = MIN ? rows_m[16 * mt + 8 * r + g][sub] : 0.0f;
                        }
                const u32 xblock = (step + kk) / 32;
#pragma unroll
                for (int n = 0; n < NT; n += 2) {
                    u32 b[4];
                    load_matrix_x4(b, b_address + 8 * n * MMQ8_X_STRIDE + step + kk);
#pragma unroll
                    for (int nn = 0; nn < 2; nn++) {
                        const int tile = n + nn;
                        const float xd[2] = {staged_d[8 * tile + 2 * t][xblock], staged_d[8 * tile + 2 * t + 1][xblock]};
#pragma unroll
                        for (int h = 0; h < HALVES; h++) {
                            float xs[2] = {0.0f, 0.0f};
                            if constexpr (MIN) {
                                const u32 xsub = (step + kk + 16 * h) / SUB;
                                xs[0] = staged_s[8 * tile + 2 * t][xsub];
                                xs[1] = staged_s[8 * tile + 2 * t + 1][xsub];
                            }
#pragma unroll
                            for (int mt = 0; mt < 2; mt++) {
                                int c[4] = {0, 0, 0, 0};
                                if constexpr (SUB == 32)
                                    mma_s8_k32(c, a[mt], b[2 * nn], b[2 * nn + 1]);
                                else
                                    mma_s8_k16(c, a[mt][2 * h], a[mt][2 * h + 1], b[2 * nn + h]);
                                mmq8_scale<MIN>(acc[mt][tile], c, wd[mt][h], wm[mt][h], xd, xs);
                            }
                        }
                    }
                }
            }
        }
    }
    mmq_finish<NT>(acc, out, bias, partial, row0, token0, tokens, n_out, g, t);
}

// Knob (RUNIT_CUDA_DEFINES): the fewest blocks per multiprocessor the compiler must fit
// (a register cap; 1 = the compiler's choice).
#ifndef MMQ8_MIN_BLOCKS
#define MMQ8_MIN_BLOCKS 1
#endif

#define MMQ8_KERNEL(W, name, NT)                                                                              \
    extern "C" __global__ void __launch_bounds__(MMQ_THREADS, MMQ8_MIN_BLOCKS) mmq8_##name##_n##NT(                          \
        const u8* w, u64 row_bytes, u32 n_in, u32 n_out, const i8* aq, const float2* ads, u32 tokens,        \
        u32 split, float* out, const float* bias, float* partial) {                           \
        mmq8<W, NT>(w, row_bytes, n_in, n_out, aq, ads, tokens, split, out, bias, partial);         \
    }

// Token tiles of 16, 32 and 64 rows.
#define MMQ8_ENTRIES(W, name) MMQ8_KERNEL(W, name, 2) MMQ8_KERNEL(W, name, 4) MMQ8_KERNEL(W, name, 8)

MMQ8_ENTRIES(Q4_0, q4_0)
MMQ8_ENTRIES(Q4_1, q4_1)
MMQ8_ENTRIES(Q5_0, q5_0)
MMQ8_ENTRIES(Q5_1, q5_1)
MMQ8_ENTRIES(Q8_0, q8_0)
MMQ8_ENTRIES(IQ4_NL, iq4_nl)
MMQ8_ENTRIES(Q2_K, q2_k)
MMQ8_ENTRIES(Q3_K, q3_k)
MMQ8_ENTRIES(Q4_K, q4_k)
MMQ8_ENTRIES(Q5_K, q5_k)
MMQ8_ENTRIES(Q6_K, q6_k)
MMQ8_ENTRIES(IQ4_XS, iq4_xs)
