// Exact-numerics matmuls in llamafile's tinyBLAS order and in ggml's REPACK gemv/gemm orders
// (device twins in exact_gemm.cuh), and the activation preparation tinyBLAS adds to the plain
// quantizers of exact_matmul.cu. Results equal the CPU's bit for bit. Speed is not the point:
// one thread per output (or per value / block), grid-stride loops, any grid and block shape.
// Compile with --fmad=false.
//
// Every matmul takes (const u8* w, const u8* a, float* out, u32 n, u32 n_out, u32 tokens,
// u64 w_row_bytes, u64 a_row_bytes) as exact_matmul.cu's do: w holds n_out plain GGUF weight
// rows of n elements, w_row_bytes apart; out[t * n_out + o] = the dot product of weight row o
// with activation row t, for t < tokens, o < n_out. No alignment is needed anywhere.
//
// tinyBLAS (backend-cpu matmul/tinyblas.rs matmul_tinyblas, taken where tinyblas/mod.rs
// accepts: a plain weight, tokens >= 2; F32/F16/BF16 need n % 16 == 0 (32 for BF16) and
// n_out % 4 == 0, the Q8_0-paired types n % 32 == 0):
//   exact_tinyblas_f32   a: the f32 activation rows as they are (a_row_bytes 4 n dense)
//       tinyblas/scalar.rs float_dot (F32 weights)
//   exact_tinyblas_f16   a: exact_tinyblas_prepare_f16's f32 rows (4 n)
//       tinyblas/scalar.rs float_dot (F16 weights)
//   exact_tinyblas_bf16  a: bf16 rows from exact_quantize_bf16 (exact_matmul.cu; 2 n), which
//       is tinyblas/mod.rs prepare for BF16 (quantize_activation(BF16))
//       tinyblas/scalar.rs bf16_dot
//   exact_tinyblas_q8_0, _q4_0, _q5_0, _iq4_nl  a: exact_tinyblas_prepare_q8_0's units, the
//       last parameter being a_unit_bytes (bytes between units, n / 32 * 128 dense); token t
//       reads half t % 2 of unit t / 2
//       tinyblas/scalar.rs q0_dot (q0_block of each type)
//   exact_tinyblas_prepare_f16 (const float* x, u8* out, u32 rows, u32 n)
//       x [rows][n] f32 -> out [rows][4 n]: tinyblas/mod.rs prepare for F16, each value
//       half::f16::from_f32(v).to_f32()
//   exact_tinyblas_prepare_q8_0 (const u8* q8_0, u8* prepared, u32 rows, u32 n)
//       q8_0 [rows][n / 32 * 34]: the plain Q8_0 activation rows (exact_quantize_q8_0) ->
//       prepared [(rows + 1) / 2][n / 32 * 128]: tinyblas/mod.rs prepare_q0_scalar (the same
//       bytes as x86_q0.rs prepare), the rows paired 2u, 2u + 1 and interleaved per block
//
// REPACK (backend-cpu matmul/repacked.rs matmul_repacked and matmul/mod.rs matmul_scalar,
// for the weights ggml-cpu keeps in its REPACK buffer: ggml_repack/mod.rs is_repacked, i.e.
// Q4_0 / IQ4_NL / Q4_K / Q2_K with n_out % 8 == 0, not the token embedding):
//   exact_repack_q4_0    a: Q8_0 rows (exact_quantize_q8_0; n / 32 * 34)
//       ggml_repack/q4_0.rs dot_q4_0 (both its gemv and its gemm twin)
//   exact_repack_iq4_nl  a: Q8_0 rows
//       ggml_repack/iq4_nl.rs dot_iq4_nl (both orders)
//   exact_repack_q4_k (..., u32 gemv_only)  a: Q8_K rows (exact_quantize_q8_k; n / 256 * 292)
//       ggml_repack/q4_k.rs dot_q4_k_gemm for rows t < gemm_rows, dot_q4_k_gemv for the rest
//   exact_repack_q2_k (..., u32 gemv_only)  a: Q8_K rows
//       ggml_repack/q2_k.rs dot_q2_k_gemm for rows t < gemm_rows, dot_q2_k_gemv for the rest
//   Which order a row gets is repacked.rs gemm_rows: for a 2-D weight (Layout::Repacked,
//   MUL_MAT; gemv_only = 0) gemm_rows = tokens - tokens % 4, so the whole groups of four rows
//   from the start take gemm and the last tokens % 4 rows gemv; for one expert of a 3-D weight
//   (Layout::RepackedExpert, MUL_MAT_ID) and for a pass whose rows must each get their lone
//   bits (Parallelism::rows_alone: speculative verification) gemv_only != 0: gemm_rows = 0,
//   every row gemv. `tokens` must be the whole batch of the CPU's matmul call, since it
//   decides the split. For Q4_0 and IQ4_NL the two orders are the same arithmetic, so they
//   take no rule.
#include "exact_gemm.cuh"

// out[t * n_out + o] = dot(t, o) for every t < tokens, o < n_out.
template <class Dot>
__device__ __forceinline__ void for_each_output(float* out, u32 n_out, u32 tokens, Dot dot) {
    const u64 outputs = (u64)tokens * n_out;
    for (u64 index = (u64)blockIdx.x * blockDim.x + threadIdx.x; index < outputs; index += (u64)gridDim.x * blockDim.x)
        out[index] = dot((u32)(index / n_out), (u32)(index % n_out));
}

