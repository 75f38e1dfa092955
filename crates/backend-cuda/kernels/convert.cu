// Conversions feeding the matmul kernels: f32 activations to q8_1 blocks (decode matvec) or
// to f16 (tensor-core GEMM), both with the CPU's rounding, and packed weights dequantized to
// an f16 staging matrix.
#include "dequant.cuh"
#include "quantize.cuh"

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
                                                  u16* out) { pdl_start();                                       \
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

// f32 [n] to q8_1-layout blocks rounded exactly as ggml-cpu's x86 build quantizes the
// activation side of a matmul (modes in quantize.cuh). One warp per 32 values (mode 0/1) or
// per 256 (mode 2).
extern "C" __global__ void quantize_q8_cpu(const float* __restrict__ x, i8* __restrict__ aq,
                                           float2* __restrict__ ads, u64 n, u32 mode) { pdl_start();
    const u64 warps = (u64)gridDim.x * (blockDim.x >> 5);
    const u64 warp_id = (u64)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    quantize_q8_cpu_range(x, aq, ads, n, mode, warp_id, warps);
}

// f32 [n] to the f16 GEMM operand carrying the values the CPU's matmul would see: the q8
// activations of quantize_q8_cpu dequantized (modes 0, 1, 2 as there, value = d * q), f16
// rounding (mode 3, F16 weights) or bf16 rounding (mode 4, BF16 weights). n is a multiple of
// 32 (256 for mode 2); one warp per 32 (or 256) values for modes 0-2.
extern "C" __global__ void activation_f16_cpu(const float* __restrict__ x, u16* __restrict__ out, u64 n,
                                              u32 mode) { pdl_start();
    const u64 threads = (u64)gridDim.x * blockDim.x;
    const u64 thread = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (mode >= 3) {
        for (u64 i = thread; i < n; i += threads) {
            float v = x[i];
            if (mode == 4) {
                // Round to bf16 (nearest even), as ggml's fp32 -> bf16 conversion does.
                u32 bits = __float_as_uint(v);
                if ((bits & 0x7fffffffu) <= 0x7f800000u) bits += 0x7fffu + ((bits >> 16) & 1u);
                v = __uint_as_float(bits & 0xffff0000u);
            }
            out[i] = float_to_half(v);
        }
        return;
    }
    const u64 warps = threads >> 5;
    const u32 len = mode == 2 ? 256 : 32;
    for (u64 unit = thread >> 5; unit < n / len; unit += warps) activation_f16_unit(x, out, unit, mode, threadIdx.x & 31);
}

// gate[i] = silu(gate[i]) * up[i] (silu_mul_f32's values), then out = their
// activation_f16_cpu conversion in q8 mode `mode` (0-2) for the down projection that reads
// them: one warp per unit of 32 (256 for mode 2) values, launched as activation_f16_cpu. A
// batched FFN step saves the conversion's launch and its read of gate.
extern "C" __global__ void silu_mul_f16_cpu(float* gate, const float* __restrict__ up, u16* __restrict__ out, u64 n,
                                            u32 mode) { pdl_start();
    const u64 warps = ((u64)gridDim.x * blockDim.x) >> 5;
    const int lane = threadIdx.x & 31;
    const u32 len = mode == 2 ? 256 : 32;
    for (u64 unit = ((u64)blockIdx.x * blockDim.x + threadIdx.x) >> 5; unit < n / len; unit += warps) {
        for (u32 k = lane; k < len; k += 32) {
            const u64 i = unit * len + k;
            gate[i] = silu_mul_value(gate[i], up[i]);
        }
        __syncwarp();  // the unit's values, written by the warp's lanes, read by others
        activation_f16_unit(gate, out, unit, mode, lane);
    }
}
