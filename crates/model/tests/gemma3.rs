//! The Gemma 3 row's metadata: its windowed layers need `attention.sliding_window`, a window
//! wider than the context or a layer pattern that is not a period of layers is refused naming
//! the key, and the period and the local RoPE base come from the file when it states them.

mod common;

use runit_gguf::Value;
use runit_model::{ModelConfig, ModelError};

/// A six-layer Gemma 3's metadata (window 64, context 256), with `extra` replacing or adding
/// keys and the keys of `removed` left out.
fn config(extra: &[(&str, Value)], removed: &[&str]) -> Result<ModelConfig, ModelError> {
    let defaults = vec![
        ("block_count", Value::U32(6)),
        ("context_length", Value::U32(256)),
        ("embedding_length", Value::U32(64)),
        ("feed_forward_length", Value::U32(128)),
        ("attention.head_count", Value::U32(4)),
        ("attention.head_count_kv", Value::U32(1)),
        ("attention.key_length", Value::U32(32)),
        ("attention.value_length", Value::U32(32)),
        ("attention.layer_norm_rms_epsilon", Value::F32(1e-6)),
        ("attention.sliding_window", Value::U32(64)),
        ("rope.freq_base", Value::F32(1e6)),
        ("vocab_size", Value::U32(32)),
    ];
    common::metadata_config("gemma3", defaults, extra, removed)
}

/// Layer windows and RoPE bases of `config`.
fn layers(config: &ModelConfig) -> Vec<(Option<usize>, f32)> {
    config
        .layers()
        .iter()
        .map(|layer| (layer.sliding_window, layer.rope_theta))
        .collect()
}

#[test]
fn five_local_layers_then_a_global_one_by_default() {
    let config = config(&[], &[]).expect("loads");
    let local = (Some(64), 10_000.0);
    let global = (None, 1e6);
    assert_eq!(layers(&config), [local, local, local, local, local, global]);
    // head_dim 32: the queries take 1 / sqrt(32) before the attention.
    assert_eq!(config.query_scale(), Some(1.0 / 32f32.sqrt()));
    assert_eq!(config.embedding_scale(), Some(8.0));
}

#[test]
fn the_file_s_period_and_local_base_are_read() {
    let extra = [
        ("attention.sliding_window_pattern", Value::U32(3)),
        ("rope.freq_base_swa", Value::F32(5_000.0)),
    ];
    let config = config(&extra, &[]).expect("loads");
    let local = (Some(64), 5_000.0);
    let global = (None, 1e6);
    assert_eq!(
        layers(&config),
        [local, local, global, local, local, global]
    );
}

#[test]
fn a_missing_window_is_refused_by_name() {
    let error = config(&[], &["attention.sliding_window"]).expect_err("refused");
    assert!(
        error
            .to_string()
            .contains("gemma3.attention.sliding_window"),
        "{error}"
    );
}

#[test]
fn a_window_wider_than_the_context_is_refused_by_name() {
    match config(&[("attention.sliding_window", Value::U32(512))], &[]) {
        Err(ModelError::BadHyperparameter { key, message }) => {
            assert_eq!(key, "gemma3.attention.sliding_window");
            assert!(
                message.contains("512") && message.contains("256"),
                "{message}"
            );
        }
        other => panic!("expected BadHyperparameter, found {other:?}"),
    }
}

#[test]
fn a_layer_pattern_that_is_not_a_period_is_refused_by_name() {
    let patterns = [
        Value::String("local,global".into()),
        Value::U32(7),
        Value::Bool(true),
    ];
    for pattern in patterns {
        let extra = [("attention.sliding_window_pattern", pattern.clone())];
        match config(&extra, &[]) {
            Err(ModelError::UnsupportedMetadata { key, supported, .. }) => {
                assert_eq!(key, "gemma3.attention.sliding_window_pattern");
                assert!(supported.contains("period"), "{supported}");
            }
            other => panic!("{pattern:?}: expected UnsupportedMetadata, found {other:?}"),
        }
    }
}
