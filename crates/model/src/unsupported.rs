//! Metadata the engine does not implement. Each key below changes what a model computes; a
//! file that sets one to anything but the values the row implements (or a value meaning
//! "unset") is refused with an error naming the key, the value and the supported values,
//! never silently run as something else. The keys are llama.cpp's (`src/llama-arch.cpp`).

use runit_gguf::Value;

use crate::arch::{Activation, Architecture, AttentionWindow, FfnKind, LogitSoftcap, RopeBase};
use crate::keys::Keys;
use crate::ModelError;

/// llama.cpp's `llama_pooling_type`, by value: a decoder for generation pools nothing; an
/// embedding model of a known architecture pools by mean, first (CLS) or last token.
const POOLING_TYPES: [&str; 5] = ["none", "mean", "cls", "last", "rank"];

/// llama.cpp's `llama_expert_gating_func_type`, by value.
const GATING_FUNCTIONS: [&str; 5] = [
    "none",
    "softmax",
    "sigmoid",
    "softmax_weight",
    "sqrt_softplus",
];

/// Factors the decoder never applies, with the values that leave a model unchanged (llama.cpp
/// writes 0 for an unset scale).
const NEUTRAL_SCALES: [(&str, &[f32]); 5] = [
    ("attention.scale", &[0.0]),
    ("embedding_scale", &[0.0, 1.0]),
    ("logit_scale", &[0.0, 1.0]),
    ("residual_scale", &[0.0, 1.0]),
    ("expert_weights_scale", &[0.0, 1.0]),
];

/// Refuses every key of `keys` that asks for something `row` does not compute.
pub(crate) fn refuse_unimplemented(keys: &Keys, row: &Architecture) -> Result<(), ModelError> {
    if let Some(pooling) = keys.unsigned("pooling_type")? {
        if pooling > 3 {
            let value = named(pooling, &POOLING_TYPES);
            return Err(keys.unsupported(
                "pooling_type",
                value,
                "0 (none), 1 (mean), 2 (cls), 3 (last)",
            ));
        }
    }
    if keys.boolean("attention.causal")? == Some(false) {
        let value = "false (non-causal attention)".to_string();
        return Err(keys.unsupported("attention.causal", value, "true (causal attention)"));
    }
    if let Some(name) = keys.string("hidden_activation")? {
        let accepted = activation_names(row.activation);
        if !accepted.contains(&name) {
            let supported = format!("{} ({})", accepted.join(", "), row.name);
            return Err(keys.unsupported("hidden_activation", format!("`{name}`"), &supported));
        }
    }
    if let Some(gating) = keys.unsigned("expert_gating_func")? {
        if gating > 1 {
            let value = named(gating, &GATING_FUNCTIONS);
            return Err(keys.unsupported("expert_gating_func", value, "0 (none), 1 (softmax)"));
        }
    }
    if row.ffn == FfnKind::DenseGated {
        if let Some(count) = keys.unsigned("expert_count")?.filter(|&count| count > 0) {
            let supported = format!("0 ({} has a dense feed-forward)", row.name);
            return Err(keys.unsupported("expert_count", count.to_string(), &supported));
        }
    }
    if row.logit_softcap == LogitSoftcap::None {
        for suffix in ["attn_logit_softcapping", "final_logit_softcapping"] {
            if let Some(cap) = keys.any_float(suffix)?.filter(|&cap| cap != 0.0) {
                let supported = format!("0 ({} has no soft-capping)", row.name);
                return Err(keys.unsupported(suffix, cap.to_string(), &supported));
            }
        }
    }
    if row.attention_window == AttentionWindow::EveryLayer {
        if let Some(pattern) = keys.value("attention.sliding_window_pattern") {
            let supported = format!("absent ({} windows every layer alike)", row.name);
            let suffix = "attention.sliding_window_pattern";
            return Err(keys.unsupported(suffix, describe(pattern), &supported));
        }
    }
    if row.rope_base == RopeBase::Uniform {
        if let Some(base) = keys.any_float("rope.freq_base_swa")? {
            let supported = format!("absent ({} has one RoPE base in every layer)", row.name);
            return Err(keys.unsupported("rope.freq_base_swa", base.to_string(), &supported));
        }
    }
    for (suffix, neutral) in NEUTRAL_SCALES {
        if let Some(scale) = keys
            .any_float(suffix)?
            .filter(|scale| !neutral.contains(scale))
        {
            let supported = neutral.iter().map(f32::to_string).collect::<Vec<_>>();
            let supported = format!("{} (not applied)", supported.join(", "));
            return Err(keys.unsupported(suffix, scale.to_string(), &supported));
        }
    }
    Ok(())
}

/// The `hidden_activation` names (llama.cpp's and Hugging Face's) of an activation.
fn activation_names(activation: Activation) -> &'static [&'static str] {
    match activation {
        Activation::Silu => &["silu", "swish", "swiglu"],
        Activation::GeluTanh => &["gelu_pytorch_tanh", "gelu", "geglu"],
    }
}

/// `2 (cls)`: an enumeration's number and name.
fn named(value: u64, names: &[&str]) -> String {
    let name = usize::try_from(value)
        .ok()
        .and_then(|index| names.get(index))
        .unwrap_or(&"unknown");
    format!("{value} ({name})")
}

/// A value of any type, for a message.
pub(crate) fn describe(value: &Value) -> String {
    match value {
        Value::Array(array) => format!("an {}", array.type_description()),
        Value::String(text) => format!("`{text}`"),
        Value::Bool(flag) => flag.to_string(),
        scalar => match (scalar.as_i64(), scalar.as_f64()) {
            (Some(integer), _) => integer.to_string(),
            (None, Some(float)) => float.to_string(),
            _ => scalar.type_description(),
        },
    }
}
