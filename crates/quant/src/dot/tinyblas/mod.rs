//! llamafile's sgemm ("tinyBLAS") arithmetic, the path ggml-cpu takes for prompt processing
//! (two or more activation rows) with F32, F16, BF16, Q8_0, Q4_0, Q5_0 and IQ4_NL weights
//! in a plain buffer. Facts: `/work/notes/tinyblas.md`.
//!
//! **Numerics** (the x86 AVX-512 build with AVX512_BF16 that made the goldens), per output:
//! - F32 / F16: one 16-lane f32 accumulator over the whole row, lane `q` collecting
//!   `fma(w[i], x[i])` for `i % 16 == q`, reduced as `_mm512_reduce_add_ps` (lanes
//!   `q + (q + 8)`, then ggml's `hsum_float_8`). F16 activations are rounded to f16 first.
//! - BF16: `vdpbf16ps` over 32-element steps: lane `q` takes the fused product of element
//!   `2q + 1` of the step, then of element `2q` (denormals in are zero, out are flushed),
//!   same reduction. Activations are rounded to bf16 first.
//! - Q8_0 / Q4_0 / Q5_0 / IQ4_NL against Q8_0 activations: one 8-lane accumulator, one
//!   `fma(d_w * d_x, lane sums)` per block, `hsum_float_8`. For Q8_0, Q4_0 and Q5_0 this is
//!   the `vec_dot` order too; IQ4_NL's `vec_dot` pairs blocks, this does not.
//!
//! The float kernels need `n_out % 4 == 0` and `n_in` a multiple of 16 (32 for BF16), as
//! llamafile does; otherwise ggml (and so RunIT) uses `vec_dot` ([`accepts`] tells).
//!
//! Use: [`accepts`], then convert every unit of [`unit_tokens`] activation rows with
//! [`prepare`] into [`prepared_unit_bytes`] bytes each, back to back, and run [`kernel`] on
//! any set of whole weight rows. The scalar twin ([`SimdLevel::Scalar`]) reads the same
//! prepared bytes and performs the same operations, so every level agrees bit for bit.
//! x86 kernels: AVX-512 for the float types (`x86_float`) and, with VNNI, the Q8_0-paired
//! ones (`x86_q0`); AVX2 + FMA for the float types (`x86_avx2`, the same 16 lanes in two
//! 256-bit halves) on CPUs without AVX-512.

mod scalar;
#[cfg(target_arch = "x86_64")]
mod x86_avx2;
#[cfg(target_arch = "x86_64")]
mod x86_float;
#[cfg(target_arch = "x86_64")]
mod x86_q0;

use super::{activation_row_bytes, quantize_activation, ActivationFormat, SimdLevel};
use crate::GgmlType;

/// `kernel(n_in, weight_rows, prepared, tokens, out)`: for each of the `rows` whole weight
/// rows `r` in `weight_rows` and each token `t < tokens`, `out[t * rows + r]` = the dot
/// product in tinyBLAS order. `prepared` holds the units of all `tokens` rows ([`prepare`]).
pub type KernelFn =
    fn(n_in: usize, weight_rows: &[u8], prepared: &[u8], tokens: usize, out: &mut [f32]);

/// Elements of one accumulator step (llamafile's `KN`) for the float types.
fn float_step(ty: GgmlType) -> Option<usize> {
    match ty {
        GgmlType::F32 | GgmlType::F16 => Some(16),
        GgmlType::BF16 => Some(32),
        _ => None,
    }
}

/// True for the 32-element formats that llamafile multiplies against Q8_0 rows.
fn is_q0(ty: GgmlType) -> bool {
    matches!(
        ty,
        GgmlType::Q8_0 | GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::IQ4_NL
    )
}

/// True when ggml-cpu would hand this matmul (`n_out` rows of `n_in` weights of `ty`, in a
/// plain buffer, against `tokens` activation rows) to llamafile's sgemm.
pub fn accepts(ty: GgmlType, n_in: usize, n_out: usize, tokens: usize) -> bool {
    if tokens < 2 {
        return false;
    }
    match float_step(ty) {
        Some(step) => n_in.is_multiple_of(step) && n_out.is_multiple_of(4),
        None => is_q0(ty) && n_in.is_multiple_of(32),
    }
}

/// Activation rows converted together into one prepared unit (2 for the Q8_0 formats,
/// whose kernels take tokens in pairs; 1 for the float types).
pub fn unit_tokens(ty: GgmlType) -> usize {
    if is_q0(ty) {
        2
    } else {
        1
    }
}

/// Bytes of one prepared unit for rows of `n_in` elements.
///
/// Layouts: F32 and F16: the row as f32 (F16 values rounded to f16 first); BF16: the row as
/// bf16; Q8_0 formats, per 32-element block: the two rows' 32 quants each XOR 0x80 (as
/// u8), then their scales as sixteen f32 (`d` of the first row eight times, then the
/// second's); a missing second row is all zero.
///
/// # Panics
/// For a type [`accepts`] never takes.
pub fn prepared_unit_bytes(ty: GgmlType, n_in: usize) -> usize {
    match ty {
        GgmlType::F32 | GgmlType::F16 => 4 * n_in,
        GgmlType::BF16 => 2 * n_in,
        _ if is_q0(ty) => n_in / 32 * Q0_BLOCK_BYTES,
        _ => panic!("tinyBLAS has no kernel for {ty}"),
    }
}

/// Prepared bytes per block of a Q8_0 unit: 64 quants, 16 f32 scales.
pub(crate) const Q0_BLOCK_BYTES: usize = 64 + 64;

