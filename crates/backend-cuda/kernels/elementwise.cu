// Element-wise kernels on f32 activations: residual add, SwiGLU, bias, copy.
#include "common.cuh"

// dst[i] += src[i]
extern "C" __global__ void add_f32(float* dst, const float* src, u64 n) { pdl_start();
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) {
        dst[i] += src[i];
    }
}

// dst[i] = src[i]
extern "C" __global__ void copy_f32(float* dst, const float* src, u64 n) { pdl_start();
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) {
        dst[i] = src[i];
    }
}

// gate[i] = silu(gate[i]) * up[i], silu(x) = x / (1 + e^-x). The product is rounded on its
// own (no fused multiply-add), as the CPU reference computes it.
extern "C" __global__ void silu_mul_f32(float* gate, const float* up, u64 n) { pdl_start();
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) {
        const float x = gate[i];
        gate[i] = __fmul_rn(x / (1.0f + expf(-x)), up[i]);
    }
}

// x[t][c] += bias[c] for the first n = tokens × width elements of x ([tokens, width]).
extern "C" __global__ void add_bias_f32(float* x, const float* bias, u64 width, u64 n) { pdl_start();
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) {
        x[i] += bias[i % width];
    }
}
