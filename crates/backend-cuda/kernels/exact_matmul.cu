// Exact-numerics matmul along the CPU's plain vec_dot path: activations quantized as
// ggml-cpu's x86 build quantizes them, then every output one dot product in the order of the
// Rust scalar twin (see exact_dot.cuh), so results equal the CPU's bit for bit. Speed is not
// the point: one thread per output or per activation block, grid-stride loops, any grid and
// block shape. Compile with --fmad=false.
//
// Activation quantizers, x [rows][n] f32 -> out [rows][row_bytes] with row_bytes =
// activation_row_bytes(format, n) (n a multiple of the format's block size):
//   exact_quantize_f32 (const float* x, u8* out, u32 rows, u32 n)  row_bytes 4 n
//       dot/mod.rs::quantize_activation (ActivationFormat::F32: the bits copied)
//   exact_quantize_f16 (same parameters)  row_bytes 2 n
//       dot/mod.rs::quantize_activation (ActivationFormat::F16: half::f16::from_f32)
//   exact_quantize_bf16 (same parameters)  row_bytes 2 n
//       dot/mod.rs::quantize_activation (ActivationFormat::BF16: half::bf16::from_f32)
//   exact_quantize_q8_0 (same parameters, n % 32 == 0)  row_bytes n / 32 * 34
//       quantize/q8.rs::quantize_row_q8_0_activation (its x86 kernel x86::quantize_activation_block)
//   exact_quantize_q8_1 (same parameters, n % 32 == 0)  row_bytes n / 32 * 36
//       quantize/q8.rs::quantize_row_q8_1_activation (its x86 kernel x86::quantize_block_q8_1)
//   exact_quantize_q8_k (same parameters, n % 256 == 0)  row_bytes n / 256 * 292
//       quantize/q8.rs::quantize_row_q8_k
// One thread per element (float formats) or per block (32 or 256 values); the rows are
// contiguous, so a row of blocks is just the next blocks.
//
// Matmuls, out[t * n_out + o] = dot(weight row o, activation row t):
//   exact_matmul_<type>(const u8* w, const u8* a, float* out, u32 n, u32 n_out, u32 tokens,
//                       u64 w_row_bytes, u64 a_row_bytes)
//     w: n_out weight rows of n elements, w_row_bytes apart (GGUF bytes, no alignment needed);
//     a: tokens activation rows in the type's activation format, a_row_bytes apart;
//     out: [tokens][n_out] f32. n is a multiple of the type's block size.
//   type      activation   mirrors
//   f32       f32 rows     dot/float.rs::dot_f32
//   f16       f16 rows     dot/float.rs::dot_f16 (dot_f16_with, half_arith.rs::dot_body_scalar)
//   bf16      bf16 rows    dot/float.rs::dot_bf16
//   q4_0      Q8_0         dot/legacy.rs::dot_q4_0
//   q4_1      Q8_1         dot/legacy.rs::dot_q4_1
//   q5_0      Q8_0         dot/legacy.rs::dot_q5_0
//   q5_1      Q8_1         dot/legacy.rs::dot_q5_1
//   q8_0      Q8_0         dot/legacy.rs::dot_q8_0
//   iq4_nl    Q8_0         dot/legacy.rs::dot_iq4_nl
//   q2_k      Q8_K         dot/kquants.rs::dot_q2_k
//   q3_k      Q8_K         dot/kquants.rs::dot_q3_k
//   q4_k      Q8_K         dot/kquants.rs::dot_q4_k
//   q5_k      Q8_K         dot/kquants.rs::dot_q5_k
//   q6_k      Q8_K         dot/kquants.rs::dot_q6_k
//   iq4_xs    Q8_K         dot/kquants.rs::dot_iq4_xs
// One thread per output.
#include "exact_dot.cuh"

// Every unit u < units (an element or an activation block) through `Quantize` on its own, as
// a row of one unit: `values` f32 in, `bytes` bytes out.
template <void (*Quantize)(const float*, unsigned, u8*)>
__device__ __forceinline__ void quantize_units(const float* x, u8* out, u64 units, u32 values, u32 bytes) {
    for (u64 u = (u64)blockIdx.x * blockDim.x + threadIdx.x; u < units; u += (u64)gridDim.x * blockDim.x)
        Quantize(x + u * values, values, out + u * bytes);
}

#define EXACT_QUANTIZE(name, values, bytes)                                                                 \
    extern "C" __global__ void exact_quantize_##name(const float* x, u8* out, u32 rows, u32 n) {          \
        pdl_launch_dependents();                                                                            \
        pdl_wait();                                                                                         \
        quantize_units<exact_quantize_row_##name>(x, out, (u64)rows * n / (values), values, bytes);        \
    }

EXACT_QUANTIZE(f32, 1, 4)
EXACT_QUANTIZE(f16, 1, 2)
EXACT_QUANTIZE(bf16, 1, 2)
EXACT_QUANTIZE(q8_0, 32, exact::Q8_0_BYTES)
EXACT_QUANTIZE(q8_1, 32, exact::Q8_1_BYTES)
EXACT_QUANTIZE(q8_k, 256, exact::Q8_K_BYTES)

// out[t * n_out + o] = Dot(n, weight row o, activation row t) for every t < tokens, o < n_out.
template <float (*Dot)(unsigned, const u8*, const u8*)>
__device__ __forceinline__ void matmul_outputs(const u8* w, const u8* a, float* out, u32 n, u32 n_out, u32 tokens,
                                               u64 w_row_bytes, u64 a_row_bytes) {
    const u64 outputs = (u64)tokens * n_out;
    const u64 stride = (u64)gridDim.x * blockDim.x;
    for (u64 index = (u64)blockIdx.x * blockDim.x + threadIdx.x; index < outputs; index += stride) {
        const u64 t = index / n_out, o = index % n_out;
        out[index] = Dot(n, w + o * w_row_bytes, a + t * a_row_bytes);
    }
}

#define EXACT_MATMUL(type)                                                                                   \
    extern "C" __global__ void exact_matmul_##type(const u8* w, const u8* a, float* out, u32 n, u32 n_out,   \
                                                   u32 tokens, u64 w_row_bytes, u64 a_row_bytes) {           \
        pdl_launch_dependents();                                                                             \
        pdl_wait();                                                                                          \
        matmul_outputs<exact_dot_##type>(w, a, out, n, n_out, tokens, w_row_bytes, a_row_bytes);             \
    }

EXACT_MATMUL(f32)
EXACT_MATMUL(f16)
EXACT_MATMUL(bf16)
EXACT_MATMUL(q4_0)
EXACT_MATMUL(q4_1)
EXACT_MATMUL(q5_0)
EXACT_MATMUL(q5_1)
EXACT_MATMUL(q8_0)
EXACT_MATMUL(iq4_nl)
EXACT_MATMUL(q2_k)
EXACT_MATMUL(q3_k)
EXACT_MATMUL(q4_k)
EXACT_MATMUL(q5_k)
EXACT_MATMUL(q6_k)
EXACT_MATMUL(iq4_xs)