// Every unit u < units (a value, a block) through `each`.
template <class Each>
__device__ __forceinline__ void for_each_unit(u64 units, Each each) {
    for (u64 u = (u64)blockIdx.x * blockDim.x + threadIdx.x; u < units; u += (u64)gridDim.x * blockDim.x) each(u);
}

#define EXACT_ONE_ROW(name, dot)                                                                             \
    extern "C" __global__ void exact_##name(const u8* w, const u8* a, float* out, u32 n, u32 n_out,          \
                                            u32 tokens, u64 w_row_bytes, u64 a_row_bytes) {                  \
        pdl_launch_dependents();                                                                             \
        pdl_wait();                                                                                          \
        for_each_output(out, n_out, tokens,                                                                  \
                        [&](u32 t, u32 o) { return dot(n, w + o * w_row_bytes, a + t * a_row_bytes); });     \
    }

EXACT_ONE_ROW(tinyblas_f32, exact_dot_f32_tinyblas)
EXACT_ONE_ROW(tinyblas_f16, exact_dot_f16_tinyblas)
EXACT_ONE_ROW(tinyblas_bf16, exact_dot_bf16_tinyblas)
EXACT_ONE_ROW(repack_q4_0, exact_dot_q4_0_repack)
EXACT_ONE_ROW(repack_iq4_nl, exact_dot_iq4_nl_repack)

#define EXACT_TINYBLAS_Q0(name, BYTES, values)                                                               \
    extern "C" __global__ void exact_tinyblas_##name(const u8* w, const u8* a, float* out, u32 n, u32 n_out, \
                                                     u32 tokens, u64 w_row_bytes, u64 a_unit_bytes) {        \
        pdl_launch_dependents();                                                                             \
        pdl_wait();                                                                                          \
        for_each_output(out, n_out, tokens, [&](u32 t, u32 o) {                                              \
            return exact::tinyblas::q0_dot<BYTES, values>(n, w + o * w_row_bytes, a + (t / 2) * a_unit_bytes, \
                                                          t % 2);                                            \
        });                                                                                                  \
    }

EXACT_TINYBLAS_Q0(q8_0, Q8_0::BYTES, exact::q8_0_values)
EXACT_TINYBLAS_Q0(q4_0, Q4_0::BYTES, exact::q4_0_values)
EXACT_TINYBLAS_Q0(q5_0, Q5_0::BYTES, exact::q5_0_values)
EXACT_TINYBLAS_Q0(iq4_nl, IQ4_NL::BYTES, exact::iq4_nl_values)

#define EXACT_REPACK_K(type)                                                                                 \
    extern "C" __global__ void exact_repack_##type(const u8* w, const u8* a, float* out, u32 n, u32 n_out,   \
                                                   u32 tokens, u64 w_row_bytes, u64 a_row_bytes,             \
                                                   u32 gemv_only) {                                          \
        pdl_launch_dependents();                                                                             \
        pdl_wait();                                                                                          \
        const u32 gemm_rows = exact::repack::gemm_rows(tokens, gemv_only != 0);                              \
        for_each_output(out, n_out, tokens, [&](u32 t, u32 o) {                                              \
            const u8* row = w + o * w_row_bytes;                                                             \
            const u8* activation = a + t * a_row_bytes;                                                      \
            return t < gemm_rows ? exact_dot_##type##_gemm(n, row, activation)                               \
                                 : exact_dot_##type##_gemv(n, row, activation);                              \
        });                                                                                                  \
    }

EXACT_REPACK_K(q4_k)
EXACT_REPACK_K(q2_k)

extern "C" __global__ void exact_tinyblas_prepare_f16(const float* x, u8* out, u32 rows, u32 n) {
    pdl_launch_dependents();
    pdl_wait();
    for_each_unit((u64)rows * n, [&](u64 i) {
        exact::write_u32(out + 4 * i, __float_as_uint(exact::tinyblas::round_f16(x[i])));
    });
}

// One thread per (unit, block, half): that token's 32 flipped quants and eight copies of its
// widened scale, or 0x80 quants and zero scales past the last token.
extern "C" __global__ void exact_tinyblas_prepare_q8_0(const u8* q8_0, u8* prepared, u32 rows, u32 n) {
    pdl_launch_dependents();
    pdl_wait();
    const u64 blocks = n / 32, units = (rows + 1) / 2;
    for_each_unit(units * blocks * 2, [&](u64 i) {
        const u32 half = (u32)(i % 2);
        const u64 unit = i / 2 / blocks, block = i / 2 % blocks, row = 2 * unit + half;
        u8* to = prepared + (unit * blocks + block) * exact::tinyblas::Q0_BLOCK_BYTES;
        const u8* from = q8_0 + (row * blocks + block) * exact::Q8_0_BYTES;
        const bool present = row < rows;
        for (int j = 0; j < 32; j++) to[32 * half + j] = present ? from[2 + j] ^ 0x80 : 0x80;
        const float d = present ? exact::read_half(from) : 0.0f;
        for (int lane = 0; lane < 8; lane++) exact::write_u32(to + 64 + 4 * (8 * half + lane), __float_as_uint(d));
    });
}
