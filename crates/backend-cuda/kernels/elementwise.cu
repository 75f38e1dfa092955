// Element-wise kernels on f32 activations: residual add, scale, SwiGLU, GeGLU, bias, copy.
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

// gate[i] = silu(gate[i]) * up[i] (silu_mul_value).
extern "C" __global__ void silu_mul_f32(float* gate, const float* up, u64 n) { pdl_start();
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x)
        gate[i] = silu_mul_value(gate[i], up[i]);
}

// x[t][c] += bias[c] for the first n = tokens × width elements of x ([tokens, width]).
extern "C" __global__ void add_bias_f32(float* x, const float* bias, u64 width, u64 n) { pdl_start();
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) {
        x[i] += bias[i % width];
    }
}

// gate[i] = gelu(gate[i]) * up[i] with GELU's tanh form as ggml's CPU GeGLU computes it: the
// input rounded to f16 indexes `table` (f16 results, runit_backend::gelu::table), 0 at or
// below -10, the input itself from 10 on. Exact (a lookup and one rounded product), so the
// fast and the exact modes share it.
extern "C" __global__ void gelu_mul_f32(float* gate, const float* up, const u16* table, u64 n) { pdl_start();
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) {
        const float x = gate[i];
        float y;
        if (x <= -10.0f) {
            y = 0.0f;
        } else if (x >= 10.0f) {
            y = __fmul_rn(x, up[i]);
        } else {
            y = __fmul_rn(half_to_float(table[float_to_half(x)]), up[i]);
        }
        gate[i] = y;
    }
}

// x[i] *= factor for i < n (ggml_scale: Gemma's scaled embeddings and queries).
extern "C" __global__ void scale_f32(float* x, float factor, u64 n) { pdl_start();
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) {
        x[i] = __fmul_rn(x[i], factor);
    }
}
