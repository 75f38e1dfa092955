//! GELU with the tanh approximation, `0.5 x (1 + tanh(sqrt(2/pi) x (1 + 0.044715 x²)))`, as
//! ggml's CPU build computes its GeGLU (`ggml_vec_geglu_f32` with `GGML_GELU_FP16`): the
//! input rounded to f16 indexes a table of 65 536 f16 results, except below -10 (0) and from
//! 10 on (the input itself). Every backend computes the gate through [`table`], so the
//! numbers are the reference's on every device.
//!
//! ggml fills the table at start-up with the f32 formula, compiled with floating-point
//! contraction (`1 + 0.044715 x · x` is one fused multiply-add on the reference machine) and
//! glibc's `tanhf`. The f16 rounding hides the last bits of `tanh`: a correctly rounded
//! `tanh` gives the same table (checked over all 65 536 inputs when this was written).

use std::sync::OnceLock;

use half::f16;

/// `GELU_COEF_A` of the formula.
const CUBIC: f32 = 0.044715;
/// `sqrt(2 / pi)`, rounded to f32.
const SQRT_2_OVER_PI: f32 = 0.797_884_6;

/// Inputs at or below this give 0.
pub const LOWER: f32 = -10.0;
/// Inputs at or above this give themselves.
pub const UPPER: f32 = 10.0;

/// The formula in f32, as the reference's table initialisation evaluates it.
fn formula(x: f32) -> f32 {
    let inner = (CUBIC * x).mul_add(x, 1.0);
    let tanh = f64::from(SQRT_2_OVER_PI * x * inner).tanh() as f32;
    0.5 * x * (1.0 + tanh)
}

/// The table: entry `bits` is the f16 (its bits) of the GELU of the f16 with bits `bits`.
pub fn table() -> &'static [u16] {
    static TABLE: OnceLock<Vec<u16>> = OnceLock::new();
    TABLE.get_or_init(|| {
        (0..=u16::MAX)
            .map(|bits| f16::from_f32(formula(f16::from_bits(bits).to_f32())).to_bits())
            .collect()
    })
}

/// GELU of `x` (the gate) times `up`, one element of the GeGLU.
pub fn gate(table: &[u16], x: f32, up: f32) -> f32 {
    if x <= LOWER {
        0.0
    } else if x >= UPPER {
        x * up
    } else {
        f16::from_bits(table[usize::from(f16::from_f32(x).to_bits())]).to_f32() * up
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_follows_the_formula_in_f64() {
        let gelu = |x: f64| {
            0.5 * x
                * (1.0
                    + ((2.0 / std::f64::consts::PI).sqrt() * x * (1.0 + 0.044715 * x * x)).tanh())
        };
        let table = table();
        for x in [-3.0f32, -1.0, -0.5, 0.0, 0.25, 1.0, 2.0, 5.0] {
            let got = gate(table, x, 1.0);
            let want = gelu(f64::from(x));
            assert!(
                (f64::from(got) - want).abs() <= want.abs() * 1e-3 + 1e-6,
                "{x}: {got} vs {want}"
            );
        }
        assert_eq!(gate(table, -10.0, 3.0), 0.0);
        assert_eq!(gate(table, 10.0, 3.0), 30.0);
        assert_eq!(gate(table, 0.0, 3.0), 0.0);
    }

    #[test]
    fn the_one_contracted_entry_is_the_fused_one() {
        // f16 0xBFFF (-1.999): without the fused multiply-add the f16 result is 0xA9D2; ggml's
        // contracted build (and this table) gives 0xA9D3.
        assert_eq!(table()[0xBFFF], 0xA9D3);
    }
}
