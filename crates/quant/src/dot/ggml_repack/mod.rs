//! Dot products in the arithmetic order of ggml-cpu's REPACK kernels (`arch/x86/repack.cpp`),
//! which llama.cpp's x86 build uses instead of `vec_dot` for some weight types.
//!
//! ggml-cpu re-lays out a 2-D (or 3-D expert) weight whose type has an x86 repack kernel
//! and whose row count is a multiple of 8, except the token embedding, which stays in a
//! plain buffer for GET_ROWS. On an AVX2 machine that is Q4_0 (`block_q4_0x8`), IQ4_NL
//! (`block_iq4_nlx8`) and Q4_K (`block_q4_Kx8`); Q2_K (`block_q2_Kx8`) needs AVX-512, which
//! the reference machine has. Such weights then go through `ggml_gemv_*` (one activation
//! row, and the rows left over after groups of four) or `ggml_gemm_*` (groups of four
//! rows) for every matmul, whatever the number of activation rows.
//!
//! **Numerics.** The kernels lay eight weight rows side by side in the lanes of one
//! register, so each output has one scalar f32 accumulator (no lanes, no horizontal sum).
//! Within a *span* of elements every integer sum is exact (i32); at the end of the span
//! it is converted to f32 and folded in with one FMA, `acc = fma(isum, d_w * d_a, acc)`
//! (`d_w * d_a` rounded to f32 first). The K-quants keep a second accumulator for the
//! minimum correction, `acc_min = fma(sum_j min_j * bsum_j, dmin_w * d_a, acc_min)`, and
//! return `acc - acc_min`. The span is:
//!
//! | type   | gemv (one row)   | gemm (four rows)  |
//! |--------|------------------|-------------------|
//! | Q4_0   | 32 (a block)     | 32                |
//! | IQ4_NL | 32 (a block)     | 32                |
//! | Q4_K   | 256 (super-block)| 64                |
//! | Q2_K   | 256 (super-block)| 128               |
//!
//! Q4_0 nibbles are stored xor 0x88 in `block_q4_0x8` and read back as signed 4-bit values,
//! which is `q - 8` again; IQ4_NL nibbles index `kvalues_iq4nl`. The activations are Q8_0
//! (`block_q8_0x4` for the gemm, the same values as `quantize_row_q8_0`) or Q8_K.
//!
//! Every type has a scalar twin (a [`DotFn`] per output) and, on x86-64, an AVX2 kernel
//! for eight rows at a time ([`RowsFn`]); Q4_0 and IQ4_NL also take four activation rows
//! per pass (decoding the weights once for the four) and use `vpdpbusd` where the level
//! has it. The tests compare them bit for bit.

mod iq4_nl;
mod q2_k;
mod q4_0;
mod q4_k;
#[cfg(test)]
mod tests;
#[cfg(target_arch = "x86_64")]
mod x86;
#[cfg(target_arch = "x86_64")]
mod x86_b32;
#[cfg(target_arch = "x86_64")]
mod x86_b32_eight;
#[cfg(target_arch = "x86_64")]
mod x86_b32_wide;
#[cfg(target_arch = "x86_64")]
mod x86_q4_k_wide;
#[cfg(target_arch = "x86_64")]
mod x86_wide;

use super::{activation_format, activation_row_bytes, DotFn, SimdLevel};
use crate::GgmlType;

/// `rows(n, weight_rows, activations, out)`: `out[t * R + r]` is the repack-order dot
/// product of weight row `r` (`R` rows of `n` elements back to back in `weight_rows`)
/// with activation row `t` (whole activation rows back to back in `activations`), so
/// `out.len()` is `R` times the number of activation rows. Bit-identical to the scalar
/// [`DotFn`] of the same order.
pub type RowsFn = fn(n: usize, weight_rows: &[u8], activations: &[u8], out: &mut [f32]);

/// The repack-order dot products for weights of `ty` that ggml-cpu's x86 build repacks
/// (see the module doc): `(gemv, gemm)`, the order of one activation row and the order of
/// activation rows taken four at a time; `None` when the type keeps its `vec_dot` order.
/// These are the scalar twins.
pub fn repack_dot_fn(ty: GgmlType) -> Option<(DotFn, DotFn)> {
    match ty {
        GgmlType::Q4_0 => Some((q4_0::dot_q4_0, q4_0::dot_q4_0)),
        GgmlType::IQ4_NL => Some((iq4_nl::dot_iq4_nl, iq4_nl::dot_iq4_nl)),
        GgmlType::Q2_K => Some((q2_k::dot_q2_k_gemv, q2_k::dot_q2_k_gemm)),
        GgmlType::Q4_K => Some((q4_k::dot_q4_k_gemv, q4_k::dot_q4_k_gemm)),
        _ => None,
    }
}

