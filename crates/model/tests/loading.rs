//! The weight loader's rules on tiny F32 files: the tensors of the row's schema load, a tied
//! output head is the token embedding, and a missing, misshapen, mistyped or unexpected tensor
//! is an error naming it.

use std::borrow::Cow;
use std::sync::Arc;

use runit_backend::Backend;
use runit_backend_cpu::CpuBackend;
use runit_gguf::{GgufFile, GgufWriter, Value};
use runit_model::schema::Dimensions;
use runit_model::{Model, ModelError};
use runit_quant::GgmlType;

const DIMENSIONS: Dimensions = Dimensions {
    embedding: 64,
    vocab: 32,
    q_width: 64,
    kv_width: 32,
    head_dim: 16,
    feed_forward: 96,
    experts: 4,
    rope_dim: 16,
};

/// A tensor to write: name, shape (ggml order), type.
type Entry = (String, Vec<u64>, GgmlType);

/// The tensors of a two-layer `arch` model: required ones, the output head unless `tied`.
fn schema_tensors(arch: &str, tied: bool) -> Vec<Entry> {
    let row = runit_model::arch::find(arch).expect("a row");
    let dimensions = Dimensions {
        experts: if arch == "olmoe" { 4 } else { 0 },
        ..DIMENSIONS
    };
    row.tensors(&dimensions, 2)
        .into_iter()
        .filter(|tensor| tensor.spec.is_written(row, tied))
        .map(|tensor| {
            let shape = tensor.shape.iter().map(|&extent| extent as u64).collect();
            (tensor.name, shape, GgmlType::F32)
        })
        .collect()
}

/// Loads a zero-filled two-layer file of `arch` holding `tensors`.
fn load(arch: &str, tensors: &[Entry]) -> Result<Model, ModelError> {
    load_declaring(arch, tensors, 2)
}

/// Loads a zero-filled file of `arch` holding `tensors` whose metadata says `block_count`.
fn load_declaring(arch: &str, tensors: &[Entry], block_count: u32) -> Result<Model, ModelError> {
    let mut writer = GgufWriter::new();
    let key = |suffix: &str| format!("{arch}.{suffix}");
    let mut metadata = vec![
        (
            "general.architecture".to_string(),
            Value::String(arch.to_string()),
        ),
        (key("block_count"), Value::U32(block_count)),
        (key("context_length"), Value::U32(64)),
        (key("embedding_length"), Value::U32(64)),
        (key("feed_forward_length"), Value::U32(96)),
        (key("attention.head_count"), Value::U32(4)),
        (key("attention.head_count_kv"), Value::U32(2)),
        (key("attention.layer_norm_rms_epsilon"), Value::F32(1e-5)),
        (key("vocab_size"), Value::U32(32)),
    ];
    if arch == "olmoe" {
        metadata.push((key("expert_count"), Value::U32(4)));
        metadata.push((key("expert_used_count"), Value::U32(2)));
    }
    for (key, value) in metadata {
        writer.add_metadata(key, value).expect("new key");
    }
    for (name, shape, ty) in tensors {
        writer
            .add_tensor(name.clone(), *ty, shape.clone())
            .expect("new tensor");
    }
    let mut bytes = Vec::new();
    writer
        .write(&mut bytes, |_, info| {
            Ok(Cow::Owned(vec![0; info.n_bytes as usize]))
        })
        .expect("file written");
    let file = Arc::new(GgufFile::from_bytes(bytes).expect("file reads back"));
    let backend: Arc<dyn Backend> = Arc::new(CpuBackend::new(1).expect("CPU backend"));
    Model::load(file, backend)
}

#[test]
fn every_row_loads_its_schema() {
    for (arch, tied) in [
        ("llama", true),
        ("qwen2", false),
        ("qwen3", true),
        ("olmoe", false),
    ] {
        let model = load(arch, &schema_tensors(arch, tied)).expect(arch);
        let layer = &model.weights.layers[1];
        assert_eq!(layer.q_bias.is_some(), arch == "qwen2", "{arch}");
        let qk_norm = matches!(arch, "qwen3" | "olmoe");
        assert_eq!(layer.q_norm.is_some(), qk_norm, "{arch}");
        assert!(layer.post_attention_norm.is_none() && layer.post_ffn_norm.is_none());
        let output = if tied {
            "token_embd.weight"
        } else {
            "output.weight"
        };
        assert_eq!(model.weights.output.name, output, "{arch}");
    }
}

