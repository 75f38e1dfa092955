//! The scale searches shared by the K-quant and IQ4 quantizers, reimplemented from ggml's
//! reference quantizers (`ggml-quants.c`) in the same f32 operation order, so that a block
//! quantizes to the same bytes.

/// Rounds to the nearest integer, ties to even, for `|value| <= 4194303`: adding 1.5 * 2^23
/// leaves the rounded integer in the low mantissa bits (ggml's `nearest_int`). Outside that
/// range the result is meaningless but defined; callers clamp it.
pub(crate) fn nearest_int(value: f32) -> i32 {
    let biased = value + 12_582_912.0;
    (biased.to_bits() & 0x007f_ffff) as i32 - 0x0040_0000
}

/// Below this absolute maximum a group counts as all zero.
pub(crate) const GROUP_MAX_EPS: f32 = 1e-15;

/// The element of largest magnitude (the first one on ties), or 0 for an empty slice.
fn signed_absolute_max(x: &[f32]) -> (f32, f32) {
    let mut max = 0.0f32;
    let mut amax = 0.0f32;
    for &value in x {
        let magnitude = value.abs();
        if magnitude > amax {
            amax = magnitude;
            max = value;
        }
    }
    (max, amax)
}

/// Symmetric quantization of `x` to `levels[i] in -nmax..nmax` (stored biased by `nmax`),
/// weighted by `x^2`: tries 19 scales around `nmax / max` and keeps the one with the best
/// weighted least-squares fit. Returns the scale (ggml's `make_qx_quants`, rmse type 1).
pub(crate) fn make_qx_quants(nmax: i32, x: &[f32], levels: &mut [i8]) -> f32 {
    let (max, amax) = signed_absolute_max(x);
    if amax < GROUP_MAX_EPS {
        levels.fill(0);
        return 0.0;
    }
    let nmax_f = nmax as f32;
    let quantize = |iscale: f32, value: f32| nearest_int(iscale * value).clamp(-nmax, nmax - 1);
    let mut iscale = -nmax_f / max;
    let mut sumlx = 0.0f32;
    let mut suml2 = 0.0f32;
    for (level, &value) in levels.iter_mut().zip(x) {
        let l = quantize(iscale, value);
        *level = (l + nmax) as i8;
        let w = value * value;
        sumlx += w * value * l as f32;
        suml2 += w * l as f32 * l as f32;
    }
    let mut scale = if suml2 != 0.0 { sumlx / suml2 } else { 0.0 };
    let mut best = scale * sumlx;
    for step in -9..=9 {
        if step == 0 {
            continue;
        }
        iscale = -(nmax_f + 0.1 * step as f32) / max;
        sumlx = 0.0;
        suml2 = 0.0;
        for &value in x {
            let l = quantize(iscale, value);
            let w = value * value;
            sumlx += w * value * l as f32;
            suml2 += w * l as f32 * l as f32;
        }
        if suml2 > 0.0 && sumlx * sumlx > best * suml2 {
            for (level, &value) in levels.iter_mut().zip(x) {
                *level = (nmax + quantize(iscale, value)) as i8;
            }
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    scale
}

/// Symmetric 3-bit-style quantization (`levels[i] in -nmax..nmax`, stored biased by `nmax`)
/// with up to five rounds of per-element refinement of the weighted (`x^2`) least-squares
/// fit. Returns the scale (ggml's `make_q3_quants` with `do_rmse`).
pub(crate) fn make_q3_quants(nmax: i32, x: &[f32], levels: &mut [i8]) -> f32 {
    let (max, amax) = signed_absolute_max(x);
    if amax < GROUP_MAX_EPS {
        levels.fill(0);
        return 0.0;
    }
    let iscale = -(nmax as f32) / max;
    let mut sumlx = 0.0f32;
    let mut suml2 = 0.0f32;
    for (level, &value) in levels.iter_mut().zip(x) {
        let l = nearest_int(iscale * value).clamp(-nmax, nmax - 1);
        *level = l as i8;
        let w = value * value;
        sumlx += w * value * l as f32;
        suml2 += w * l as f32 * l as f32;
    }
    for _ in 0..5 {
        let mut changed = 0;
        for (level, &value) in levels.iter_mut().zip(x) {
            let w = value * value;
            let old = f32::from(*level);
            let mut slx = sumlx - w * value * old;
            if slx > 0.0 {
                let mut sl2 = suml2 - w * old * old;
                let new_level = nearest_int(value * sl2 / slx).clamp(-nmax, nmax - 1);
                if new_level != i32::from(*level) {
                    let new = new_level as f32;
                    slx += w * value * new;
                    sl2 += w * new * new;
                    if sl2 > 0.0 && slx * slx * suml2 > sumlx * sumlx * sl2 {
                        *level = new_level as i8;
                        sumlx = slx;
                        suml2 = sl2;
                        changed += 1;
                    }
                }
            }
        }
        if changed == 0 {
            break;
        }
    }
    for level in levels.iter_mut() {
        *level += nmax as i8;
    }
    if suml2 > 0.0 {
        sumlx / suml2
    } else {
        0.0
    }
}

/// Parameters of the scale sweep in [`make_qkx2_quants`].
pub(crate) struct Sweep {
    /// First offset added to `nmax`.
    pub rmin: f32,
    /// Step between offsets.
    pub rdelta: f32,
    /// Number of steps (the sweep tries `steps + 1` scales).
    pub steps: i32,
    /// Minimise the weighted absolute error instead of the squared error.
    pub use_mad: bool,
}

/// Asymmetric quantization `x ~ scale * l - min_out` with `l in 0..=nmax` and `min_out >= 0`,
/// minimising the `weights`-weighted error over a sweep of candidate scales, each refined by
/// a weighted least-squares fit of scale and min (ggml's `make_qkx2_quants`).
/// Returns `(scale, min_out)`; `levels` receives the chosen `l`, `scratch` is workspace.
pub(crate) fn make_qkx2_quants(
    nmax: i32,
    x: &[f32],
    weights: &[f32],
    levels: &mut [u8],
    scratch: &mut [u8],
    sweep: &Sweep,
) -> (f32, f32) {
    let n = x.len();
    let mut min = x[0];
    let mut max = x[0];
    let mut sum_w = weights[0];
    let mut sum_x = sum_w * x[0];
    for i in 1..n {
        if x[i] < min {
            min = x[i];
        }
        if x[i] > max {
            max = x[i];
        }
        let w = weights[i];
        sum_w += w;
        sum_x += w * x[i];
    }
    if min > 0.0 {
        min = 0.0;
    }
    if max == min {
        levels.fill(0);
        return (0.0, -min);
    }
    let nmax_f = nmax as f32;
    let error_of = |diff: f32| {
        if sweep.use_mad {
            diff.abs()
        } else {
            diff * diff
        }
    };
    let mut iscale = nmax_f / (max - min);
    let mut scale = 1.0 / iscale;
    let mut best_error = 0.0f32;
    for i in 0..n {
        let l = nearest_int(iscale * (x[i] - min)).clamp(0, nmax);
        levels[i] = l as u8;
        let diff = scale * f32::from(levels[i]) + min - x[i];
        best_error += weights[i] * error_of(diff);
    }
    if sweep.steps < 1 {
        return (scale, -min);
    }
    for step in 0..=sweep.steps {
        iscale = (sweep.rmin + sweep.rdelta * step as f32 + nmax_f) / (max - min);
        let mut sum_l = 0.0f32;
        let mut sum_l2 = 0.0f32;
        let mut sum_xl = 0.0f32;
        for i in 0..n {
            let l = nearest_int(iscale * (x[i] - min)).clamp(0, nmax);
            scratch[i] = l as u8;
            let w = weights[i];
            let l = l as f32;
            sum_l += w * l;
            sum_l2 += w * l * l;
            sum_xl += w * l * x[i];
        }
        let determinant = sum_w * sum_l2 - sum_l * sum_l;
        if determinant > 0.0 {
            let mut this_scale = (sum_w * sum_xl - sum_x * sum_l) / determinant;
            let mut this_min = (sum_l2 * sum_x - sum_l * sum_xl) / determinant;
            if this_min > 0.0 {
                this_min = 0.0;
                this_scale = sum_xl / sum_l2;
            }
            let mut error = 0.0f32;
            for i in 0..n {
                let diff = this_scale * f32::from(scratch[i]) + this_min - x[i];
                error += weights[i] * error_of(diff);
            }
            if error < best_error {
                levels[..n].copy_from_slice(&scratch[..n]);
                best_error = error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    (scale, -min)
}

/// Index of the entry of the sorted grid `values` (length a power of two) nearest to `x`;
/// at an exact midpoint the upper entry. Compares `2x` with the sum of neighbours, which is
/// exact in f32 (ggml's `best_index_int8`).
pub(crate) fn best_index_int8(values: &[i8], x: f32) -> usize {
    let doubled = x + x;
    let mut index = 0;
    let mut step = values.len() >> 1;
    while step > 0 {
        let j = index + step;
        let midpoint_doubled = (i32::from(values[j - 1]) + i32::from(values[j])) as f32;
        if doubled >= midpoint_doubled {
            index = j;
        }
        step >>= 1;
    }
    index
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_int_rounds_half_to_even() {
        assert_eq!(nearest_int(0.5), 0);
        assert_eq!(nearest_int(1.5), 2);
        assert_eq!(nearest_int(2.5), 2);
        assert_eq!(nearest_int(-0.5), 0);
        assert_eq!(nearest_int(-1.5), -2);
        assert_eq!(nearest_int(-2.4), -2);
        assert_eq!(nearest_int(7.6), 8);
    }

    #[test]
    fn best_index_picks_the_nearest_grid_value() {
        let grid = crate::blocks::KVALUES_IQ4NL;
        for x in -140..140 {
            let x = x as f32 + 0.25;
            let index = best_index_int8(&grid, x);
            let best = grid
                .iter()
                .map(|&v| (f32::from(v) - x).abs())
                .fold(f32::INFINITY, f32::min);
            assert_eq!((f32::from(grid[index]) - x).abs(), best, "x = {x}");
        }
    }
}
