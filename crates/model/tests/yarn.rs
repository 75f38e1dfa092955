//! YaRN metadata read as llama.cpp reads it: the type, factor and original context from the
//! file; ext_factor 1 and betas 32 / 1 by default; the magnitude factor llama.cpp hands ggml
//! (Hugging Face's `get_mscale`, over ggml's own `1 + 0.1·ln s`, times
//! `rope.scaling.attn_factor`), written here from those formulas in f64.

mod common;

use runit_gguf::Value;
use runit_model::{ModelConfig, ModelError};

/// A Qwen2 model's metadata (context 32768) with `extra`.
fn config(extra: &[(&str, Value)]) -> Result<ModelConfig, ModelError> {
    let defaults = vec![
        ("block_count", Value::U32(2)),
        ("context_length", Value::U32(32768)),
        ("embedding_length", Value::U32(64)),
        ("feed_forward_length", Value::U32(128)),
        ("attention.head_count", Value::U32(4)),
        ("attention.layer_norm_rms_epsilon", Value::F32(1e-6)),
        ("rope.freq_base", Value::F32(1e6)),
        ("vocab_size", Value::U32(32)),
    ];
    common::metadata_config("qwen2", defaults, extra, &[])
}

fn text(value: &str) -> Value {
    Value::String(value.to_string())
}

/// Hugging Face's `get_mscale(scale, m)`.
fn mscale(scale: f64, m: f64) -> f64 {
    if scale <= 1.0 {
        1.0
    } else {
        0.1 * m * scale.ln() + 1.0
    }
}

#[test]
fn qwen25_yarn_is_read_with_llama_cpp_s_defaults() {
    let config = config(&[
        ("rope.scaling.type", text("yarn")),
        ("rope.scaling.factor", Value::F32(4.0)),
        ("rope.scaling.original_context_length", Value::U32(32768)),
    ])
    .expect("loads");
    for layer in config.layers() {
        assert_eq!(layer.rope_freq_scale, 0.25);
        let yarn = layer.rope_yarn.expect("YaRN");
        assert_eq!(yarn.ext_factor, 1.0);
        assert_eq!((yarn.beta_fast, yarn.beta_slow), (32.0, 1.0));
        assert_eq!(yarn.original_context, 32768);
        let want = mscale(4.0, 1.0) / (1.0 + 0.1 * 4f64.ln());
        assert!(
            (f64::from(yarn.attn_factor) - want).abs() < 1e-6,
            "{}",
            yarn.attn_factor
        );
    }
}

#[test]
fn the_file_s_yarn_settings_are_applied() {
    let config = config(&[
        ("rope.scaling.type", text("yarn")),
        ("rope.scaling.factor", Value::F32(40.0)),
        ("rope.scaling.original_context_length", Value::U32(4096)),
        ("rope.scaling.yarn_beta_fast", Value::F32(16.0)),
        ("rope.scaling.yarn_beta_slow", Value::F32(2.0)),
        ("rope.scaling.yarn_ext_factor", Value::F32(0.5)),
        ("rope.scaling.yarn_log_multiplier", Value::F32(0.707)),
        ("rope.scaling.attn_factor", Value::F32(1.25)),
    ])
    .expect("loads");
    let yarn = config.layer(0).rope_yarn.expect("YaRN");
    assert_eq!((yarn.beta_fast, yarn.beta_slow), (16.0, 2.0));
    assert_eq!((yarn.ext_factor, yarn.original_context), (0.5, 4096));
    let factor = 40f64;
    let want = mscale(factor, 1.0) / mscale(factor, 0.707) / (1.0 + 0.1 * factor.ln()) * 1.25;
    assert!(
        (f64::from(yarn.attn_factor) - want).abs() < 1e-6,
        "{}",
        yarn.attn_factor
    );
}

#[test]
fn linear_scaling_keeps_plain_rope_unless_a_magnitude_is_given() {
    let linear = [
        ("rope.scaling.type", text("linear")),
        ("rope.scaling.factor", Value::F32(2.0)),
    ];
    let config_plain = config(&linear).expect("loads");
    assert_eq!(config_plain.layer(0).rope_yarn, None);
    assert_eq!(config_plain.layer(0).rope_freq_scale, 0.5);
    let mut scaled = linear.to_vec();
    scaled.push(("rope.scaling.attn_factor", Value::F32(0.8)));
    let yarn = config(&scaled)
        .expect("loads")
        .layer(1)
        .rope_yarn
        .expect("a factor");
    assert_eq!((yarn.ext_factor, yarn.attn_factor), (0.0, 0.8));
}

#[test]
fn bad_yarn_settings_are_refused_by_name() {
    let error = config(&[("rope.scaling.type", text("longrope"))]).expect_err("refused");
    assert!(
        error.to_string().contains("qwen2.rope.scaling.type"),
        "{error}"
    );
    assert!(error.to_string().contains("none, linear, yarn"), "{error}");
    let error = config(&[
        ("rope.scaling.type", text("yarn")),
        ("rope.scaling.yarn_ext_factor", Value::F32(-1.0)),
    ])
    .expect_err("refused");
    assert!(
        error
            .to_string()
            .contains("qwen2.rope.scaling.yarn_ext_factor"),
        "{error}"
    );
}
