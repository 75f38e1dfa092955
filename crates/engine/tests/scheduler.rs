//! Continuous batching: greedy outputs of sequences decoded together equal the same requests
//! run alone through `generate`, cancelled sequences stop, and every KV block returns.

mod common;

use std::sync::mpsc::{channel, Receiver};
use std::sync::Arc;
use std::time::Duration;

use runit_engine::scheduler::{EventSink, Request, Scheduler, SequenceEvent, SubmitError};
use runit_engine::{
    generate, EngineConfig, GenerateParams, Sampler, SamplerParams, Session, StopReason,
};
use runit_model::Model;

const CONTEXT: usize = 512;

fn model(name: &str) -> Option<Arc<Model>> {
    match common::find_model(name) {
        Some(path) => Some(common::load(&path, 2)),
        None => {
            eprintln!("skipping: {name} not found");
            None
        }
    }
}

/// Prompt lengths of the invariance tests: one longer than a chunk of 16 (chunking), the
/// first two short enough to share a prefill pass.
const LENGTHS: [usize; 4] = [3, 11, 40, 7];

/// Prompts of the given lengths.
fn prompts(vocab: usize, lengths: &[usize]) -> Vec<Vec<u32>> {
    lengths
        .iter()
        .enumerate()
        .map(|(p, &len)| {
            (0..len)
                .map(|i| ((i * 7919 + p * 104_729 + 13) % (vocab - 1)) as u32 + 1)
                .collect()
        })
        .collect()
}

fn alone(model: &Arc<Model>, request: &Request, batch_size: usize) -> Vec<u32> {
    let config = EngineConfig {
        context_size: CONTEXT,
        batch_size,
        ..Default::default()
    };
    let mut session = Session::new(Arc::clone(model), &config).expect("session");
    let mut sampler = Sampler::new(request.sampling.clone()).expect("sampler");
    let params = GenerateParams {
        max_tokens: request.max_tokens,
        end_of_generation: request.end_of_generation.clone(),
        top_logprobs: 0,
    };
    generate(&mut session, &mut sampler, &request.prompt, &params, |_| {
        true
    })
    .expect("generate")
    .tokens
}

fn collect(receiver: &Receiver<SequenceEvent>) -> (Vec<u32>, StopReason) {
    let mut tokens = Vec::new();
    loop {
        match receiver
            .recv_timeout(Duration::from_secs(120))
            .expect("event")
        {
            SequenceEvent::Token(token) => tokens.push(token.id),
            SequenceEvent::Finished {
                stop,
                generated_tokens,
                ..
            } => {
                assert_eq!(generated_tokens, tokens.len());
                return (tokens, stop);
            }
            SequenceEvent::Failed(message) => panic!("sequence failed: {message}"),
        }
    }
}

fn check_batch_invariance(name: &str, max_tokens: usize) {
    check_invariance_with(name, max_tokens, &LENGTHS, 16, 4);
}

/// Greedy requests with prompts of `lengths`, submitted together (the first two at once,
/// the others while those decode), each equal to its lone run with the same `batch_size`,
/// `max_sequences` of them decoding at once.
fn check_invariance_with(
    name: &str,
    max_tokens: usize,
    lengths: &[usize],
    batch_size: usize,
    max_sequences: usize,
) {
    let Some(model) = model(name) else { return };
    let requests: Vec<Request> = prompts(model.config.vocab_size, lengths)
        .into_iter()
        .map(|prompt| Request::greedy(prompt, max_tokens))
        .collect();
    let expected: Vec<Vec<u32>> = requests
        .iter()
        .map(|r| alone(&model, r, batch_size))
        .collect();
    let scheduler = Scheduler::start(
        Arc::clone(&model),
        &EngineConfig {
            // Room for every sequence at once (two blocks each).
            context_size: CONTEXT.max(32 * max_sequences),
            batch_size,
            max_sequences,
            ..Default::default()
        },
    )
    .expect("scheduler");
    let start_free = scheduler.stats().free_blocks;
    assert_eq!(start_free, scheduler.stats().total_blocks);
    // The first two start together; the others join while those decode.
    let mut receivers = Vec::new();
    for (i, request) in requests.iter().enumerate() {
        let (sender, receiver) = channel();
        scheduler
            .submit(request.clone(), Box::new(sender))
            .expect("submit");
        if i == 1 {
            std::thread::sleep(Duration::from_millis(30));
        }
        receivers.push(receiver);
    }
    for (i, receiver) in receivers.iter().enumerate() {
        let (tokens, stop) = collect(receiver);
        assert_eq!(stop, StopReason::Limit);
        assert_eq!(tokens.len(), max_tokens);
        assert_eq!(
            tokens, expected[i],
            "{name}: sequence {i} differs from its lone run"
        );
    }
    assert!(scheduler.wait_idle(Duration::from_secs(10)));
    assert_eq!(scheduler.stats().free_blocks, start_free);
}

