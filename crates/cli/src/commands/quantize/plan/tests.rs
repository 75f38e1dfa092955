//! The plan against llama-quantize's real choices: every tensor type of the golden files in
//! tests/golden/MODELS.json, rebuilt from the file they were quantized from.

use std::path::{Path, PathBuf};

use runit_gguf::GgufFile;
use serde_json::Value as Json;

use super::*;

fn golden_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/golden")
}

/// A model file from the workspace's `models/` folder (fetched or rebuilt by the test script).
fn find_model(name: &str) -> Option<PathBuf> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../models")
        .join(name);
    path.exists().then_some(path)
}

fn inventory() -> Vec<Json> {
    let path = golden_dir().join("MODELS.json");
    let text = std::fs::read_to_string(&path).expect("golden MODELS.json is readable");
    match serde_json::from_str(&text).expect("MODELS.json is JSON") {
        Json::Array(entries) => entries,
        other => panic!("MODELS.json: expected an array, found {other}"),
    }
}

/// The plan for `source` as (name, type) pairs, in loader order.
fn plan_for(source: &GgufFile, preset: Preset, pure: bool) -> Vec<(String, GgmlType)> {
    let mut infos: Vec<_> = source.tensors().iter().collect();
    infos.sort_by(|a, b| loader_order(&a.name, &b.name));
    let descriptions: Vec<TensorDescription<'_>> = infos
        .iter()
        .map(|info| TensorDescription {
            name: &info.name,
            shape: &info.shape,
            ty: info.ty,
        })
        .collect();
    let facts = ModelFacts::from_gguf(source).expect("model facts");
    let types = plan_types(&descriptions, &facts, preset, pure).expect("plan");
    infos
        .iter()
        .zip(types)
        .map(|(info, ty)| (info.name.clone(), ty))
        .collect()
}

/// Compares a plan with an entry's `tensor_types`; returns (matching, total).
fn compare(entry: &Json, plan: &[(String, GgmlType)]) -> (usize, usize) {
    let file = entry["file"].as_str().expect("file name");
    let expected = entry["tensor_types"]
        .as_object()
        .expect("tensor_types is an object");
    assert_eq!(expected.len(), plan.len(), "{file}: tensor count");
    let mut matching = 0;
    for (name, ty) in plan {
        let want = expected.get(name).and_then(Json::as_str);
        if want == Some(ty.name()) {
            matching += 1;
        } else {
            eprintln!("{file}: {name}: planned {ty}, golden {want:?}");
        }
    }
    (matching, plan.len())
}

#[test]
fn smollm2_requant_plans_match_llama_quantize() {
    let Some(source_path) = find_model("SmolLM2-135M-Instruct.Q4_1.gguf") else {
        eprintln!(
            "skipping: SmolLM2-135M-Instruct.Q4_1.gguf not fetched (scripts/fetch_models.py)"
        );
        return;
    };
    let source = GgufFile::open(&source_path).expect("open SmolLM2");
    let mut checked = 0;
    for entry in inventory() {
        let file = entry["file"].as_str().expect("file name");
        let Some(type_name) = file
            .strip_prefix("SmolLM2-135M-Instruct.requant-")
            .and_then(|rest| rest.strip_suffix(".gguf"))
        else {
            continue;
        };
        let preset: Preset = type_name.parse().expect("golden preset name");
        assert_eq!(
            entry["general.file_type"].as_u64(),
            Some(u64::from(preset.file_type())),
            "{file}: general.file_type"
        );
        let (matching, total) = compare(&entry, &plan_for(&source, preset, false));
        eprintln!("{file}: {matching}/{total} tensor types match");
        assert_eq!(matching, total, "{file}: tensor types");
        checked += 1;
    }
    assert_eq!(checked, 8, "requant entries in MODELS.json");
}

#[test]
fn synthetic_pure_plans_match_llama_quantize() {
    let mut checked = 0;
    for entry in inventory() {
        let file = entry["file"].as_str().expect("file name");
        let Some(rest) = file.strip_prefix("synth-") else {
            continue;
        };
        let (arch, type_name) = rest
            .strip_suffix(".gguf")
            .and_then(|stem| stem.split_once('-'))
            .expect("synth-ARCH-TYPE.gguf");
        if type_name == "F32" {
            continue;
        }
        let source_name = format!("synth-{arch}-F32.gguf");
        let Some(source_path) = find_model(&source_name) else {
            eprintln!("skipping {file}: {source_name} not present");
            continue;
        };
        let source = GgufFile::open(&source_path).expect("open synthetic model");
        let preset: Preset = type_name.parse().expect("golden preset name");
        assert_eq!(
            entry["general.file_type"].as_u64(),
            Some(u64::from(preset.file_type())),
            "{file}: general.file_type"
        );
        let (matching, total) = compare(&entry, &plan_for(&source, preset, true));
        assert_eq!(matching, total, "{file}: tensor types");
        checked += 1;
    }
    assert!(checked >= 14, "only {checked} synthetic files checked");
}

#[test]
fn loader_order_puts_global_tensors_first_then_layers_numerically() {
    let mut names = vec![
        "blk.10.attn_q.weight",
        "blk.2.ffn_up.weight",
        "token_embd.weight",
        "blk.2.attn_k.weight",
        "output_norm.weight",
    ];
    names.sort_by(|a, b| loader_order(a, b));
    assert_eq!(
        names,
        [
            "output_norm.weight",
            "token_embd.weight",
            "blk.2.attn_k.weight",
            "blk.2.ffn_up.weight",
            "blk.10.attn_q.weight",
        ]
    );
}

#[test]
fn fallbacks_follow_llama_cpp() {
    let shape = [576u64, 64];
    let tensor = TensorDescription {
        name: "blk.0.attn_q.weight",
        shape: &shape,
        ty: GgmlType::F32,
    };
    for (wanted, got) in [
        (GgmlType::Q4_K, GgmlType::Q5_0),
        (GgmlType::Q5_K, GgmlType::Q5_1),
        (GgmlType::Q6_K, GgmlType::Q8_0),
        (GgmlType::Q2_K, GgmlType::Q4_0),
        (GgmlType::IQ4_XS, GgmlType::IQ4_NL),
        (GgmlType::Q8_0, GgmlType::Q8_0),
    ] {
        assert_eq!(fallback_type(&tensor, wanted), Ok(got), "{wanted}");
    }
    let odd_shape = [100u64, 4];
    let odd = TensorDescription {
        shape: &odd_shape,
        ..tensor
    };
    assert_eq!(fallback_type(&odd, GgmlType::Q4_K), Ok(GgmlType::F16));
    assert!(fallback_type(&odd, GgmlType::Q4_0).is_err());
}

/// The roles the schema gives its tensors are the ones llama.cpp's name rules give.
#[test]
fn schema_roles_agree_with_llama_cpp_names() {
    for spec in runit_model::schema::TENSORS {
        let name = spec.name_in(Some(3));
        assert!(runit_model::schema::find(&name).is_some(), "{name}");
        assert_eq!(
            mixture::Role::of(&name),
            mixture::Role::by_name(&name),
            "{name}"
        );
    }
    assert_eq!(
        mixture::Role::of("blk.3.attn_qkv.weight"),
        mixture::Role::AttentionValue
    );
}
