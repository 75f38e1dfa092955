//! Metadata the engine does not implement is refused with an error naming the key, the value
//! and the supported values; the values that mean "unset" or that the row implements load.

mod common;

use std::borrow::Cow;

use runit_gguf::{GgufFile, GgufWriter, Value};
use runit_model::{ModelConfig, ModelError, Pooling};

/// A tiny model's metadata under `arch` (OLMoE gets its expert counts), with `extra`
/// (which replaces a default of the same key).
fn config(arch: &str, extra: &[(&str, Value)]) -> Result<ModelConfig, ModelError> {
    let mut defaults = vec![
        ("block_count", Value::U32(2)),
        ("context_length", Value::U32(256)),
        ("embedding_length", Value::U32(64)),
        ("feed_forward_length", Value::U32(128)),
        ("attention.head_count", Value::U32(4)),
        ("attention.layer_norm_rms_epsilon", Value::F32(1e-5)),
        ("vocab_size", Value::U32(32)),
    ];
    if arch == "olmoe" {
        defaults.push(("expert_count", Value::U32(4)));
        defaults.push(("expert_used_count", Value::U32(2)));
    }
    common::metadata_config(arch, defaults, extra, &[])
}

/// `key` = `value` under `arch` is refused, naming the key, the value and `supported`.
fn refused(arch: &str, key: &str, value: Value, named_value: &str, supported: &str) {
    let error = config(arch, &[(key, value)]).expect_err(key);
    let message = error.to_string();
    match error {
        ModelError::UnsupportedMetadata {
            key: found_key,
            value: found_value,
            supported: found_supported,
        } => {
            assert_eq!(found_key, format!("{arch}.{key}"));
            assert_eq!(found_value, named_value, "{key}");
            assert_eq!(found_supported, supported, "{key}");
        }
        other => panic!("{key}: expected UnsupportedMetadata, found {other:?}"),
    }
    for part in [key, named_value, supported] {
        assert!(message.contains(part), "`{part}` missing from: {message}");
    }
}

fn text(value: &str) -> Value {
    Value::String(value.to_string())
}

#[test]
fn rope_scaling_types_other_than_none_linear_and_yarn_are_refused() {
    for scaling in ["llama3", "longrope", "dynamic"] {
        let named = format!("`{scaling}`");
        refused(
            "qwen2",
            "rope.scaling.type",
            text(scaling),
            &named,
            "none, linear, yarn",
        );
    }
}

#[test]
fn linear_rope_scaling_is_read_as_llama_cpp_reads_it() {
    let scale = |extra: &[(&str, Value)]| config("llama", extra).expect("loads").rope_freq_scale;
    assert_eq!(scale(&[]), 1.0);
    let linear = text("linear");
    let factor = ("rope.scaling.factor", Value::F32(4.0));
    assert_eq!(
        scale(&[("rope.scaling.type", linear), factor.clone()]),
        0.25
    );
    assert_eq!(
        scale(&[("rope.scaling.type", text("none")), factor.clone()]),
        1.0
    );
    // llama.cpp reads a missing type as linear, and the factor's older key too.
    assert_eq!(scale(&[factor]), 0.25);
    assert_eq!(scale(&[("rope.scale_linear", Value::F32(2.0))]), 0.5);
}

#[test]
fn pooling_is_read_and_rank_is_refused() {
    for (value, pooling) in [
        (0, None),
        (1, Some(Pooling::Mean)),
        (2, Some(Pooling::First)),
        (3, Some(Pooling::Last)),
    ] {
        let read = config("llama", &[("pooling_type", Value::U32(value))]).expect("loads");
        assert_eq!(read.pooling, pooling, "pooling_type {value}");
    }
    assert_eq!(config("llama", &[]).expect("loads").pooling, None);
    for (value, name) in [(4, "rank"), (9, "unknown")] {
        let named = format!("{value} ({name})");
        refused(
            "llama",
            "pooling_type",
            Value::U32(value),
            &named,
            "0 (none), 1 (mean), 2 (cls), 3 (last)",
        );
    }
}

#[test]
fn non_causal_attention_is_refused() {
    let named = "false (non-causal attention)";
    let supported = "true (causal attention)";
    refused(
        "qwen3",
        "attention.causal",
        Value::Bool(false),
        named,
        supported,
    );
    config("qwen3", &[("attention.causal", Value::Bool(true))]).expect("causal loads");
}

#[test]
fn activations_the_row_does_not_compute_are_refused() {
    let supported = "silu, swish, swiglu (llama)";
    for name in ["gelu", "gelu_pytorch_tanh", "relu"] {
        let named = format!("`{name}`");
        refused("llama", "hidden_activation", text(name), &named, supported);
    }
    config("llama", &[("hidden_activation", text("silu"))]).expect("SiLU loads");
}