#[test]
fn concurrent_greedy_equals_alone_synthetic() {
    check_batch_invariance("synth-qwen2-Q8_0.gguf", 24);
}

#[test]
fn concurrent_greedy_equals_alone_smollm2() {
    check_batch_invariance("SmolLM2-135M-Instruct.Q4_1.gguf", 12);
}

/// Sampled requests of every kind the device path takes (temperatures, top-k, top-p,
/// min-p, penalties, biases that add and ban, seeds) beside a greedy one with penalties:
/// decoded together, their steps draw through `Model::forward_sample` (the backend's
/// `sample_pick`), and each sequence equals its lone run through `generate`, which draws
/// with `Sampler::sample` from the downloaded logits. With a request asking for
/// log-probabilities among them, the steps take the host path; the tokens are the same.
#[test]
fn concurrent_sampling_equals_alone_synthetic() {
    let Some(model) = model("synth-qwen2-Q8_0.gguf") else {
        return;
    };
    let vocab = model.config.vocab_size;
    let sampled = |seed: u64, change: &dyn Fn(&mut SamplerParams)| {
        let mut sampling = SamplerParams {
            seed,
            ..SamplerParams::DEFAULT
        };
        change(&mut sampling);
        sampling
    };
    let settings = [
        sampled(1, &|_| {}),
        sampled(2, &|p| {
            p.temperature = 1.5;
            p.top_k = 0;
            p.top_p = 0.9;
            p.min_p = 0.0;
        }),
        sampled(3, &|p| {
            p.repeat_penalty = 1.3;
            p.frequency_penalty = 0.4;
            p.presence_penalty = 0.2;
            p.penalty_window = 16;
        }),
        sampled(4, &|p| {
            p.temperature = 0.0;
            p.repeat_penalty = 1.5;
            p.logit_bias = vec![(5, -100.0), (7, 3.5)];
        }),
        sampled(5, &|p| {
            p.top_k = 1024;
            p.min_p = 0.2;
            p.logit_bias = vec![(1, 2.0), (2, -100.0), (1, 0.5)];
        }),
        sampled(6, &|p| {
            p.temperature = 0.3;
            p.top_k = 3;
            p.top_p = 1.0;
        }),
    ];
    let lengths = [3, 11, 7, 5, 9, 4];
    let requests: Vec<Request> = prompts(vocab, &lengths)
        .into_iter()
        .zip(settings)
        .map(|(prompt, sampling)| Request {
            sampling,
            logprobs: false,
            ..Request::greedy(prompt, 16)
        })
        .collect();
    let expected: Vec<Vec<u32>> = requests.iter().map(|r| alone(&model, r, 16)).collect();
    for with_logprobs in [false, true] {
        let mut batch = requests.clone();
        if with_logprobs {
            batch[2].logprobs = true;
        }
        let scheduler = Scheduler::start(
            Arc::clone(&model),
            &EngineConfig {
                context_size: CONTEXT,
                batch_size: 16,
                max_sequences: batch.len(),
                ..Default::default()
            },
        )
        .expect("scheduler");
        let receivers: Vec<Receiver<SequenceEvent>> = batch
            .iter()
            .map(|request| {
                let (sender, receiver) = channel();
                scheduler
                    .submit(request.clone(), Box::new(sender))
                    .expect("submit");
                receiver
            })
            .collect();
        for (i, receiver) in receivers.iter().enumerate() {
            let (tokens, _) = collect(receiver);
            assert_eq!(
                tokens, expected[i],
                "sequence {i} (log-probabilities in the batch: {with_logprobs}) differs from its lone run"
            );
        }
        assert!(scheduler.wait_idle(Duration::from_secs(10)));
    }
    // The sampled runs draw more than one token each (a test of sampling, not of argmax).
    let distinct = |tokens: &[u32]| {
        let mut sorted = tokens.to_vec();
        sorted.sort_unstable();
        sorted.dedup();
        sorted.len()
    };
    assert!(
        expected
            .iter()
            .filter(|tokens| distinct(tokens) > 3)
            .count()
            >= 3
    );
}

