//! Speculative decoding keeps greedy output exact: for every golden model file found here
//! and every golden prompt, greedy generation with speculation gives the tokens (and
//! log-probabilities, bit for bit) of plain greedy generation, and leaves the cache as long.
//! The drafters: prompt lookup, and an oracle that knows the plain output but corrupts one
//! token of each draft (long runs of kept drafts, then a rejection at every depth).
//! A draft model (another quantization of SmolLM2) is checked the same way when found.

mod common;

use std::sync::Arc;

use runit_engine::speculative::{DraftModel, DraftParams, Drafter, PromptLookup, Speculation};
use runit_engine::{
    generate_with, EngineConfig, EngineError, GenerateParams, Sampler, SamplerParams, Session,
};
use runit_model::Model;
use serde_json::Value;

/// Tokens generated per prompt.
const TOKENS: usize = 24;

/// Proposes the plain run's continuation with one token changed per draft (at a place
/// that moves with the history's length), so drafts are kept up to that place.
struct CorruptedOracle {
    reference: Vec<u32>,
    vocab: u32,
}

impl Drafter for CorruptedOracle {
    fn draft(&mut self, history: &[u32], max: usize) -> Result<Vec<u32>, EngineError> {
        let at = history.len();
        let mut draft: Vec<u32> = self.reference.iter().skip(at).take(max).copied().collect();
        let wrong = (at * 7 + 3) % (max + 1);
        if let Some(token) = draft.get_mut(wrong) {
            *token = (*token + 1) % self.vocab;
        }
        Ok(draft)
    }
}

fn config() -> EngineConfig {
    EngineConfig {
        context_size: 512,
        batch_size: 64,
        ..Default::default()
    }
}

struct Run {
    tokens: Vec<u32>,
    logprobs: Vec<u64>,
    n_past: usize,
    accepted: usize,
}

fn run(
    model: &Arc<Model>,
    prompt: &[u32],
    top_logprobs: usize,
    speculation: Option<&mut Speculation>,
) -> Run {
    let mut session = Session::new(Arc::clone(model), &config()).expect("session");
    let mut sampler = Sampler::new(SamplerParams::greedy()).expect("sampler");
    let params = GenerateParams {
        max_tokens: TOKENS,
        end_of_generation: Vec::new(),
        top_logprobs,
    };
    let mut logprobs = Vec::new();
    let output = generate_with(
        &mut session,
        &mut sampler,
        prompt,
        &params,
        speculation,
        |token| {
            logprobs.push(token.logprob.to_bits());
            true
        },
    )
    .expect("generate");
    Run {
        tokens: output.tokens,
        logprobs,
        n_past: session.n_past(),
        accepted: output.speculation.map_or(0, |stats| stats.accepted),
    }
}

fn golden_files() -> Vec<(String, Vec<Vec<u32>>, std::path::PathBuf)> {
    let dir = common::golden_dir().join("generation");
    let mut paths: Vec<_> = std::fs::read_dir(&dir)
        .expect("golden generation dir")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    paths.sort();
    let mut files = Vec::new();
    for path in paths {
        let golden: Value =
            serde_json::from_slice(&std::fs::read(&path).expect("read golden")).expect("JSON");
        let model_file = golden["meta"]["model_file"].as_str().expect("model_file");
        let Some(model_path) = common::find_model(model_file) else {
            println!("skip {}: {model_file} not found", path.display());
            continue;
        };
        if !common::is_supported_arch(&model_path) {
            continue;
        }
        let prompts = golden["results"]
            .as_array()
            .expect("results")
            .iter()
            .map(|result| {
                result["prompt_ids"]
                    .as_array()
                    .expect("prompt ids")
                    .iter()
                    .map(|id| id.as_u64().expect("id") as u32)
                    .collect()
            })
            .collect();
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned());
        files.push((name.unwrap_or_default(), prompts, model_path));
    }
    files
}

