//! The exponentials of a softmax row as ggml's `ggml_vec_soft_max_f32` computes them on the
//! reference machine (AVX-512): `y[i] = v_expf(x[i] - max)` with ggml's polynomial
//! `ggml_v_expf` (see [`super::silu`]) for whole groups of 16 values, each group summed in f32
//! in `_mm512_reduce_add_ps` order and added to an f64 total; leftover values use libm's
//! `expf` and are added to the total one by one. Returns the total.
//!
//! ggml's tiled flash attention normalises every key tile this way, so RunIT's tiled
//! attention does too (a libm `exp` and a per-element f64 sum differ in the last bits, which
//! quantized models amplify).

use super::silu::vector_exp;

/// Values per AVX-512 register.
const GROUP: usize = 16;

/// `_mm512_reduce_add_ps` as gcc expands it: halves, then quarters, then `(0+2) + (1+3)`.
fn reduce_add_16(x: &[f32; GROUP]) -> f32 {
    let halves: [f32; 8] = std::array::from_fn(|i| x[i] + x[i + 8]);
    let quarters: [f32; 4] = std::array::from_fn(|i| halves[i] + halves[i + 4]);
    (quarters[0] + quarters[2]) + (quarters[1] + quarters[3])
}

/// `values[i] = exp(values[i] - max)`; returns the sum of the new values (see the module docs).
pub fn soft_max_f32(values: &mut [f32], max: f32) -> f64 {
    let mut total = 0.0f64;
    let body = values.len() / GROUP * GROUP;
    for group in values[..body].chunks_exact_mut(GROUP) {
        let mut exps = [0.0f32; GROUP];
        for (e, v) in exps.iter_mut().zip(group.iter()) {
            *e = vector_exp(*v - max);
        }
        group.copy_from_slice(&exps);
        total += f64::from(reduce_add_16(&exps));
    }
    for v in &mut values[body..] {
        *v = (*v - max).exp();
        total += f64::from(*v);
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masked_values_vanish_and_the_sum_is_close_to_exact() {
        let mut values: Vec<f32> = (0..67).map(|i| (i as f32 * 0.37).sin() * 5.0).collect();
        values[3] = f32::NEG_INFINITY;
        let max = values.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let original = values.clone();
        let total = soft_max_f32(&mut values, max);
        assert_eq!(values[3], 0.0);
        // The difference is taken in f32, as ggml does; the exponential is compared in f64.
        let exact: f64 = original.iter().map(|v| f64::from(*v - max).exp()).sum();
        assert!((total - exact).abs() < 1e-5 * exact, "{total} vs {exact}");
        for (v, o) in values.iter().zip(&original) {
            let e = f64::from(*o - max).exp();
            assert!((f64::from(*v) - e).abs() <= 4.0 * f64::from(f32::EPSILON) * e.max(1e-30));
        }
    }

    #[test]
    fn groups_are_summed_in_register_order() {
        // Values chosen so that the f32 grouping is visible: 1 + 16 tiny values.
        let mut values = [0.0f32; 16];
        values[0] = 0.0;
        for v in values.iter_mut().skip(1) {
            *v = -17.0; // exp(-17) ~ 4e-8, below half an ulp of 1.0 alone but not together
        }
        let mut copy = values;
        let total = soft_max_f32(&mut copy, 0.0);
        let exps: [f32; 16] = std::array::from_fn(|i| copy[i]);
        assert_eq!(total, f64::from(reduce_add_16(&exps)));
    }
}
