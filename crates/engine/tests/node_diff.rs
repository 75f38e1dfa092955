//! A diagnostic, not a check that runs by default: the CPU backend and the backend of
//! `RUNIT_TEST_DEVICE` evaluate one golden prompt and its generated tokens (the prompt in
//! one batch, then one token a step, as the fidelity test does), with the engine's
//! `LayerObserver` on both, and the first node whose values differ is reported with its
//! step, largest difference and first differing index.
//!
//! `RUNIT_NODE_DIFF=SmolLM2-135M-Instruct.requant-Q4_0.json:3` picks the golden file (in
//! `generation/`) and its prompt; `RUNIT_NODE_DIFF_STEPS` bounds the decode steps (all by
//! default); `RUNIT_NODE_DIFF_SAVE=path` writes every node's values of every step up to the
//! difference there (a line per node: backend, step, name, the values' f32 bits in hex).
//! Without `RUNIT_NODE_DIFF` the test returns at once.

mod common;

use std::sync::Arc;

use runit_engine::{EngineConfig, Session};
use runit_model::{LayerObserver, Model};
use serde_json::Value;

#[derive(Default)]
struct Capture(Vec<(String, Vec<f32>)>);

impl LayerObserver for Capture {
    fn observe(&mut self, name: &str, _rows: usize, _width: usize, data: &[f32]) {
        self.0.push((name.to_string(), data.to_vec()));
    }
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .expect("id array")
        .iter()
        .map(|x| x.as_u64().expect("id") as u32)
        .collect()
}

/// The first node of `b` that differs from `a`'s: name, largest |difference|, the index of
/// the first difference and both values there.
fn first_difference(a: &Capture, b: &Capture) -> Option<(String, f32, usize, f32, f32)> {
    for ((name, x), (other, y)) in a.0.iter().zip(&b.0) {
        assert_eq!(name, other, "both backends observe the same nodes");
        let differs: Vec<usize> = (0..x.len().min(y.len()))
            .filter(|&i| x[i].to_bits() != y[i].to_bits())
            .collect();
        if let Some(&i) = differs.first() {
            let largest = differs
                .iter()
                .map(|&j| (x[j] - y[j]).abs())
                .fold(0.0f32, f32::max);
            return Some((name.clone(), largest, i, x[i], y[i]));
        }
    }
    None
}

#[test]
fn first_node_that_differs_from_the_cpu() {
    let Ok(spec) = std::env::var("RUNIT_NODE_DIFF") else {
        return;
    };
    let (file, prompt_index) = spec.split_once(':').unwrap_or((&spec, "0"));
    let prompt_index: usize = prompt_index.parse().expect("a prompt index");
    let golden: Value = serde_json::from_slice(
        &std::fs::read(common::golden_dir().join("generation").join(file)).expect("golden"),
    )
    .expect("golden JSON");
    let model_file = golden["meta"]["model_file"].as_str().expect("model_file");
    let path = common::find_model(model_file).expect("the golden's model file");
    let result = &golden["results"][prompt_index];
    let prompt = ids(&result["prompt_ids"]);
    let generated = ids(&result["generated_ids"]);
    let steps: usize = std::env::var("RUNIT_NODE_DIFF_STEPS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(generated.len());
    let config = EngineConfig {
        context_size: 2048,
        batch_size: 512,
        ..Default::default()
    };
    let cpu = Model::load(
        Arc::new(runit_gguf::GgufFile::open(&path).expect("model opens")),
        Arc::new(runit_backend_cpu::CpuBackend::new(2).expect("cpu backend")),
    )
    .expect("model loads");
    let mut reference = Session::new(Arc::new(cpu), &config).expect("session");
    let mut tested = Session::new(common::load(&path, 2), &config).expect("session");
    // Every step's captures (the CPU's), for `RUNIT_NODE_DIFF_SAVE`.
    let mut history: Vec<Capture> = Vec::new();
    for step in 0..=steps.min(generated.len() - 1) {
        let tokens = match step {
            0 => &prompt[..],
            _ => &generated[step - 1..step],
        };
        let (mut a, mut b) = (Capture::default(), Capture::default());
        reference
            .eval(tokens, false, Some(&mut a))
            .expect("cpu eval");
        tested.eval(tokens, false, Some(&mut b)).expect("eval");
        match first_difference(&a, &b) {
            Some((name, largest, i, x, y)) => {
                println!(
                    "step {step}: first differing node {name} (largest |diff| {largest:e}; \
                     index {i}: cpu {x:e} ({:#010x}), tested {y:e} ({:#010x}))",
                    x.to_bits(),
                    y.to_bits()
                );
                if let Ok(save) = std::env::var("RUNIT_NODE_DIFF_SAVE") {
                    history.push(a);
                    save_nodes(&history, &b, &save);
                }
                return;
            }
            None => println!("step {step}: every node equal"),
        }
        history.push(a);
    }
}

/// Writes `path`: a line per node of every step's CPU captures (`cpu STEP NAME` and the
/// values' bits in hex) and of the tested backend's at the last step (`tested`).
fn save_nodes(history: &[Capture], tested: &Capture, path: &str) {
    use std::fmt::Write as _;
    let mut text = String::new();
    let mut line = |tag: &str, step: usize, name: &str, data: &[f32]| {
        let _ = write!(text, "{tag} {step} {name}");
        for x in data {
            let _ = write!(text, " {:08x}", x.to_bits());
        }
        text.push('\n');
    };
    for (step, capture) in history.iter().enumerate() {
        for (name, data) in &capture.0 {
            line("cpu", step, name, data);
        }
    }
    for (name, data) in &tested.0 {
        line("tested", history.len() - 1, name, data);
    }
    std::fs::write(path, text).expect("writing the saved nodes");
}
