//! RMS normalisation, as ggml's `rms_norm` followed by `mul` (fused or not, same numbers):
//! the squares are rounded to f32 and summed in f64, `mean` is rounded to f32, then
//! `y = x * (1 / sqrt(mean + eps)) * w` in f32.

use runit_backend::{BackendError, Buffer, Weight};

use crate::storage::{at_least, data, data_mut, product, weight_f32};
use crate::vector;
use crate::CpuBackend;

const OP: &str = "rms_norm";

/// `out[r] = x[r] / rms(x[r]) * weight` for the first `rows` rows.
pub fn rms_norm(
    backend: &CpuBackend,
    x: &Buffer,
    weight: &Weight,
    eps: f32,
    rows: usize,
    out: &mut Buffer,
) -> Result<(), BackendError> {
    let width = weight.row_len();
    let len = product(OP, "rows × width", rows, width)?;
    let x = data(x, OP, "x")?;
    at_least(OP, "x elements", len, x.len())?;
    let w = weight_f32(weight, OP)?;
    let out = data_mut(out, OP, "out")?;
    at_least(OP, "out elements", len, out.len())?;
    backend.for_rows(out, width, rows, |row, y| {
        normalize_row(&x[row * width..(row + 1) * width], &w[..width], eps, y);
    });
    Ok(())
}

/// [`rms_norm`] writing back into `x`.
pub fn rms_norm_in_place(
    backend: &CpuBackend,
    x: &mut Buffer,
    weight: &Weight,
    eps: f32,
    rows: usize,
) -> Result<(), BackendError> {
    let width = weight.row_len();
    let len = product(OP, "rows × width", rows, width)?;
    let w = weight_f32(weight, OP)?;
    let x = data_mut(x, OP, "x")?;
    at_least(OP, "x elements", len, x.len())?;
    backend.for_rows(x, width, rows, |_, row| {
        let scale = inverse_rms(row, eps);
        for (value, w) in row.iter_mut().zip(&w[..width]) {
            *value = *value * scale * w;
        }
    });
    Ok(())
}

/// `1 / sqrt(mean(x²) + eps)` with ggml's precision.
fn inverse_rms(x: &[f32], eps: f32) -> f32 {
    let mean = (vector::sum_squares(x) / x.len() as f64) as f32;
    1.0 / (mean + eps).sqrt()
}

fn normalize_row(x: &[f32], w: &[f32], eps: f32, y: &mut [f32]) {
    let scale = inverse_rms(x, eps);
    for ((out, value), w) in y.iter_mut().zip(x).zip(w) {
        *out = value * scale * w;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalizes_a_known_row() {
        // x = [1, 2, 3, 4]: mean of squares 7.5, eps 0.5 → scale 1/sqrt(8) = 0.35355339.
        let x = [1.0f32, 2.0, 3.0, 4.0];
        let w = [1.0f32, 1.0, 2.0, -1.0];
        let mut y = [0.0f32; 4];
        normalize_row(&x, &w, 0.5, &mut y);
        let s = 1.0 / 8.0f64.sqrt();
        let expected = [s, 2.0 * s, 6.0 * s, -4.0 * s];
        for (got, want) in y.iter().zip(expected) {
            assert!((f64::from(*got) - want).abs() < 1e-6, "{got} vs {want}");
        }
    }
}
