//! `runit quantize` end to end, against files llama-quantize made (tests/golden): every
//! synthetic file and SmolLM2 requantization rebuilt byte for byte (per-tensor checksums
//! first, so a failure names the tensors), and clear errors with exit code 1.

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use runit_gguf::GgufFile;
use serde_json::Value as Json;
use sha2::{Digest, Sha256};

const RUNIT: &str = env!("CARGO_BIN_EXE_runit");

/// Types whose llama.cpp quantizer is a plain reference routine: our bytes must equal theirs.
const EXACT_TYPES: [&str; 8] = ["F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1"];

fn golden_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/golden")
}

fn models_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models")
}

fn find_model(name: &str) -> Option<PathBuf> {
    [models_dir().join(name)]
        .into_iter()
        .find(|path| path.exists())
}

/// MODELS.json entries by file name.
fn inventory() -> HashMap<String, Json> {
    let text = std::fs::read_to_string(golden_dir().join("MODELS.json")).expect("MODELS.json");
    let Json::Array(entries) = serde_json::from_str(&text).expect("MODELS.json is JSON") else {
        panic!("MODELS.json is not an array");
    };
    entries
        .into_iter()
        .map(|entry| (entry["file"].as_str().expect("file").to_string(), entry))
        .collect()
}

/// (name, type, data_sha256) of every tensor, in file order, from a dequant golden file.
fn golden_tensors(model_file: &str) -> Vec<(String, String, String)> {
    let stem = model_file.strip_suffix(".gguf").expect(".gguf name");
    let path = golden_dir().join(format!("dequant/{stem}.dequant.jsonl.gz"));
    let file = std::fs::File::open(&path).expect("dequant golden file");
    let reader = BufReader::new(flate2::read::GzDecoder::new(file));
    reader
        .lines()
        .skip(1) // header
        .map(|line| {
            let line: Json = serde_json::from_str(&line.expect("gzip line")).expect("JSON line");
            let field = |key: &str| line[key].as_str().expect("string field").to_string();
            (field("name"), field("type"), field("data_sha256"))
        })
        .collect()
}

fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect()
}

fn file_sha256(path: &Path) -> String {
    sha256_hex(&std::fs::read(path).expect("output file"))
}

fn run_quantize(args: &[&str]) -> Output {
    Command::new(RUNIT)
        .arg("quantize")
        .args(args)
        .output()
        .expect("run the runit binary")
}

fn quantize_file(input: &Path, output: &Path, ty: &str, pure: bool) {
    let (input, output) = (
        input.to_str().expect("utf-8"),
        output.to_str().expect("utf-8"),
    );
    let mut args = vec![input, output, ty, "--allow-requantize", "--force"];
    if pure {
        args.push("--pure");
    }
    let result = run_quantize(&args);
    assert!(
        result.status.success(),
        "runit quantize {args:?} failed: {}",
        String::from_utf8_lossy(&result.stderr)
    );
}

/// Per-tensor comparison of `output` with the golden checksums of `golden_file`.
struct TensorReport {
    matching: usize,
    total: usize,
    /// Tensors of an exact type (see [`EXACT_TYPES`]) whose bytes differ.
    exact_mismatches: Vec<String>,
}

fn compare_tensors(output: &Path, golden_file: &str) -> TensorReport {
    let file = GgufFile::open(output).expect("our output parses");
    let golden = golden_tensors(golden_file);
    let ours: Vec<_> = file.tensors().iter().collect();
    let names: Vec<&str> = ours.iter().map(|info| info.name.as_str()).collect();
    let golden_names: Vec<&str> = golden.iter().map(|(name, _, _)| name.as_str()).collect();
    assert_eq!(names, golden_names, "{golden_file}: tensor order");
    let mut report = TensorReport {
        matching: 0,
        total: ours.len(),
        exact_mismatches: Vec::new(),
    };
    for (info, (name, ty, sha)) in ours.iter().zip(&golden) {
        assert_eq!(info.ty.name(), ty, "{golden_file}: type of {name}");
        if sha256_hex(file.tensor_data(info)) == *sha {
            report.matching += 1;
        } else if EXACT_TYPES.contains(&ty.as_str()) {
            report.exact_mismatches.push(format!("{name} ({ty})"));
        }
    }
    report
}

/// A quantized input is refused without `--allow-requantize`, an existing output without
/// `--force`; neither refusal writes anything.
#[test]
fn requantizing_and_overwriting_need_their_flags() {
    let Some(source) = find_model("synth-qwen2-Q4_0.gguf") else {
        eprintln!("skipping: synth-qwen2-Q4_0.gguf is absent (scripts/make_requants.sh)");
        return;
    };
    let scratch = Path::new(env!("CARGO_TARGET_TMPDIR")).join("quantize-refusals");
    std::fs::create_dir_all(&scratch).expect("scratch folder");
    let output = scratch.join("out.gguf");
    let _ = std::fs::remove_file(&output);
    let source = source.to_str().expect("utf-8");
    let out = output.to_str().expect("utf-8");

    let refused = run_quantize(&[source, out, "Q8_0"]);
    assert_eq!(refused.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        stderr.contains("already quantized") && stderr.contains("--allow-requantize"),
        "{stderr}"
    );
    assert!(!output.exists());

    let made = run_quantize(&[source, out, "Q8_0", "--allow-requantize"]);
    assert!(
        made.status.success(),
        "{}",
        String::from_utf8_lossy(&made.stderr)
    );
    let before = std::fs::read(&output).expect("output");

    let refused = run_quantize(&[source, out, "Q4_0", "--allow-requantize"]);
    assert_eq!(refused.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        stderr.contains("exists") && stderr.contains("--force"),
        "{stderr}"
    );
    assert_eq!(
        std::fs::read(&output).expect("output"),
        before,
        "output changed"
    );

    let replaced = run_quantize(&[source, out, "Q4_0", "--pure", "--force"]);
    assert!(
        replaced.status.success(),
        "{}",
        String::from_utf8_lossy(&replaced.stderr)
    );
}