fn check(select: impl Fn(&str) -> bool) {
    let mut checked = 0;
    let mut failures = Vec::new();
    for (name, prompts, path) in golden_files() {
        if !select(&name) {
            continue;
        }
        let model = common::load(&path, 2);
        let vocab = model.config.vocab_size as u32;
        let mut accepted = 0;
        for (p, prompt) in prompts.iter().enumerate() {
            let plain = run(&model, prompt, 0, None);
            let oracle = || CorruptedOracle {
                reference: prompt.iter().chain(&plain.tokens).copied().collect(),
                vocab,
            };
            let params = DraftParams {
                max: 6,
                ..DraftParams::DEFAULT
            };
            let drafters: [(&str, Box<dyn Drafter>, usize); 3] = [
                ("oracle", Box::new(oracle()), 0),
                ("oracle, sampled path", Box::new(oracle()), 2),
                ("lookup", Box::new(PromptLookup::new(1).expect("n")), 0),
            ];
            for (drafter_name, drafter, top) in drafters {
                let mut speculation = Speculation::new(drafter, params).expect("speculation");
                let spec = run(&model, prompt, top, Some(&mut speculation));
                accepted += spec.accepted;
                let expected = match top {
                    0 => plain.logprobs.clone(),
                    _ => run(&model, prompt, top, None).logprobs,
                };
                if spec.tokens != plain.tokens || spec.logprobs != expected {
                    failures.push(format!(
                        "{name} prompt {p} {drafter_name}: {:?} vs plain {:?}",
                        spec.tokens, plain.tokens
                    ));
                }
                if spec.n_past != plain.n_past {
                    failures.push(format!(
                        "{name} prompt {p} {drafter_name}: cache holds {} vs plain {}",
                        spec.n_past, plain.n_past
                    ));
                }
            }
        }
        println!(
            "{name}: {} prompts equal, {accepted} drafts kept",
            prompts.len()
        );
        assert!(accepted > 0, "{name}: the oracle's drafts are never kept");
        checked += 1;
    }
    assert!(checked > 0, "no golden model file was found");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn greedy_speculation_equals_plain_greedy_on_synthetic_models() {
    check(|name| name.starts_with("synth-"));
}

#[test]
fn greedy_speculation_equals_plain_greedy_on_real_models() {
    check(|name| !name.starts_with("synth-"));
}

/// SmolLM2's Q8_0 requantization drafted by its Q4_0 one: the draft model path (its own
/// cache rolled back and caught up each step) changes nothing in the greedy tokens.
#[test]
fn a_draft_model_keeps_greedy_output_exact() {
    let (Some(target), Some(draft)) = (
        common::find_model("SmolLM2-135M-Instruct.requant-Q8_0.gguf"),
        common::find_model("SmolLM2-135M-Instruct.requant-Q4_0.gguf"),
    ) else {
        println!("skip: SmolLM2 requantizations not found");
        return;
    };
    let target = common::load(&target, 2);
    let draft = common::load(&draft, 2);
    let (_, prompts, _) = golden_files()
        .into_iter()
        .find(|(name, _, _)| name == "SmolLM2-135M-Instruct.requant-Q8_0.json")
        .expect("the Q8_0 golden prompts");
    let mut accepted = 0;
    for prompt in &prompts {
        let plain = run(&target, prompt, 0, None);
        let drafter = DraftModel::new(Arc::clone(&draft), &config(), 0.0, target.config.vocab_size)
            .expect("draft model");
        let mut speculation =
            Speculation::new(Box::new(drafter), DraftParams::DEFAULT).expect("speculation");
        let spec = run(&target, prompt, 0, Some(&mut speculation));
        assert_eq!(spec.tokens, plain.tokens);
        assert_eq!(spec.n_past, plain.n_past);
        accepted += spec.accepted;
    }
    assert!(accepted > 0, "a draft of the same weights is never kept");
}
