//! `runit synth` end to end: small dense and mixture-of-experts files read back (shapes and
//! types against the model's configuration), loaded on the CPU backend and run (finite logits,
//! `runit bench` and `runit generate`), full-depth SmolLM2 files against the per-tensor types
//! llama-quantize chose for the real model (tests/golden/MODELS.json, and the real files' tensor
//! tables when fetched), and clear errors with exit code 1.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::Arc;

use runit_backend::{Backend, KvType, SequenceSpan};
use runit_backend_cpu::CpuBackend;
use runit_gguf::{GgufFile, TensorInfo};
use runit_model::{Batch, KvState, Model, ModelConfig, Scratch};
use runit_quant::GgmlType;
use serde_json::Value as Json;

const RUNIT: &str = env!("CARGO_BIN_EXE_runit");

fn golden_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/golden")
}

fn models_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models")
}

/// A path in the temporary directory, removed when dropped.
struct TempFile(PathBuf);

impl TempFile {
    fn new(name: &str) -> TempFile {
        TempFile(std::env::temp_dir().join(format!("runit-synth-{}-{name}", std::process::id())))
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn runit(args: &[&str]) -> Output {
    Command::new(RUNIT).args(args).output().expect("run runit")
}

fn succeed(args: &[&str]) -> String {
    let output = runit(args);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "runit {args:?} failed:\n{stderr}");
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn synth(shape: &str, ty: &str, layers: Option<&str>, out: &TempFile) -> GgufFile {
    let path = out.0.to_str().expect("UTF-8 temp path");
    let mut args = vec!["synth", "--shape", shape, "--type", ty, path, "--seed", "5"];
    if let Some(layers) = layers {
        args.extend(["--layers", layers]);
    }
    succeed(&args);
    GgufFile::open(&out.0).expect("the synthetic file reads back")
}

/// The shape every tensor must have, from the model crate's tensor schema for the
/// configuration's row and whether the model ties its embeddings (ggml order).
fn expected_shapes(config: &ModelConfig, tied_embeddings: bool) -> BTreeMap<String, Vec<u64>> {
    config
        .arch
        .tensors(&config.dimensions(), config.block_count)
        .into_iter()
        .filter(|tensor| tensor.spec.is_written(config.arch, tied_embeddings))
        .map(|tensor| {
            let shape = tensor.shape.iter().map(|&extent| extent as u64).collect();
            (tensor.name, shape)
        })
        .collect()
}

/// Every tensor has the configured shape; vectors are F32 and matrices pass `matrix_type`.
fn check_tensors(
    file: &GgufFile,
    config: &ModelConfig,
    tied_embeddings: bool,
    matrix_type: impl Fn(&TensorInfo) -> bool,
) {
    let expected = expected_shapes(config, tied_embeddings);
    let found: BTreeMap<String, Vec<u64>> = file
        .tensors()
        .iter()
        .map(|info| (info.name.clone(), info.shape.clone()))
        .collect();
    assert_eq!(found, expected);
    for info in file.tensors() {
        if info.shape.len() == 1 {
            assert_eq!(info.ty, GgmlType::F32, "{}", info.name);
        } else {
            assert!(matrix_type(info), "{} is {}", info.name, info.ty);
        }
    }
    let last = file.tensors().last().expect("tensors");
    let data_end = last.offset + last.n_bytes;
    let padded = data_end.div_ceil(file.alignment()) * file.alignment();
    assert_eq!(file.file_size(), file.data_offset() + padded, "file size");
}

/// Loads the file on the CPU backend and checks a prompt's logits are finite and spread.
fn forward_is_finite(file: GgufFile) {
    let backend: Arc<dyn Backend> = Arc::new(CpuBackend::new(2).expect("CPU backend"));
    let model = Model::load(Arc::new(file), backend).expect("the model loads");
    let vocab = model.config.vocab_size as u32;
    let tokens = [
        model.config.vocab_size as u32 - 1,
        0,
        17,
        1000,
        vocab / 2,
        3,
    ];
    let positions: Vec<u32> = (0..tokens.len() as u32).collect();
    let spans = [SequenceSpan {
        first_row: 0,
        rows: tokens.len(),
        start_position: 0,
        block_table: vec![0],
        block_size: 16,
    }];
    let mut kv = KvState::new(&model, 16, KvType::F32.into()).expect("KV cache");
    let mut scratch = Scratch::new(&model, tokens.len()).expect("scratch");
    let mut logits = Vec::new();
    let batch = Batch {
        tokens: &tokens,
        positions: &positions,
        spans: &spans,
        window_spans: None,
        logit_rows: &[0, 5],
        rows_alone: false,
    };
    model
        .forward(&batch, &mut kv, &mut scratch, &mut logits, None)
        .expect("forward pass");
    assert_eq!(logits.len(), 2 * vocab as usize);
    assert!(
        logits.iter().all(|logit| logit.is_finite()),
        "non-finite logits"
    );
    let mean = logits.iter().sum::<f32>() / logits.len() as f32;
    let spread = logits.iter().map(|l| (l - mean).abs()).sum::<f32>() / logits.len() as f32;
    assert!(spread > 1e-3 && spread < 100.0, "logit spread {spread}");
}

#[test]
fn qwen2_5_q8_0_reads_back_loads_and_runs() {
    let out = TempFile::new("qwen2.5-0.5b-Q8_0.gguf");
    let file = synth("qwen2.5-0.5b", "Q8_0", Some("2"), &out);
    assert_eq!(file.get_str("general.architecture").expect("arch"), "qwen2");
    assert_eq!(
        file.get_str("general.name").expect("name"),
        "synthetic qwen2.5-0.5b"
    );
    assert_eq!(file.get_u32("general.file_type").expect("file type"), 7);
    let config = ModelConfig::from_gguf(&file).expect("config");
    let hyperparameters = (
        config.block_count,
        config.embedding_length,
        config.feed_forward_length,
        config.head_count,
        config.head_count_kv,
        config.head_dim,
        config.vocab_size,
    );
    assert_eq!(hyperparameters, (2, 896, 4864, 14, 2, 64, 151_936));
    assert_eq!(config.rope_theta, 1e6);
    check_tensors(&file, &config, true, |info| info.ty == GgmlType::Q8_0);
    forward_is_finite(file);

    let path = out.0.to_str().expect("UTF-8 path");
    let bench = succeed(&["bench", "-m", path, "-p", "16", "-n", "8", "-t", "2"]);
    assert!(bench.contains("pp16") && bench.contains("tg8"), "{bench}");
    // Where a generation step's time goes (host time per step).
    assert!(
        bench.contains("tg8: a step takes") && bench.contains("on the host"),
        "{bench}"
    );
    // Greedy picks on the device (token ids copied), for two sequences decoded together.
    let ids = succeed(&[
        "bench",
        "-m",
        path,
        "-p",
        "0",
        "-n",
        "4",
        "-r",
        "1",
        "--batch",
        "2",
        "--pick-on-device",
    ]);
    assert!(ids.contains("tg4 x2 ids"), "{ids}");
    // Nothing to apply it to: refused, not ignored.
    let refused = runit(&[
        "bench",
        "-m",
        path,
        "-p",
        "8",
        "-n",
        "0",
        "--pick-on-device",
    ]);
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("--pick-on-device"));
    // Speculation is measured on one sequence: --batch and -d are refused, not ignored.
    for shape in [["--batch", "2"], ["-d", "16"]] {
        let mut argv = vec!["bench", "-m", path, "-n", "4", "--draft-ngram", "2"];
        argv.extend(shape);
        let refused = runit(&argv);
        assert!(!refused.status.success(), "{shape:?}");
        let stderr = String::from_utf8_lossy(&refused.stderr);
        assert!(stderr.contains("--batch and -d"), "{stderr}");
    }
    succeed(&["generate", "-m", path, "-p", "hello", "-n", "4", "-t", "2"]);
}

#[test]
fn qwen3_q4_k_m_matches_the_quantize_plan_and_runs() {
    let out = TempFile::new("qwen3-0.6b-Q4_K_M.gguf");
    let file = synth("qwen3-0.6b", "Q4_K_M", Some("2"), &out);
    assert_eq!(file.get_u32("general.file_type").expect("file type"), 15);
    let config = ModelConfig::from_gguf(&file).expect("config");
    assert_eq!(config.arch.name, "qwen3");
    assert_eq!((config.head_dim, config.q_width()), (128, 2048));
    assert_eq!((config.head_count, config.head_count_kv), (16, 8));
    check_tensors(&file, &config, true, |info| {
        matches!(info.ty, GgmlType::Q4_K | GgmlType::Q6_K)
    });
    // `runit quantize` re-plans every tensor from its name and shape: it must keep each type.
    let requantized = TempFile::new("qwen3-0.6b-requant.gguf");
    let paths = [&out, &requantized].map(|file| file.0.to_str().expect("UTF-8 path"));
    succeed(&["quantize", paths[0], paths[1], "Q4_K_M"]);
    let again = GgufFile::open(&requantized.0).expect("requantized file");
    for (info, other) in file.tensors().iter().zip(again.tensors()) {
        assert_eq!((&info.name, info.ty), (&other.name, other.ty));
    }
    forward_is_finite(file);
}

#[test]
fn olmoe_q8_0_reads_back_loads_and_runs() {
    let out = TempFile::new("olmoe-1b-7b-Q8_0.gguf");
    let file = synth("olmoe-1b-7b", "Q8_0", Some("1"), &out);
    assert_eq!(file.get_str("general.architecture").expect("arch"), "olmoe");
    let config = ModelConfig::from_gguf(&file).expect("config");
    let hyperparameters = (
        config.block_count,
        config.embedding_length,
        config.feed_forward_length,
        config.head_count,
        config.head_count_kv,
        config.head_dim,
        config.vocab_size,
    );
    assert_eq!(hyperparameters, (1, 2048, 1024, 16, 16, 128, 50_304));
    let experts = (
        config.expert_count,
        config.expert_used_count,
        config.expert_weights_norm,
    );
    assert_eq!(experts, (64, 8, false));
    assert_eq!((config.rope_theta, config.rms_norm_eps), (10_000.0, 1e-5));
    assert_eq!(config.context_length, 4096);
    // The router stays F32 as llama-quantize keeps it; every other matrix is Q8_0.
    check_tensors(&file, &config, false, |info| {
        let router = info.name.ends_with("ffn_gate_inp.weight");
        info.ty
            == if router {
                GgmlType::F32
            } else {
                GgmlType::Q8_0
            }
    });
    forward_is_finite(file);

    let path = out.0.to_str().expect("UTF-8 path");
    succeed(&["generate", "-m", path, "-p", "hello", "-n", "4", "-t", "2"]);
}

/// llama-quantize's choices for the real SmolLM2-135M, per preset: synth must make the same.
#[test]
fn smollm2_types_match_llama_quantize() {
    let text = std::fs::read_to_string(golden_dir().join("MODELS.json")).expect("MODELS.json");
    let inventory: Vec<Json> = serde_json::from_str(&text).expect("MODELS.json is JSON");
    for preset in ["Q4_0", "Q4_K_M", "Q5_K_M", "Q6_K", "Q8_0"] {
        let name = format!("SmolLM2-135M-Instruct.requant-{preset}.gguf");
        let entry = inventory
            .iter()
            .find(|entry| entry["file"] == name.as_str())
            .unwrap_or_else(|| panic!("{name} in MODELS.json"));
        let out = TempFile::new(&format!("smollm2-{preset}.gguf"));
        let file = synth("smollm2-135m", preset, None, &out);
        let types: BTreeMap<String, String> = file
            .tensors()
            .iter()
            .map(|info| (info.name.clone(), info.ty.name().to_string()))
            .collect();
        let golden: BTreeMap<String, String> =
            serde_json::from_value(entry["tensor_types"].clone()).expect("tensor_types");
        assert_eq!(types, golden, "{preset}");
        assert_eq!(
            u64::from(file.get_u32("general.file_type").expect("file type")),
            entry["general.file_type"].as_u64().expect("file type")
        );
        for (key, value) in entry["hparams"].as_object().expect("hparams") {
            let ours = file.get(&format!("llama.{key}")).expect(key);
            let ours = ours.as_f64().or(ours.as_u64().map(|v| v as f64));
            assert_eq!(ours, value.as_f64(), "{key}");
        }
        // The real file, when fetched: the same tensor table, offsets included.
        let real = models_dir().join("requant").join(&name);
        if !real.exists() {
            eprintln!(
                "skipping the tensor-table comparison: {} is absent",
                real.display()
            );
            continue;
        }
        let real = GgufFile::open(&real).expect("real file");
        let table = |file: &GgufFile| -> Vec<(String, Vec<u64>, GgmlType, u64)> {
            file.tensors()
                .iter()
                .map(|info| (info.name.clone(), info.shape.clone(), info.ty, info.offset))
                .collect()
        };
        assert_eq!(table(&file), table(&real), "{preset}");
    }
}

#[test]
fn unknown_shapes_and_types_fail_with_the_valid_names() {
    let list = succeed(&["synth", "--list-shapes"]);
    let help = succeed(&["synth", "--help"]);
    let names: Vec<&str> = list
        .lines()
        .skip(1)
        .filter_map(|line| line.split_whitespace().next())
        .collect();
    assert_eq!(names.len(), 7, "{list}");
    let out = TempFile::new("refused.gguf");
    let path = out.0.to_str().expect("UTF-8 path");
    let output = runit(&["synth", "--shape", "gpt-5", "--type", "Q8_0", path]);
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&output.stderr);
    for name in &names {
        assert!(help.contains(name), "--help lacks {name}");
        assert!(stderr.contains(name), "{stderr}");
    }
    let output = runit(&["synth", "--shape", names[0], "--type", "Q9_K", path]);
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("Q9_K") && stderr.contains("Q4_K_M") && stderr.contains("IQ4_XS"),
        "{stderr}"
    );
    assert!(!out.0.exists(), "nothing written");
}