#[test]
fn expert_gating_other_than_softmax_is_refused() {
    let supported = "0 (none), 1 (softmax)";
    for (value, name) in [(2, "sigmoid"), (3, "softmax_weight"), (4, "sqrt_softplus")] {
        let named = format!("{value} ({name})");
        refused(
            "olmoe",
            "expert_gating_func",
            Value::U32(value),
            &named,
            supported,
        );
    }
    let softmax = config("olmoe", &[("expert_gating_func", Value::U32(1))]).expect("loads");
    assert_eq!((softmax.expert_count, softmax.expert_used_count), (4, 2));
}

#[test]
fn experts_in_a_dense_row_are_refused() {
    let supported = "0 (llama has a dense feed-forward)";
    refused("llama", "expert_count", Value::U32(8), "8", supported);
    config("llama", &[("expert_count", Value::U32(0))]).expect("no experts loads");
}

#[test]
fn soft_capping_in_a_row_without_it_is_refused() {
    let supported = "0 (qwen2 has no soft-capping)";
    refused(
        "qwen2",
        "attn_logit_softcapping",
        Value::F32(50.0),
        "50",
        supported,
    );
    refused(
        "qwen2",
        "final_logit_softcapping",
        Value::F32(30.0),
        "30",
        supported,
    );
    let unset = [("final_logit_softcapping", Value::F32(0.0))];
    let config = config("qwen2", &unset).expect("an unset cap loads");
    assert_eq!(config.final_logit_softcap, None);
}

#[test]
fn per_layer_attention_variants_a_row_lacks_are_refused() {
    let supported = "absent (llama windows every layer alike)";
    let pattern = "attention.sliding_window_pattern";
    refused("llama", pattern, Value::U32(6), "6", supported);
    let supported = "absent (llama has one RoPE base in every layer)";
    let base = Value::F32(10_000.0);
    refused("llama", "rope.freq_base_swa", base, "10000", supported);
}

#[test]
fn scales_the_decoder_does_not_apply_are_refused() {
    let cases = [
        ("attention.scale", 0.125, "0 (not applied)"),
        ("embedding_scale", 12.0, "0, 1 (not applied)"),
        ("logit_scale", 0.5, "0, 1 (not applied)"),
        ("residual_scale", 0.25, "0, 1 (not applied)"),
        ("expert_weights_scale", 2.5, "0, 1 (not applied)"),
    ];
    for (key, value, supported) in cases {
        refused(
            "olmoe",
            key,
            Value::F32(value),
            &value.to_string(),
            supported,
        );
    }
    let neutral = [
        ("attention.scale", Value::F32(0.0)),
        ("embedding_scale", Value::F32(1.0)),
        ("logit_scale", Value::F32(0.0)),
    ];
    config("olmoe", &neutral).expect("neutral scales load");
}

#[test]
fn today_s_rows_have_the_same_configuration_in_every_layer() {
    let window = [("attention.sliding_window", Value::U32(64))];
    let config = config("qwen2", &window).expect("loads");
    assert_eq!(config.sliding_window, Some(64));
    assert_eq!(config.layers().len(), 2);
    for layer in config.layers() {
        assert_eq!(
            (
                layer.rope_theta,
                layer.rope_freq_scale,
                layer.sliding_window
            ),
            (10_000.0, 1.0, Some(64))
        );
    }
    assert_eq!(config.embedding_scale(), None);
}

#[test]
fn a_layer_count_no_model_approaches_is_refused_before_it_sizes_the_layers() {
    match config("llama", &[("block_count", Value::U32(u32::MAX))]) {
        Err(ModelError::BadHyperparameter { key, message }) => {
            assert_eq!(key, "llama.block_count");
            assert!(message.contains(&u32::MAX.to_string()), "{message}");
        }
        other => panic!("expected BadHyperparameter, found {other:?}"),
    }
}

#[test]
fn more_logit_rows_than_token_texts_is_refused() {
    let mut writer = GgufWriter::new();
    let metadata = [
        ("general.architecture", Value::String("llama".into())),
        ("llama.block_count", Value::U32(2)),
        ("llama.context_length", Value::U32(256)),
        ("llama.embedding_length", Value::U32(64)),
        ("llama.feed_forward_length", Value::U32(128)),
        ("llama.attention.head_count", Value::U32(4)),
        ("llama.attention.layer_norm_rms_epsilon", Value::F32(1e-5)),
        ("llama.vocab_size", Value::U32(32)),
    ];
    for (key, value) in metadata {
        writer.add_metadata(key, value).expect("new key");
    }
    let texts = (0..16).map(|i| format!("t{i}")).collect();
    writer
        .add_metadata(
            "tokenizer.ggml.tokens",
            Value::Array(runit_gguf::Array::String(texts)),
        )
        .expect("new key");
    let mut bytes = Vec::new();
    writer
        .write(&mut bytes, |_, _| Ok(Cow::Borrowed(&[][..])))
        .expect("metadata-only file");
    let file = GgufFile::from_bytes(bytes).expect("the file reads back");
    match ModelConfig::from_gguf(&file) {
        Err(ModelError::BadHyperparameter { key, message }) => {
            assert_eq!(key, "llama.vocab_size");
            assert!(
                message.contains("32") && message.contains("16"),
                "{message}"
            );
        }
        other => panic!("expected BadHyperparameter, found {other:?}"),
    }
}
