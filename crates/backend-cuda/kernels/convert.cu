// Conversions feeding the matmul kernels: f32 activations to q8_1 blocks (decode matvec) or
// to f16 (tensor-core GEMM), and packed weights dequantized to an f16 staging matrix.
#include "dequant.cuh"

// f32 [n] (n a multiple of 32) to q8_1 blocks: aq [n] int8, ads [n / 32] (d, d * sum of
// the block's int8 values), d = max |x| / 127. One warp per block of 32.
extern "C" __global__ void quantize_q8_1(const float* __restrict__ x, i8* __restrict__ aq, float2* __restrict__ ads,
                                         u64 n) {
    const u64 warps = (u64)gridDim.x * (blockDim.x >> 5);
    const int lane = threadIdx.x & 31;
    for (u64 block = (u64)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5); block < n / 32; block += warps) {
        const float v = x[block * 32 + lane];
        const float amax = warp_max(fabsf(v));
        const float d = amax / 127.0f;
        const int q = amax == 0.0f ? 0 : __float2int_rn(v / d);
        aq[block * 32 + lane] = (i8)q;
        const float sum = warp_sum((float)q);
        if (lane == 0) ads[block] = make_float2(d, d * sum);
    }
}

// out[i] = f16(x[i])
extern "C" __global__ void convert_f32_f16(const float* __restrict__ x, u16* __restrict__ out, u64 n) {
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) {
        out[i] = float_to_half(x[i]);
    }
}

// Rows [0, rows) of a weight (rows of row_bytes bytes, width elements) to f16 [rows][width].
// One thread per group of 8 elements; width % 8 == 0 gives one 16-byte store per thread.
template <class W>
__device__ __forceinline__ void dequant_f16(const u8* __restrict__ w, u64 row_bytes, u64 width, u64 rows,
                                            u16* __restrict__ out) {
    const u64 groups_per_row = (width + 7) / 8;
    const u64 total = groups_per_row * rows;
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (u64)gridDim.x * blockDim.x) {
        const u64 row = i / groups_per_row, g = i % groups_per_row;
        float v[8];
        const int valid = dequant_group<W>(w + row * row_bytes, width, g, v);
        u16* dst = out + row * width + 8 * g;
        if (valid == 8 && width % 8 == 0) {
            uint4 packed;
            packed.x = (u32)float_to_half(v[0]) | ((u32)float_to_half(v[1]) << 16);
            packed.y = (u32)float_to_half(v[2]) | ((u32)float_to_half(v[3]) << 16);
            packed.z = (u32)float_to_half(v[4]) | ((u32)float_to_half(v[5]) << 16);
            packed.w = (u32)float_to_half(v[6]) | ((u32)float_to_half(v[7]) << 16);
            *(uint4*)dst = packed;
        } else {
            for (int k = 0; k < valid; k++) dst[k] = float_to_half(v[k]);
        }
    }
}

#define DEQUANT_F16(W, name)                                                                        \
    extern "C" __global__ void dequant_f16_##name(const u8* w, u64 row_bytes, u64 width, u64 rows, \
                                                  u16* out) {                                       \
        dequant_f16<W>(w, row_bytes, width, rows, out);                                             \
    }

DEQUANT_F16(BF16, bf16)
DEQUANT_F16(Q4_0, q4_0)
DEQUANT_F16(Q4_1, q4_1)
DEQUANT_F16(Q5_0, q5_0)
DEQUANT_F16(Q5_1, q5_1)
DEQUANT_F16(Q8_0, q8_0)
DEQUANT_F16(IQ4_NL, iq4_nl)
DEQUANT_F16(Q2_K, q2_k)
DEQUANT_F16(Q3_K, q3_k)
DEQUANT_F16(Q4_K, q4_k)
DEQUANT_F16(Q5_K, q5_k)
DEQUANT_F16(Q6_K, q6_k)
DEQUANT_F16(IQ4_XS, iq4_xs)
