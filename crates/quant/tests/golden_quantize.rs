//! Quantization against llama-quantize (no importance matrix). The reference rounding types
//! (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, F16, BF16) must be byte-exact. The searched K-quant and
//! IQ4 types are ports of ggml's f32 searches in the same operation order, so they are
//! byte-exact too and are held to that; their RMSE must in any case stay within 1 % of
//! llama.cpp's (the figure the project requires).

mod common;

use common::{find_model, golden_dir, read_jsonl_gz, sha256_hex, Gguf};
use runit_quant::{dequantize, quantize, GgmlType};

const SOURCE: &str = "synth-qwen2-F32.gguf";

fn source() -> Gguf {
    Gguf::open(&find_model(SOURCE).expect("the shipped synthetic F32 model"))
}

fn quantize_tensor(source: &Gguf, name: &str, ty: GgmlType) -> (Vec<f32>, Vec<u8>) {
    let tensor = source
        .tensor(name)
        .unwrap_or_else(|| panic!("{SOURCE}: no tensor {name}"));
    let values = source.read_f32(tensor);
    let n_bytes = ty.row_bytes(values.len() as u64).expect("whole blocks") as usize;
    let mut packed = vec![0u8; n_bytes];
    quantize(ty, &values, &mut packed).unwrap_or_else(|e| panic!("{name}: {e}"));
    (values, packed)
}

#[test]
fn reference_rounding_types_match_llama_quantize_bytes() {
    let source = source();
    for ty in [
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::Q8_0,
    ] {
        let file = format!("synth-qwen2-{ty}.gguf");
        let target = Gguf::open(&find_model(&file).expect("shipped synthetic model"));
        let mut checked = 0;
        for tensor in target.tensors.iter().filter(|t| t.ty == ty) {
            let (_, packed) = quantize_tensor(&source, &tensor.name, ty);
            let expected = target.read(tensor);
            let first_difference = packed.iter().zip(&expected).position(|(a, b)| a != b);
            assert_eq!(
                first_difference,
                None,
                "{file}: {}: bytes differ (block {:?})",
                tensor.name,
                first_difference.map(|at| at / ty.type_size())
            );
            checked += 1;
        }
        println!("{file}: {checked} tensors byte-identical");
        assert_eq!(checked, 15, "{file}");
    }
}

/// Quantizes the F32 tensors of `f32_file` whose golden line in `golden_file` has type `ty`
/// and compares the SHA-256 of the bytes. Returns the number of tensors checked, or `None`
/// when the F32 model is not available here.
fn check_against_golden_sha(f32_file: &str, golden_file: &str, ty: GgmlType) -> Option<usize> {
    let Some(path) = find_model(f32_file) else {
        println!("skipped {golden_file}: {f32_file} not found here");
        return None;
    };
    let source = Gguf::open(&path);
    let lines = read_jsonl_gz(&golden_dir().join("dequant").join(golden_file));
    let mut checked = 0;
    for golden in &lines[1..] {
        if golden["type"].as_str() != Some(ty.name()) {
            continue;
        }
        let name = golden["name"].as_str().expect("name");
        let (_, packed) = quantize_tensor(&source, name, ty);
        assert_eq!(
            sha256_hex(&packed),
            golden["data_sha256"].as_str().expect("data_sha256"),
            "{golden_file}: {name}: {ty} bytes differ"
        );
        checked += 1;
    }
    println!("{golden_file}: {checked} {ty} tensors byte-identical (sha256)");
    assert!(checked > 0, "{golden_file}: no {ty} tensor checked");
    Some(checked)
}

#[test]
fn f16_bf16_and_q8_0_match_golden_checksums() {
    let cases = [
        ("synth-qwen2-F32.gguf", "synth-qwen2-F16", GgmlType::F16),
        ("synth-qwen2-F32.gguf", "synth-qwen2-BF16", GgmlType::BF16),
        ("synth-qwen3-F32.gguf", "synth-qwen3-Q8_0", GgmlType::Q8_0),
        ("synth-llama-F32.gguf", "synth-llama-Q8_0", GgmlType::Q8_0),
        ("synth-olmoe-F32.gguf", "synth-olmoe-Q8_0", GgmlType::Q8_0),
    ];
    let mut total = 0;
    for (f32_file, golden, ty) in cases {
        let golden = format!("{golden}.dequant.jsonl.gz");
        total += check_against_golden_sha(f32_file, &golden, ty).unwrap_or(0);
    }
    // The qwen2 source is shipped, so at least its F16 and BF16 tensors are always checked.
    assert!(total >= 30, "only {total} tensors checked");
}

#[test]
fn searched_types_match_llama_quantize_bytes_and_rmse() {
    let reference: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(golden_dir().join("quantize/qwen2_rmse.json")).expect("rmse"),
    )
    .expect("rmse JSON");
    let source = source();
    let mut failures = Vec::new();
    for ty in [
        GgmlType::Q2_K,
        GgmlType::Q3_K,
        GgmlType::Q4_K,
        GgmlType::Q5_K,
        GgmlType::Q6_K,
        GgmlType::IQ4_NL,
        GgmlType::IQ4_XS,
    ] {
        let file = format!("synth-qwen2-{ty}.gguf");
        let shipped = Gguf::open(&find_model(&file).expect("shipped synthetic model"));
        let tensors = reference["files"][&file]["tensors"]
            .as_object()
            .unwrap_or_else(|| panic!("{file}: no reference tensors"));
        let (mut worst, mut identical, mut squared_error, mut squared_reference, mut count) =
            (0.0f64, 0, 0.0f64, 0.0f64, 0usize);
        for (name, golden) in tensors {
            let (values, packed) = quantize_tensor(&source, name, ty);
            let mut back = vec![0.0f32; values.len()];
            dequantize(ty, &packed, &mut back).expect("dequantize");
            let error: f64 = values
                .iter()
                .zip(&back)
                .map(|(&a, &b)| (f64::from(b) - f64::from(a)).powi(2))
                .sum();
            let rmse = (error / values.len() as f64).sqrt();
            let reference_rmse = golden["rmse"].as_f64().expect("rmse");
            let ratio = rmse / reference_rmse;
            worst = worst.max(ratio);
            if ratio > 1.01 {
                failures.push(format!("{file} {name}: rmse ratio {ratio:.4}"));
            }
            squared_error += error;
            squared_reference += reference_rmse.powi(2) * values.len() as f64;
            count += values.len();
            let tensor = shipped.tensor(name).expect("tensor in shipped file");
            if shipped.read(tensor) == packed {
                identical += 1;
            } else {
                failures.push(format!("{file} {name}: bytes differ from llama-quantize"));
            }
        }
        let overall = (squared_error / squared_reference).sqrt();
        println!(
            "{ty}: {} tensors, rmse ratio overall {overall:.5}, worst {worst:.5}, \
             {identical} byte-identical to llama-quantize ({count} values)",
            tensors.len()
        );
        assert_eq!(tensors.len(), 15, "{file}");
    }
    assert!(failures.is_empty(), "{failures:#?}");
}
