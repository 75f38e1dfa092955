//! Speculation inside continuous batching: sequences that draft by prompt lookup (one
//! seeded with a predicted output) decode in the same passes as one that does not, and each
//! gets the greedy tokens of its lone plain run; the counts of kept and rejected drafts come
//! with the end of the sequence, and every KV block returns to the pool. The same with a
//! draft model, each drafting sequence in a draft session of its own from the pool.

mod common;

use std::sync::mpsc::{channel, Receiver};
use std::sync::Arc;
use std::time::Duration;

use runit_engine::scheduler::{DraftRequest, Request, Scheduler, SequenceEvent};
use runit_engine::speculative::{DraftModelPool, DraftParams, SpeculationStats};
use runit_engine::{generate, EngineConfig, GenerateParams, Sampler, Session};
use runit_model::Model;

const CONTEXT: usize = 256;
const TOKENS: usize = 40;

fn config() -> EngineConfig {
    EngineConfig {
        context_size: CONTEXT,
        batch_size: 32,
        ..Default::default()
    }
}

fn alone(model: &Arc<Model>, prompt: &[u32]) -> Vec<u32> {
    let mut session = Session::new(Arc::clone(model), &config()).expect("session");
    let mut sampler = Sampler::new(Request::greedy(Vec::new(), 1).sampling).expect("sampler");
    let params = GenerateParams {
        max_tokens: TOKENS,
        end_of_generation: Vec::new(),
        top_logprobs: 0,
    };
    generate(&mut session, &mut sampler, prompt, &params, |_| true)
        .expect("generate")
        .tokens
}

fn collect(receiver: &Receiver<SequenceEvent>) -> (Vec<u32>, Option<SpeculationStats>) {
    let mut tokens = Vec::new();
    loop {
        match receiver
            .recv_timeout(Duration::from_secs(120))
            .expect("event")
        {
            SequenceEvent::Token(token) => tokens.push(token.id),
            SequenceEvent::Finished { speculation, .. } => return (tokens, speculation),
            SequenceEvent::Failed(message) => panic!("sequence failed: {message}"),
        }
    }
}

/// A prompt that repeats itself, so that prompt lookup finds continuations.
fn prompt(seed: u32, vocab: u32) -> Vec<u32> {
    let phrase: Vec<u32> = (0..9)
        .map(|i| (seed * 131 + i * 17) % (vocab - 1) + 1)
        .collect();
    phrase
        .iter()
        .chain(&phrase)
        .chain(&phrase[..4])
        .copied()
        .collect()
}

fn check(name: &str, sequences: usize, draft_model: Option<&str>) {
    let Some(path) = common::find_model(name) else {
        println!("skip: {name} not found");
        return;
    };
    let model = common::load(&path, 2);
    let vocab = model.config.vocab_size as u32;
    let pool = match draft_model {
        Some(draft_name) => {
            let Some(draft_path) = common::find_model(draft_name) else {
                println!("skip: {draft_name} not found");
                return;
            };
            let draft = common::load(&draft_path, 2);
            let pool = DraftModelPool::new(draft, config(), 0.0, vocab as usize).expect("pool");
            Some(pool)
        }
        None => None,
    };
    let scheduler = Scheduler::start(Arc::clone(&model), &config()).expect("scheduler");
    let total_blocks = scheduler.stats().total_blocks;
    let prompts: Vec<Vec<u32>> = (0..sequences as u32)
        .map(|s| prompt(s + 1, vocab))
        .collect();
    let expected: Vec<Vec<u32>> = prompts.iter().map(|p| alone(&model, p)).collect();
    let mut receivers = Vec::new();
    let mut submissions = Vec::new();
    for (s, prompt) in prompts.iter().enumerate() {
        // Sequence 0 predicts its own output with a wrong token in the middle (drafts follow
        // the prediction until the output leaves it), the last one does not speculate, the
        // others look up their prompts and outputs. Draft lengths adapt to measured times,
        // so the counts vary from run to run; the tokens may not.
        let mut prediction = Vec::new();
        if s == 0 && pool.is_none() {
            prediction = expected[0].clone();
            prediction[TOKENS / 2] = (prediction[TOKENS / 2] + 1) % vocab;
        }
        let draft = (s + 1 < sequences || sequences == 1).then_some(DraftRequest {
            ngram: 2,
            params: DraftParams {
                max: 6,
                ..DraftParams::DEFAULT
            },
            prediction,
            model: pool.clone(),
        });
        let (sender, receiver) = channel();
        let request = Request {
            draft,
            ..Request::greedy(prompt.clone(), TOKENS)
        };
        submissions.push((request, Box::new(sender) as Box<_>));
        receivers.push(receiver);
    }
    scheduler.submit_all(submissions).expect("submitted");
    for (s, receiver) in receivers.iter().enumerate() {
        let (tokens, stats) = collect(receiver);
        assert_eq!(tokens, expected[s], "{name} sequence {s}");
        let speculates = s + 1 < sequences || sequences == 1;
        assert_eq!(stats.is_some(), speculates, "{name} sequence {s}");
        println!("{name} sequence {s}: {stats:?}");
        if s == 0 && pool.is_none() {
            let stats = stats.expect("sequence 0 speculates");
            // How often it drafts follows measured times (a loaded machine may find that
            // drafting does not pay after a few steps); what it drafts follows the
            // prediction, so all but the drafts past its one wrong token and past its end
            // (a draft of at most 6 each) are kept.
            assert!(stats.accepted >= 1, "the prediction's drafts are kept");
            assert!(stats.accepted <= stats.drafted);
            assert!(
                stats.drafted - stats.accepted <= 12,
                "only drafts past the prediction's wrong token or its end are rejected: {stats:?}"
            );
        }
    }
    let stats = (0..100)
        .map(|_| {
            std::thread::sleep(Duration::from_millis(10));
            scheduler.stats()
        })
        .find(|stats| stats.active == 0)
        .expect("every sequence ends");
    assert_eq!(stats.free_blocks, total_blocks, "every block returns");
    if let Some(pool) = pool {
        // Every drafting sequence had its own session at once; all came back.
        let drafting = if sequences == 1 { 1 } else { sequences - 1 };
        assert_eq!(
            pool.idle(),
            drafting,
            "every draft session returns to the pool"
        );
    }
}

/// A Q8_0 model, whose matmul gives each row the same bits in any batch: three sequences
/// share passes.
#[test]
fn speculating_sequences_batched_with_others_keep_their_greedy_tokens() {
    check("synth-qwen2-Q8_0.gguf", 3, None);
}

/// A draft model (the Q4_0 requantization of the same weights) for two of three sequences
/// batched together: each drafts in its own session, and each keeps its greedy tokens.
#[test]
fn sequences_drafting_with_a_draft_model_keep_their_greedy_tokens() {
    check("synth-qwen2-Q8_0.gguf", 3, Some("synth-qwen2-Q4_0.gguf"));
}

/// An F32 model, whose batched matmul (tinyBLAS) differs from a lone row's: one sequence,
/// whose verification passes take the rows-alone order.
#[test]
fn verification_passes_in_the_scheduler_give_lone_row_numbers() {
    check("synth-qwen2-F32.gguf", 1, None);
}
