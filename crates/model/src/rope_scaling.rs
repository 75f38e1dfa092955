//! The RoPE scaling a file declares (`rope.scaling.*`), read as llama.cpp reads it
//! (`llama_model::load_hparams` and `llama_context`'s YaRN set-up): `none`, `linear` (the
//! type assumed when none is stated) and `yarn`; any other type is refused by name.

use runit_backend::Yarn;

use crate::keys::{bad, Keys};
use crate::ModelError;

/// YaRN's defaults in llama.cpp (`llama_hparams`): the rotations that bound the ramp.
const BETA_FAST: f32 = 32.0;
const BETA_SLOW: f32 = 1.0;

/// The scaling of the global layers' RoPE.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct RopeScaling {
    /// 1 / `rope.scaling.factor` (1 for `none`).
    pub freq_scale: f32,
    /// YaRN's corrections, or a magnitude factor alone (`rope.scaling.attn_factor`).
    pub yarn: Option<Yarn>,
}

/// Reads the scaling of a model trained on `context_length` tokens.
pub(crate) fn read(keys: &Keys, context_length: usize) -> Result<RopeScaling, ModelError> {
    let kind = keys.string("rope.scaling.type")?.unwrap_or("linear");
    let factor = match keys.float("rope.scaling.factor")? {
        Some(factor) => Some(factor),
        None => keys.float("rope.scale_linear")?,
    };
    let freq_scale = match kind {
        "none" => 1.0,
        "linear" | "yarn" => 1.0 / factor.unwrap_or(1.0),
        other => {
            let supported = "none, linear, yarn";
            return Err(keys.unsupported("rope.scaling.type", format!("`{other}`"), supported));
        }
    };
    let yarn_default = if kind == "yarn" { 1.0 } else { 0.0 };
    let ext_factor = non_negative(keys, "rope.scaling.yarn_ext_factor")?.unwrap_or(yarn_default);
    let attn_scale = keys.float("rope.scaling.attn_factor")?.unwrap_or(1.0);
    let attn_factor = if ext_factor != 0.0 {
        let log_multiplier = non_negative(keys, "rope.scaling.yarn_log_multiplier")?;
        magnitude_correction(1.0 / freq_scale, log_multiplier.unwrap_or(0.0)) * attn_scale
    } else {
        keys.float("rope.scaling.yarn_attn_factor")?.unwrap_or(1.0) * attn_scale
    };
    if ext_factor == 0.0 && attn_factor == 1.0 {
        return Ok(RopeScaling {
            freq_scale,
            yarn: None,
        });
    }
    let original_context = keys
        .optional("rope.scaling.original_context_length")?
        .unwrap_or(context_length);
    let original_context = u32::try_from(original_context).map_err(|_| {
        let key = keys.key("rope.scaling.original_context_length");
        bad(key, format!("{original_context} does not fit in 32 bits"))
    })?;
    let yarn = Yarn {
        ext_factor,
        attn_factor,
        beta_fast: keys
            .float("rope.scaling.yarn_beta_fast")?
            .unwrap_or(BETA_FAST),
        beta_slow: keys
            .float("rope.scaling.yarn_beta_slow")?
            .unwrap_or(BETA_SLOW),
        original_context,
    };
    Ok(RopeScaling {
        freq_scale,
        yarn: Some(yarn),
    })
}

/// A number at least 0, when present.
fn non_negative(keys: &Keys, suffix: &str) -> Result<Option<f32>, ModelError> {
    match keys.any_float(suffix)? {
        Some(value) if !value.is_finite() || value < 0.0 => Err(bad(
            keys.key(suffix),
            format!("must be a finite number of at least 0, found {value}"),
        )),
        other => Ok(other),
    }
}

/// llama.cpp's YaRN `attn_factor` for a context `factor` times the original: Hugging Face's
/// `get_mscale` (`0.1 · m · ln(factor) + 1`, 1 for factors up to 1) with `m` 1, over its
/// value with `m` = the log multiplier when the file gives one, then divided by the factor
/// ggml's `rope_yarn` multiplies in again (`1 + 0.1 · ln(factor)`). Each `a · b + 1` is one
/// fused multiply-add, as gcc contracts llama.cpp's expressions.
fn magnitude_correction(factor: f32, log_multiplier: f32) -> f32 {
    let mscale = |m: f32| match factor <= 1.0 {
        true => 1.0,
        false => (0.1 * m).mul_add(factor.ln(), 1.0),
    };
    let base = match log_multiplier != 0.0 {
        true => mscale(1.0) / mscale(log_multiplier),
        false => mscale(1.0),
    };
    base * (1.0 / 0.1f32.mul_add(factor.ln(), 1.0))
}