#[test]
fn a_missing_tensor_is_named() {
    let mut tensors = schema_tensors("llama", true);
    tensors.retain(|(name, _, _)| name != "blk.1.ffn_up.weight");
    match load("llama", &tensors) {
        Err(ModelError::MissingTensor { name }) => assert_eq!(name, "blk.1.ffn_up.weight"),
        other => panic!("expected MissingTensor, found {:?}", other.err()),
    }
    // OLMoE does not tie its output head to the embedding (llama.cpp requires it too).
    let mut tensors = schema_tensors("olmoe", false);
    tensors.retain(|(name, _, _)| name != "output.weight");
    match load("olmoe", &tensors) {
        Err(ModelError::MissingTensor { name }) => assert_eq!(name, "output.weight"),
        other => panic!("expected MissingTensor, found {:?}", other.err()),
    }
}

#[test]
fn a_misshapen_or_mistyped_tensor_is_named() {
    let mut tensors = schema_tensors("qwen2", true);
    let bias = tensors
        .iter_mut()
        .find(|(name, _, _)| name == "blk.0.attn_k.bias")
        .expect("a bias");
    bias.1 = vec![64];
    match load("qwen2", &tensors) {
        Err(ModelError::TensorShape {
            name,
            expected,
            found,
        }) => assert_eq!(
            (name.as_str(), expected, found),
            ("blk.0.attn_k.bias", vec![32], vec![64])
        ),
        other => panic!("expected TensorShape, found {:?}", other.err()),
    }
    let mut tensors = schema_tensors("qwen2", true);
    let norm = tensors
        .iter_mut()
        .find(|(name, _, _)| name == "output_norm.weight")
        .expect("a norm");
    norm.2 = GgmlType::F16;
    match load("qwen2", &tensors) {
        Err(ModelError::TensorType { name, ty, .. }) => {
            assert_eq!((name.as_str(), ty), ("output_norm.weight", GgmlType::F16))
        }
        other => panic!("expected TensorType, found {:?}", other.err()),
    }
}

#[test]
fn a_tensor_outside_the_schema_is_refused() {
    for extra in [
        "blk.0.attn_output.bias",
        "blk.1.ffn_gate_shexp.weight",
        "cls.output.weight",
    ] {
        let mut tensors = schema_tensors("llama", true);
        tensors.push((extra.to_string(), vec![64], GgmlType::F32));
        match load("llama", &tensors) {
            Err(ModelError::UnexpectedTensor { name, arch }) => {
                assert_eq!((name.as_str(), arch.as_str()), (extra, "llama"))
            }
            other => panic!(
                "{extra}: expected UnexpectedTensor, found {:?}",
                other.err()
            ),
        }
    }
    // A layer beyond the block count is not part of the model either.
    let mut tensors = schema_tensors("llama", true);
    tensors.push((
        "blk.2.attn_norm.weight".to_string(),
        vec![64],
        GgmlType::F32,
    ));
    assert!(matches!(
        load("llama", &tensors),
        Err(ModelError::UnexpectedTensor { .. })
    ));
}

#[test]
fn a_layer_count_beyond_the_tensors_present_is_refused_before_it_sizes_anything() {
    let tensors = schema_tensors("llama", true);
    for block_count in [1_000, 60_000] {
        match load_declaring("llama", &tensors, block_count) {
            Err(ModelError::BadHyperparameter { key, message }) => {
                assert_eq!(key, "llama.block_count");
                assert!(message.contains(&block_count.to_string()), "{message}");
            }
            other => panic!("expected BadHyperparameter, found {:?}", other.err()),
        }
    }
}

#[test]
fn a_kv_cache_beyond_the_memory_is_refused_before_it_is_allocated() {
    let model = load("llama", &schema_tensors("llama", false)).expect("loads");
    // 2^52 cells of 32 values per layer: far beyond any machine, refused with the bytes asked
    // (an allocation of zeroed pages would have succeeded and been killed when touched).
    match runit_model::KvState::new(&model, 1 << 52, runit_backend::KvType::F16.into()) {
        Err(ModelError::Backend(runit_backend::BackendError::OutOfMemory { bytes, .. })) => {
            assert!(bytes > 1 << 52, "{bytes}")
        }
        Err(other) => panic!("expected out of memory, got {other}"),
        Ok(_) => panic!("a cache of 2^52 cells was allocated"),
    }
    // A small one still allocates.
    runit_model::KvState::new(&model, 64, runit_backend::KvType::F16.into()).expect("64 cells");
}