#[test]
fn unknown_type_lists_the_valid_ones() {
    let result = run_quantize(&["in.gguf", "out.gguf", "Q7_0"]);
    assert_eq!(result.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&result.stderr);
    for expected in ["Q7_0", "Q4_K_M", "Q8_0", "BF16"] {
        assert!(
            stderr.contains(expected),
            "stderr lacks {expected}: {stderr}"
        );
    }
}

#[test]
fn unreadable_input_shows_the_reader_error() {
    let input = Path::new(env!("CARGO_TARGET_TMPDIR")).join("quantize-not-a-model.gguf");
    std::fs::write(&input, b"this is not a GGUF file at all").expect("write temp file");
    let output = input.with_extension("out.gguf");
    let result = run_quantize(&[
        input.to_str().expect("utf-8"),
        output.to_str().expect("utf-8"),
        "Q8_0",
    ]);
    assert_eq!(result.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&result.stderr);
    assert!(stderr.contains("not a GGUF file"), "stderr: {stderr}");
    assert!(
        stderr.contains("quantize-not-a-model.gguf"),
        "stderr: {stderr}"
    );
    assert!(!output.exists());
}

/// Every synthetic file llama-quantize made with `--pure`, rebuilt from its F32 source:
/// exact types byte for byte (the whole file), K/IQ types by tensor types and order.
#[test]
fn synthetic_models_match_llama_quantize_pure() {
    let inventory = inventory();
    let scratch = Path::new(env!("CARGO_TARGET_TMPDIR")).join("quantize-synth");
    std::fs::create_dir_all(&scratch).expect("scratch folder");
    let mut names: Vec<&String> = inventory
        .keys()
        .filter(|n| n.starts_with("synth-"))
        .collect();
    names.sort();
    let mut checked = 0;
    for name in names {
        let stem = name.strip_suffix(".gguf").expect(".gguf");
        let (arch, ty) = stem["synth-".len()..]
            .split_once('-')
            .expect("synth-ARCH-TYPE");
        if ty == "F32" {
            continue;
        }
        let Some(source) = find_model(&format!("synth-{arch}-F32.gguf")) else {
            eprintln!("skipping {name}: its F32 source is not present");
            continue;
        };
        let output = scratch.join(name);
        quantize_file(&source, &output, ty, true);
        let same_file = file_sha256(&output) == inventory[name.as_str()]["sha256"];
        let report = compare_tensors(&output, name);
        eprintln!(
            "{name}: file sha256 {}, tensors {}/{} byte-identical",
            if same_file { "identical" } else { "differs" },
            report.matching,
            report.total
        );
        assert!(
            report.exact_mismatches.is_empty(),
            "{name}: exact-type tensors differ: {:?}",
            report.exact_mismatches
        );
        // runit-quant's K and IQ quantizers are float-exact ports of ggml's reference
        // routines, so every file is expected to be identical, not only the exact types.
        assert!(
            same_file,
            "{name}: not byte-identical to llama-quantize's file"
        );
        checked += 1;
    }
    assert!(checked >= 14, "only {checked} synthetic files checked");
}

/// The SmolLM2 requantizations, rebuilt from the Q4_1 file, kept in models/requant/ for
/// later tests (an output newer than the binary is reused).
#[test]
fn smollm2_requantizations_have_golden_checksums() {
    let Some(source) = find_model("SmolLM2-135M-Instruct.Q4_1.gguf") else {
        eprintln!(
            "skipping: SmolLM2-135M-Instruct.Q4_1.gguf not fetched (scripts/fetch_models.py)"
        );
        return;
    };
    let inventory = inventory();
    let folder = models_dir().join("requant");
    std::fs::create_dir_all(&folder).expect("models/requant folder");
    let binary_time = std::fs::metadata(RUNIT)
        .and_then(|meta| meta.modified())
        .expect("binary mtime");
    for ty in [
        "Q8_0", "Q4_0", "Q5_0", "F16", "BF16", "Q4_K_M", "Q5_K_M", "Q6_K",
    ] {
        let name = format!("SmolLM2-135M-Instruct.requant-{ty}.gguf");
        let output = folder.join(&name);
        let fresh = std::fs::metadata(&output)
            .and_then(|meta| meta.modified())
            .is_ok_and(|time| time > binary_time)
            && GgufFile::open(&output).is_ok();
        let started = std::time::Instant::now();
        if !fresh {
            quantize_file(&source, &output, ty, false);
        }
        let seconds = started.elapsed().as_secs_f64();
        let same_file = file_sha256(&output) == inventory[name.as_str()]["sha256"];
        let report = compare_tensors(&output, &name);
        eprintln!(
            "{name}: {} in {seconds:.1} s, file sha256 {}, tensors {}/{} byte-identical",
            if fresh { "reused" } else { "quantized" },
            if same_file { "identical" } else { "differs" },
            report.matching,
            report.total
        );
        assert!(
            report.exact_mismatches.is_empty(),
            "{name}: exact-type tensors differ: {:?}",
            report.exact_mismatches
        );
        assert_eq!(report.matching, report.total, "{name}: tensor checksums");
        assert!(
            same_file,
            "{name}: not byte-identical to llama-quantize's file"
        );
    }
}