/// A prefill pass holding a span of 64 rows or more (the tiled attention path) beside short
/// ones (the one-chunk path): every span still gets its lone numbers.
#[test]
fn prompts_sharing_a_pass_across_attention_paths_equal_alone() {
    check_invariance_with("synth-qwen2-Q8_0.gguf", 10, &[5, 90, 12, 70], 128, 4);
    check_invariance_with(
        "SmolLM2-135M-Instruct.Q4_1.gguf",
        8,
        &[5, 90, 12, 70],
        128,
        4,
    );
}

/// Seventy sequences decoding together: one decode pass of seventy one-row spans (more
/// rows than a span needs for the tiled attention path), each sequence its lone numbers.
#[test]
fn seventy_sequences_in_one_decode_pass_equal_alone() {
    let lengths: Vec<usize> = (0..70).map(|i| 3 + i % 9).collect();
    check_invariance_with("synth-qwen2-Q8_0.gguf", 6, &lengths, 128, 70);
    check_invariance_with("SmolLM2-135M-Instruct.Q4_1.gguf", 4, &lengths, 128, 70);
}

/// A sink whose receiver is gone after `limit` tokens.
struct Hangup {
    sender: std::sync::mpsc::Sender<SequenceEvent>,
    sent: usize,
    limit: usize,
}

impl EventSink for Hangup {
    fn send(&mut self, event: SequenceEvent) -> bool {
        self.sent += 1;
        self.sent <= self.limit && self.sender.send(event).is_ok()
    }

    fn is_closed(&self) -> bool {
        self.sent >= self.limit
    }
}

#[test]
fn disconnect_cancels_and_frees_blocks() {
    let Some(model) = model("synth-qwen2-Q8_0.gguf") else {
        return;
    };
    let scheduler = Scheduler::start(
        model,
        &EngineConfig {
            context_size: CONTEXT,
            max_sequences: 2,
            ..Default::default()
        },
    )
    .expect("scheduler");
    let total = scheduler.stats().total_blocks;
    let (sender, receiver) = channel();
    let hangup = Hangup {
        sender,
        sent: 0,
        limit: 3,
    };
    scheduler
        .submit(Request::greedy(vec![5, 6, 7], 400), Box::new(hangup))
        .expect("submit");
    assert!(scheduler.wait_idle(Duration::from_secs(30)));
    let received: Vec<SequenceEvent> = receiver.try_iter().collect();
    assert_eq!(received.len(), 3, "no events after the hang-up");
    assert_eq!(scheduler.stats().free_blocks, total);
}

#[test]
fn refuses_bad_requests_and_a_full_queue() {
    let Some(model) = model("synth-qwen2-Q8_0.gguf") else {
        return;
    };
    let scheduler = Scheduler::start(
        model,
        &EngineConfig {
            context_size: 64,
            max_sequences: 1,
            max_queued: 1,
            ..Default::default()
        },
    )
    .expect("scheduler");
    let sink = || Box::new(channel().0);
    assert!(matches!(
        scheduler.submit(Request::greedy(Vec::new(), 4), sink()),
        Err(SubmitError::InvalidParameter { name: "prompt", .. })
    ));
    assert!(matches!(
        scheduler.submit(Request::greedy(vec![1], 0), sink()),
        Err(SubmitError::InvalidParameter {
            name: "max_tokens",
            ..
        })
    ));
    assert!(matches!(
        scheduler.submit(Request::greedy(vec![1; 64], 4), sink()),
        Err(SubmitError::PromptTooLong {
            tokens: 64,
            context: 64
        })
    ));
    let mut hot = Request::greedy(vec![1], 4);
    hot.sampling.temperature = -1.0;
    assert!(matches!(
        scheduler.submit(hot, sink()),
        Err(SubmitError::InvalidParameter {
            name: "temperature",
            ..
        })
    ));
    // Fill the slot and the queue faster than the worker drains them.
    let mut outcomes = Vec::new();
    let mut receivers = Vec::new();
    for _ in 0..6 {
        let (sender, receiver) = channel();
        outcomes.push(scheduler.submit(Request::greedy(vec![1, 2], 60), Box::new(sender)));
        receivers.push(receiver);
    }
    assert!(outcomes
        .iter()
        .any(|o| matches!(o, Err(SubmitError::QueueFull { .. }))));
    assert!(scheduler.wait_idle(Duration::from_secs(60)));
}
