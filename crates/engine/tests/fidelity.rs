//! Greedy generation against llama.cpp's goldens (tests/golden/generation): for every
//! model file of a supported architecture that can be found here, every prompt's generated ids
//! must equal llama.cpp's, except that a divergence is allowed at a step whose golden top-2
//! log-probability gap is below 0.01 (comparison of that prompt stops there); at every matched
//! step the top-1 log-probability must be within 0.02 of llama.cpp's.
//!
//! The prompt is evaluated in the batches llama-server used: one, except for a model with
//! sliding-window layers, whose last [`SERVER_CHECKPOINT_TAIL`] prompt tokens llama-server
//! evaluates in a batch of their own (it checkpoints the window's cache before them). Batch
//! shapes change ggml's arithmetic (which rows take the 4-row repacked kernels), so the same
//! split is needed for the same numbers.

mod common;

use runit_engine::sampler::{argmax, log_softmax};
use runit_engine::{EngineConfig, Session};
use serde_json::Value;

const NEAR_TIE: f64 = 0.01;
/// Prompt tokens llama-server evaluates on their own at the end of a prompt for a model with
/// sliding-window layers (found by evaluating the Gemma 3 goldens' prompts at every split:
/// only this one reproduces every first step's log-probabilities).
const SERVER_CHECKPOINT_TAIL: usize = 4;
const LOGPROB_TOLERANCE: f64 = 0.02;

#[derive(Default, Debug)]
struct Counts {
    prompts: usize,
    full_matches: usize,
    near_tie_stops: usize,
    mismatches: usize,
    steps: usize,
    max_logprob_error: f64,
}

fn check_file(
    golden: &Value,
    path: &std::path::Path,
    counts: &mut Counts,
    failures: &mut Vec<String>,
) {
    let model = common::load(path, 2);
    let windowed = model
        .config
        .layers()
        .iter()
        .any(|layer| layer.sliding_window.is_some());
    let mut session = Session::new(
        model,
        &EngineConfig {
            context_size: 2048,
            batch_size: 512,
            ..Default::default()
        },
    )
    .expect("session");
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    for (p, result) in golden["results"]
        .as_array()
        .expect("results")
        .iter()
        .enumerate()
    {
        counts.prompts += 1;
        let prompt: Vec<u32> = ids(&result["prompt_ids"]);
        let expected: Vec<u32> = ids(&result["generated_ids"]);
        let steps = result["steps"].as_array().expect("steps");
        session.reset();
        let last_batch = match windowed {
            true => SERVER_CHECKPOINT_TAIL.min(prompt.len()),
            false => prompt.len(),
        };
        let (head, last) = prompt.split_at(prompt.len() - last_batch);
        if !head.is_empty() {
            session.eval(head, false, None).expect("prompt eval");
        }
        let mut logits = session
            .eval(last, false, None)
            .expect("prompt eval")
            .to_vec();
        let mut outcome = "match";
        for (i, &want) in expected.iter().enumerate() {
            let got = argmax(&logits);
            let step = &steps[i];
            let golden_top = step["top"].as_array();
            if got != want {
                let gap = golden_top.and_then(|top| {
                    Some(top.first()?.get(1)?.as_f64()? - top.get(1)?.get(1)?.as_f64()?)
                });
                match gap {
                    Some(g) if g < NEAR_TIE => outcome = "near-tie",
                    _ => {
                        outcome = "mismatch";
                        failures.push(format!(
                            "{name} prompt {p} step {i}: got {got}, llama.cpp {want} (golden top-2 gap {gap:?})"
                        ));
                    }
                }
                break;
            }
            counts.steps += 1;
            if let Some(golden_lp) = step["logprob"].as_f64() {
                let ours = log_softmax(&logits)[got as usize];
                let error = (ours - golden_lp).abs();
                counts.max_logprob_error = counts.max_logprob_error.max(error);
                if error > LOGPROB_TOLERANCE {
                    failures.push(format!(
                        "{name} prompt {p} step {i}: logprob {ours:.5} vs llama.cpp {golden_lp:.5}"
                    ));
                }
            }
            if i + 1 < expected.len() {
                logits = session.eval(&[want], false, None).expect("decode").to_vec();
            }
        }
        match outcome {
            "match" => counts.full_matches += 1,
            "near-tie" => counts.near_tie_stops += 1,
            _ => counts.mismatches += 1,
        }
    }
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .expect("id array")
        .iter()
        .map(|x| x.as_u64().expect("id") as u32)
        .collect()
}

fn run(select: impl Fn(&str, &str) -> bool) {
    let dir = common::golden_dir().join("generation");
    let mut entries: Vec<_> = std::fs::read_dir(&dir)
        .expect("golden generation dir")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    entries.sort();
    let mut total = Counts::default();
    let mut failures = Vec::new();
    let mut files = 0;
    for golden_path in entries {
        let golden: Value =
            serde_json::from_slice(&std::fs::read(&golden_path).expect("read golden"))
                .expect("golden JSON");
        let model_file = golden["meta"]["model_file"]
            .as_str()
            .expect("model_file")
            .to_string();
        let golden_name = golden_path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        // `RUNIT_FIDELITY_ONLY=requant-F16` checks only the golden files naming it;
        // `RUNIT_FIDELITY_ONLY=requant-F16,requant-BF16` those naming either.
        let only = std::env::var("RUNIT_FIDELITY_ONLY").ok();
        if !select(&model_file, &golden_name)
            || only.is_some_and(|parts| !parts.split(',').any(|part| golden_name.contains(part)))
        {
            continue;
        }
        let Some(path) = common::find_model(&model_file) else {
            println!("skip {}: {model_file} not found", golden_path.display());
            continue;
        };
        if !common::is_supported_arch(&path) {
            println!("skip {model_file}: architecture not in this engine's set");
            continue;
        }
        let mut counts = Counts::default();
        check_file(&golden, &path, &mut counts, &mut failures);
        println!(
            "{:<55} prompts {:>2}  full {:>2}  near-tie {:>2}  mismatch {:>2}  max |dlogprob| {:.4}",
            golden_path.file_name().unwrap_or_default().to_string_lossy(),
            counts.prompts,
            counts.full_matches,
            counts.near_tie_stops,
            counts.mismatches,
            counts.max_logprob_error
        );
        files += 1;
        total.prompts += counts.prompts;
        total.full_matches += counts.full_matches;
        total.near_tie_stops += counts.near_tie_stops;
        total.mismatches += counts.mismatches;
        total.steps += counts.steps;
        total.max_logprob_error = total.max_logprob_error.max(counts.max_logprob_error);
    }
    println!(
        "TOTAL files {files}: prompts {} fully matched {}, stopped at a near-tie {}, mismatches {} ({} steps compared, max |dlogprob| {:.4})",
        total.prompts, total.full_matches, total.near_tie_stops, total.mismatches, total.steps, total.max_logprob_error
    );
    assert!(files > 0, "no golden model file was found");
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn synthetic_models_match_llama_cpp() {
    run(|model, _| model.starts_with("synth-"));
}

#[test]
fn real_models_match_llama_cpp() {
    run(|model, _| !model.starts_with("synth-") && !model.starts_with("gemma-3"));
}

/// Gemma 3 270M, on its chat-shaped and its bare prompts.
#[test]
fn gemma3_matches_llama_cpp() {
    run(|model, _| model.starts_with("gemma-3"));
}