/// True when `ty`'s gemv and gemm orders of [`repack_dot_fn`] are one arithmetic (Q4_0
/// and IQ4_NL: one FMA per 32-element block in both), so activation rows may be taken in
/// any grouping.
pub fn repack_one_order(ty: GgmlType) -> bool {
    matches!(ty, GgmlType::Q4_0 | GgmlType::IQ4_NL)
}

/// The many-rows kernels `(gemv, gemm)` of [`repack_dot_fn`] at `level` (or the best lower
/// level this CPU has); the scalar level loops over the scalar twin.
pub fn repack_rows_fn(ty: GgmlType, level: SimdLevel) -> Option<(RowsFn, RowsFn)> {
    repack_dot_fn(ty)?;
    #[cfg(target_arch = "x86_64")]
    if level != SimdLevel::Scalar && SimdLevel::Avx2.is_available() {
        if let Some(kernels) = x86::rows(ty, level) {
            return Some(kernels);
        }
    }
    let _ = level;
    Some(scalar_rows(ty))
}

/// [`RowsFn`]s that call the scalar twin once per row.
fn scalar_rows(ty: GgmlType) -> (RowsFn, RowsFn) {
    macro_rules! rows {
        ($ty:ident, $dot:path) => {{
            fn rows(n: usize, weight_rows: &[u8], activations: &[u8], out: &mut [f32]) {
                rows_by_dots(GgmlType::$ty, (n, weight_rows, activations, out), $dot);
            }
            rows as RowsFn
        }};
    }
    match ty {
        GgmlType::Q4_0 => (rows!(Q4_0, q4_0::dot_q4_0), rows!(Q4_0, q4_0::dot_q4_0)),
        GgmlType::IQ4_NL => (
            rows!(IQ4_NL, iq4_nl::dot_iq4_nl),
            rows!(IQ4_NL, iq4_nl::dot_iq4_nl),
        ),
        GgmlType::Q2_K => (
            rows!(Q2_K, q2_k::dot_q2_k_gemv),
            rows!(Q2_K, q2_k::dot_q2_k_gemm),
        ),
        _ => (
            rows!(Q4_K, q4_k::dot_q4_k_gemv),
            rows!(Q4_K, q4_k::dot_q4_k_gemm),
        ),
    }
}

/// [`rows_by_dot`] for every activation row of `activations` (whole rows of `ty`'s
/// activation format); `out` holds one run of outputs per activation row.
fn rows_by_dots(
    ty: GgmlType,
    (n, weight_rows, activations, out): (usize, &[u8], &[u8], &mut [f32]),
    dot: DotFn,
) {
    let format = activation_format(ty).expect("repacked types have an activation format");
    let activation_bytes = activation_row_bytes(format, n);
    let tokens = activations.len() / activation_bytes;
    assert!(
        activations.len().is_multiple_of(activation_bytes)
            && out.len().is_multiple_of(tokens.max(1)),
        "{} bytes of {format:?} activations and {} outputs for {n} elements",
        activations.len(),
        out.len()
    );
    if tokens == 0 {
        return;
    }
    let count = out.len() / tokens;
    for (activation, out) in activations
        .chunks_exact(activation_bytes)
        .zip(out.chunks_exact_mut(count))
    {
        rows_by_dot(n, weight_rows, activation, out, dot);
    }
}

/// `out[r] = dot(n, row r, activation_row)` for every row of `weight_rows`.
pub(crate) fn rows_by_dot(
    n: usize,
    weight_rows: &[u8],
    activation_row: &[u8],
    out: &mut [f32],
    dot: DotFn,
) {
    if out.is_empty() {
        return;
    }
    let row_bytes = weight_rows.len() / out.len();
    for (value, row) in out.iter_mut().zip(weight_rows.chunks_exact(row_bytes)) {
        *value = dot(n, row, activation_row);
    }
}

/// True when ggml-cpu's x86 build (AVX-512, as the reference machine) repacks a weight of
/// `ty` with `rows` rows that is not the token embedding.
pub fn is_repacked(ty: GgmlType, rows: usize) -> bool {
    repack_dot_fn(ty).is_some() && rows.is_multiple_of(8)
}
