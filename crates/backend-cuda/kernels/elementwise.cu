// Element-wise kernels on f32 activations: residual add, SwiGLU, bias, copy.
#include "common.cuh"

// dst[i] += src[i]
extern "C" __global__ void add_f32(float* dst, const float* src, u64 n) {
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) {
        dst[i] += src[i];
    }
}

// dst[i] = src[i]
extern "C" __global__ void copy_f32(float* dst, const float* src, u64 n) {
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) {
        dst[i] = src[i];
    }
}
