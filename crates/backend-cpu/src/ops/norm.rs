//! RMS normalisation, as ggml's `rms_norm` followed by `mul` (fused or not, same numbers):
//! the squares are rounded to f32 and summed in f64, `mean` is rounded to f32, then
//! `y = x * (1 / sqrt(mean + eps)) * w` in f32.

use runit_backend::{BackendError, Buffer, RmsNorm};

use crate::storage::{at_least, data, data_mut, product, weight_f32};
use crate::vector;
use crate::CpuBackend;

const OP: &str = "rms_norm";

/// `out[r] = x[r] / rms(x[r]) * weight` for the first `rows` rows.
pub fn rms_norm(
    backend: &CpuBackend,
    x: &Buffer,
    norm: RmsNorm<'_>,
    rows: usize,
    out: &mut Buffer,
) -> Result<(), BackendError> {
    let RmsNorm { weight, eps } = norm;
    let width = weight.row_len();
    let len = product(OP, "rows × width", rows, width)?;
    let x = data(x, OP, "x")?;
    at_least(OP, "x elements", len, x.len())?;
    let w = weight_f32(weight, OP)?;
    let out = data_mut(out, OP, "out")?;
    at_least(OP, "out elements", len, out.len())?;
    let w = &w[..width];
    let normalize = |x: &[f32], y: &mut [f32]| {
        let mut scales = [0.0f32; GROUP];
        let count = x.len() / width;
        inverse_rms_rows(x, width, eps, &mut scales[..count]);
        for ((y, x), &scale) in y.chunks_mut(width).zip(x.chunks(width)).zip(&scales) {
            scale_row(x, scale, w, y);
        }
    };
    // Groups of rows, so that each group's sums of squares run side by side; then the
    // rows left over.
    let (groups, group_len) = (rows / GROUP, GROUP * width);
    let (body, tail) = out[..len].split_at_mut(groups * group_len);
    backend.for_rows(body, group_len, groups, |group, y| {
        normalize(&x[group * group_len..(group + 1) * group_len], y);
    });
    normalize(&x[groups * group_len..len], tail);
    Ok(())
}

/// [`rms_norm`] writing back into `x`.
pub fn rms_norm_in_place(
    backend: &CpuBackend,
    x: &mut Buffer,
    norm: RmsNorm<'_>,
    rows: usize,
) -> Result<(), BackendError> {
    let RmsNorm { weight, eps } = norm;
    let width = weight.row_len();
    let len = product(OP, "rows × width", rows, width)?;
    let w = weight_f32(weight, OP)?;
    let x = data_mut(x, OP, "x")?;
    at_least(OP, "x elements", len, x.len())?;
    let w = &w[..width];
    let normalize = |group: &mut [f32]| {
        let mut scales = [0.0f32; GROUP];
        let count = group.len() / width;
        inverse_rms_rows(group, width, eps, &mut scales[..count]);
        for (row, &scale) in group.chunks_mut(width).zip(&scales) {
            for (value, w) in row.iter_mut().zip(w) {
                *value = *value * scale * w;
            }
        }
    };
    let (groups, group_len) = (rows / GROUP, GROUP * width);
    let (body, tail) = x[..len].split_at_mut(groups * group_len);
    backend.for_rows(body, group_len, groups, |_, group| normalize(group));
    normalize(tail);
    Ok(())
}

/// Rows whose sums of squares one pass interleaves.
const GROUP: usize = 8;

/// [`inverse_rms`] of each row of `width` values in `x` (at most [`GROUP`] rows, one scale
/// each into `scales`). Every row's f64 sum takes its squares in order, as `inverse_rms`
/// adds them; a full group runs its eight sums side by side, so their dependent adds
/// overlap instead of waiting on one another (one row alone is an add's latency per value).
fn inverse_rms_rows(x: &[f32], width: usize, eps: f32, scales: &mut [f32]) {
    let rows = scales.len();
    debug_assert_eq!(x.len(), rows * width);
    if rows == GROUP {
        let row: [&[f32]; GROUP] = std::array::from_fn(|r| &x[r * width..(r + 1) * width]);
        let mut sums = [0.0f64; GROUP];
        for i in 0..width {
            for (sum, row) in sums.iter_mut().zip(&row) {
                let value = row[i];
                *sum += f64::from(value * value);
            }
        }
        for (scale, sum) in scales.iter_mut().zip(sums) {
            *scale = scale_of(sum, width, eps);
        }
    } else {
        for (scale, row) in scales.iter_mut().zip(x.chunks(width)) {
            *scale = inverse_rms(row, eps);
        }
    }
}

/// `1 / sqrt(mean + eps)` of a sum of `width` squares.
fn scale_of(sum: f64, width: usize, eps: f32) -> f32 {
    let mean = (sum / width as f64) as f32;
    1.0 / (mean + eps).sqrt()
}

/// `1 / sqrt(mean(x²) + eps)` with ggml's precision.
fn inverse_rms(x: &[f32], eps: f32) -> f32 {
    scale_of(vector::sum_squares(x), x.len(), eps)
}

/// `y = x * scale * w`.
fn scale_row(x: &[f32], scale: f32, w: &[f32], y: &mut [f32]) {
    for ((out, value), w) in y.iter_mut().zip(x).zip(w) {
        *out = value * scale * w;
    }
}

#[cfg(test)]
fn normalize_row(x: &[f32], w: &[f32], eps: f32, y: &mut [f32]) {
    scale_row(x, inverse_rms(x, eps), w, y);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The interleaved sums of a group give every row's `inverse_rms` bit for bit, for full
    /// and partial groups and values whose squares span many binades.
    #[test]
    fn grouped_scales_equal_each_rows_scale() {
        for (rows, width) in [(8, 576), (8, 7), (3, 64), (1, 1), (0, 5)] {
            let x: Vec<f32> = (0..rows * width)
                .map(|i| {
                    let v = ((i as u32).wrapping_mul(2654435761) % 20001) as f32 / 1000.0 - 10.0;
                    v * 10f32.powi((i % 13) as i32 - 6)
                })
                .collect();
            let mut scales = vec![0.0f32; rows];
            inverse_rms_rows(&x, width, 1e-5, &mut scales);
            for (r, scale) in scales.iter().enumerate() {
                let alone = inverse_rms(&x[r * width..(r + 1) * width], 1e-5);
                assert_eq!(
                    scale.to_bits(),
                    alone.to_bits(),
                    "{rows} x {width}, row {r}"
                );
            }
        }
    }

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