/// Converts one unit of activation rows (`x`: [`unit_tokens`] rows of `n_in`, or one row for
/// the last unit of an odd count) into `out` ([`prepared_unit_bytes`] long).
///
/// # Panics
/// When the lengths disagree or the type is not taken.
pub fn prepare(ty: GgmlType, x: &[f32], n_in: usize, out: &mut [u8]) {
    assert_eq!(
        out.len(),
        prepared_unit_bytes(ty, n_in),
        "prepared unit of {ty}"
    );
    let rows = x.len() / n_in.max(1);
    assert!(
        rows * n_in == x.len() && (1..=unit_tokens(ty)).contains(&rows),
        "{} values are not 1..={} rows of {n_in}",
        x.len(),
        unit_tokens(ty)
    );
    match ty {
        GgmlType::F32 => out.copy_from_slice(bytemuck::cast_slice(x)),
        GgmlType::F16 => {
            for (value, bytes) in x.iter().zip(out.chunks_exact_mut(4)) {
                let rounded = half::f16::from_f32(*value).to_f32();
                bytes.copy_from_slice(&rounded.to_le_bytes());
            }
        }
        GgmlType::BF16 => quantize_activation(ActivationFormat::BF16, x, out),
        _ => prepare_q0(x, n_in, rows, out),
    }
}

/// Q8_0-quantizes one or two rows and interleaves them block by block.
fn prepare_q0(x: &[f32], n_in: usize, rows: usize, out: &mut [u8]) {
    #[cfg(target_arch = "x86_64")]
    if x86_q0::prepare(x, n_in, rows, out).is_some() {
        return;
    }
    prepare_q0_scalar(x, n_in, rows, out);
}

/// The portable twin of `prepare_q0`.
fn prepare_q0_scalar(x: &[f32], n_in: usize, rows: usize, out: &mut [u8]) {
    let row_bytes = activation_row_bytes(ActivationFormat::Q8_0, n_in);
    let mut quantized = vec![0u8; row_bytes];
    out.fill(0);
    for half in 0..2 {
        if half < rows {
            quantize_activation(
                ActivationFormat::Q8_0,
                &x[half * n_in..(half + 1) * n_in],
                &mut quantized,
            );
        } else {
            quantized.fill(0);
        }
        for (block, unit) in quantized
            .chunks_exact(34)
            .zip(out.chunks_exact_mut(Q0_BLOCK_BYTES))
        {
            for (to, &q) in unit[32 * half..32 * half + 32].iter_mut().zip(&block[2..]) {
                *to = q ^ 0x80;
            }
            let d = half::f16::from_le_bytes([block[0], block[1]]).to_f32();
            for lane in 0..8 {
                let at = 64 + 4 * (8 * half + lane);
                unit[at..at + 4].copy_from_slice(&d.to_le_bytes());
            }
        }
    }
}

/// The tinyBLAS kernel of `ty` at `level`, or at the best lower level with one (the
/// scalar twin at least; the x86 levels fall back to AVX2 where AVX-512 is missing).
/// `None` for a type [`accepts`] never takes, and for the types of [`same_as_vec_dot`] at
/// a SIMD level without a tinyBLAS kernel.
pub fn kernel(ty: GgmlType, level: SimdLevel) -> Option<KernelFn> {
    if float_step(ty).is_none() && !is_q0(ty) {
        return None;
    }
    #[cfg(target_arch = "x86_64")]
    {
        let avx512 = matches!(level, SimdLevel::Avx512 | SimdLevel::Avx512Vnni)
            && SimdLevel::Avx512.is_available();
        if avx512 {
            if let Some(kernel) = x86_float::kernel(ty) {
                return Some(kernel);
            }
            if level == SimdLevel::Avx512Vnni && SimdLevel::Avx512Vnni.is_available() {
                if let Some(kernel) = x86_q0::kernel(ty) {
                    return Some(kernel);
                }
            }
        }
        let avx2 = matches!(
            level,
            SimdLevel::Avx2 | SimdLevel::AvxVnni | SimdLevel::Avx512 | SimdLevel::Avx512Vnni
        ) && SimdLevel::Avx2.is_available();
        if avx2 {
            if let Some(kernel) = x86_avx2::kernel(ty) {
                return Some(kernel);
            }
        }
    }
    if level != SimdLevel::Scalar && same_as_vec_dot(ty) {
        return None;
    }
    scalar::kernel(ty)
}

/// True for the types whose tinyBLAS arithmetic equals their `vec_dot`'s (Q8_0, Q4_0,
/// Q5_0): [`kernel`] offers them only at levels with a fast kernel, since the `vec_dot`
/// kernels give the same numbers.
pub fn same_as_vec_dot(ty: GgmlType) -> bool {
    matches!(ty, GgmlType::Q8_0 | GgmlType::Q4_0 | GgmlType::Q5_0)
}

/// Checks the sizes shared by every kernel; returns the number of weight rows.
pub(crate) fn check(
    ty: GgmlType,
    n_in: usize,
    weight_rows: &[u8],
    prepared: &[u8],
    tokens: usize,
    out: &[f32],
) -> usize {
    let row_bytes = ty.row_bytes(n_in as u64).expect("whole blocks") as usize;
    assert!(
        row_bytes > 0 && weight_rows.len().is_multiple_of(row_bytes),
        "{ty} weight rows of {n_in}: {} bytes",
        weight_rows.len()
    );
    let rows = weight_rows.len() / row_bytes;
    let units = tokens.div_ceil(unit_tokens(ty));
    assert!(
        prepared.len() >= units * prepared_unit_bytes(ty, n_in),
        "prepared activations of {} bytes for {tokens} rows of {n_in}",
        prepared.len()
    );
    assert_eq!(out.len(), rows * tokens, "{rows} x {tokens} outputs");
    rows
}

#[cfg(test)]
mod tests;
