//! Perplexity against llama.cpp's figures (tests/golden/perplexity): `-c 128` over the
//! GPL-3 text, for every model file of a supported architecture found here; each must be
//! within 0.3% of the golden value.

mod common;

use runit_backend::KvTypes;
use runit_engine::{perplexity, EngineConfig, PerplexityReport, Session};
use serde_json::Value;

const TOLERANCE: f64 = 0.003;

/// Perplexity of the model at `path` over `text` at `-c 128 -b 128` with a KV cache of
/// `types`.
fn measure(path: &std::path::Path, text: &[u8], types: KvTypes) -> PerplexityReport {
    let file = runit_gguf::GgufFile::open(path).expect("opens");
    let tokenizer = runit_tokenizer::Tokenizer::from_gguf(&file).expect("tokenizer");
    let tokens = tokenizer.encode_bytes(text, true, false);
    let bos = tokenizer.add_bos().then(|| tokenizer.bos_id()).flatten();
    let model = common::load(path, 2);
    let config = EngineConfig {
        context_size: 128,
        batch_size: 128,
        kv_types: types,
        ..Default::default()
    };
    let mut session = Session::new(model, &config).expect("session");
    perplexity(&mut session, &tokens, 128, bos, |_, _| {}).expect("perplexity")
}

/// Checks every selected model's perplexity; with `four_decimals` it must also print as
/// llama.cpp's does (`%.4f`), beyond the 0.3% tolerance.
fn run(select: impl Fn(&str) -> bool, four_decimals: bool) {
    let dir = common::golden_dir().join("perplexity");
    let golden: Value = serde_json::from_slice(
        &std::fs::read(dir.join("perplexity_GPL-3_c128.json")).expect("perplexity golden"),
    )
    .expect("JSON");
    let text = std::fs::read(dir.join("ppl_text_GPL-3.txt")).expect("GPL-3 text");
    let mut checked = 0;
    let mut failures = Vec::new();
    for entry in golden["results"].as_array().expect("results") {
        let name = entry["model_file"].as_str().expect("model_file");
        if !select(name) {
            continue;
        }
        let Some(path) = common::find_model(name) else {
            println!("skip {name}: not found");
            continue;
        };
        if !common::is_supported_arch(&path) {
            println!("skip {name}: architecture not in this engine's set");
            continue;
        }
        let report = measure(&path, &text, KvTypes::default());
        let want = entry["final_ppl"].as_f64().expect("final_ppl");
        let relative = (report.perplexity - want).abs() / want;
        println!(
            "{name:<50} chunks {:>3} (golden {:>3})  ppl {:>16.4}  llama.cpp {:>16.4}  diff {:+.4}%",
            report.chunks,
            entry["n_chunks"],
            report.perplexity,
            want,
            100.0 * (report.perplexity - want) / want
        );
        let printed_differs =
            four_decimals && format!("{:.4}", report.perplexity) != format!("{want:.4}");
        if relative > TOLERANCE
            || printed_differs
            || Some(report.chunks as u64) != entry["n_chunks"].as_u64()
        {
            failures.push(format!("{name}: {} vs {want}", report.perplexity));
        }
        checked += 1;
    }
    println!("checked {checked} models, {} outside 0.3%", failures.len());
    assert!(checked > 0, "no model file found");
    assert!(failures.is_empty(), "{failures:#?}");
}

#[test]
fn synthetic_models_perplexity_matches_llama_cpp() {
    run(|name| name.starts_with("synth-"), false);
}

#[test]
fn real_models_perplexity_matches_llama_cpp() {
    run(
        |name| !name.starts_with("synth-") && !name.starts_with("gemma-3"),
        false,
    );
}

/// Gemma 3 270M, to llama.cpp's four decimals.
#[test]
fn gemma3_perplexity_matches_llama_cpp() {
    run(|name| name.starts_with("gemma-3"), true);
}

/// Quantized KV caches (`kv_cache_GPL-3_c128.json`: llama.cpp with `-ctk`/`-ctv` and flash
/// attention): every chunk's running perplexity, to llama.cpp's four decimals.
#[test]
fn quantized_kv_cache_perplexity_matches_llama_cpp() {
    let dir = common::golden_dir().join("perplexity");
    let golden: Value = serde_json::from_slice(
        &std::fs::read(dir.join("kv_cache_GPL-3_c128.json")).expect("KV cache golden"),
    )
    .expect("JSON");
    let text =
        std::fs::read(dir.join(golden["meta"]["text_file"].as_str().expect("text"))).expect("text");
    let mut failures = Vec::new();
    let mut checked = 0;
    for entry in golden["results"].as_array().expect("results") {
        let name = entry["model_file"].as_str().expect("model_file");
        let Some(path) = common::find_model(name) else {
            println!("skip {name}: not found");
            continue;
        };
        let types = KvTypes {
            keys: entry["cache_type_k"]
                .as_str()
                .expect("k")
                .parse()
                .expect("known type"),
            values: entry["cache_type_v"]
                .as_str()
                .expect("v")
                .parse()
                .expect("known type"),
        };
        let report = measure(&path, &text, types);
        let want = entry["final_ppl"].as_f64().expect("final_ppl");
        let chunks: Vec<f64> = entry["running_ppl_per_chunk"]
            .as_array()
            .expect("per chunk")
            .iter()
            .map(|v| v.as_f64().expect("number"))
            .collect();
        let printed = |values: &[f64]| values.iter().map(|v| format!("{v:.4}")).collect::<Vec<_>>();
        let first_difference = printed(&report.running)
            .iter()
            .zip(printed(&chunks))
            .position(|(a, b)| *a != b);
        println!(
            "{name} {types}: ppl {:.4}  llama.cpp {want:.4}  chunks {} (golden {}), first differing chunk {first_difference:?}",
            report.perplexity,
            report.chunks,
            chunks.len()
        );
        if format!("{:.4}", report.perplexity) != format!("{want:.4}")
            || report.running.len() != chunks.len()
            || first_difference.is_some()
        {
            failures.push(format!("{types}: {} vs {want}", report.perplexity));
        }
        checked += 1;
    }
    assert!(checked > 0, "no model file found");
    assert!(failures.is_empty(), "{failures:#?}");
}
