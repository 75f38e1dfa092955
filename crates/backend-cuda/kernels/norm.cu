// RMS normalisation of rows: out = x * (1 / sqrt(mean(x²) + eps)) * weight, with the CPU
// reference's precision: each square rounded to f32, the squares summed in f64, the mean
// rounded to f32.
//
// Launch: blockDim (threads_x, rows_per_block). Small rows (up to 256 values) take one warp
// each (threads_x = 32, several rows per block); longer rows take a whole block each
// (rows_per_block = 1, threads_x a multiple of 32 up to 1024).
#include "common.cuh"

__device__ __forceinline__ double warp_sum_f64(double v) {
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
    return v;
}

// 1 / sqrt(mean(x²) + eps) of the row `x` of `width` values, reduced over threadIdx.x.
__device__ __forceinline__ float inverse_rms(const float* x, u32 width, float eps) {
    __shared__ double scratch[32];
    double sum = 0.0;
#pragma unroll 4
    for (u32 i = threadIdx.x; i < width; i += blockDim.x) {
        const float value = x[i];
        sum += (double)__fmul_rn(value, value);
    }
    sum = warp_sum_f64(sum);
    if (blockDim.x > 32) {
        // One row per block here (blockDim.y == 1).
        const u32 lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
        if (lane == 0) scratch[warp] = sum;
        __syncthreads();
        const u32 warps = (blockDim.x + 31) >> 5;
        sum = warp_sum_f64(lane < warps ? scratch[lane] : 0.0);
    }
    const float mean = (float)(sum / (double)width);
    return 1.0f / sqrtf(mean + eps);
}

// out[r] = x[r] / rms(x[r]) * weight for rows r < rows; x and out do not overlap.
extern "C" __global__ void rms_norm_f32(float* out, const float* x, const float* weight, u32 width, float eps, u32 rows) { pdl_start();
    const u32 row = blockIdx.x * blockDim.y + threadIdx.y;
    if (row >= rows) return;  // whole rows (and so whole reducing groups) leave together
    const float* src = x + (u64)row * width;
    float* dst = out + (u64)row * width;
    const float scale = inverse_rms(src, width, eps);
    for (u32 i = threadIdx.x; i < width; i += blockDim.x) dst[i] = src[i] * scale * weight[i];
}

// rms_norm_f32 writing back into x (each value is read before the same thread overwrites it).
extern "C" __global__ void rms_norm_in_place_f32(float* x, const float* weight, u32 width, float eps, u32 rows) { pdl_start();
    const u32 row = blockIdx.x * blockDim.y + threadIdx.y;
    if (row >= rows) return;
    float* values = x + (u64)row * width;
    const float scale = inverse_rms(values, width, eps);
    for (u32 i = threadIdx.x; i < width; i += blockDim.x) values[i] = values[i] * scale * weight[i];
}
