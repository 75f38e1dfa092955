//! No head-of-line blocking: a short request submitted while a long prompt is being
//! prefilled gets its first token in the next step, long before the long prompt's, while a
//! running sequence decodes one token every step; everyone's greedy tokens stay those of
//! their lone runs. Steps are counted, not timed: a sequence whose sink waits for the test's
//! go-ahead after each token ([`Lockstep`]) holds the scheduler once a step.

mod common;

use std::sync::mpsc::{channel, Receiver};
use std::sync::Arc;
use std::time::Duration;

use common::Lockstep;
use runit_engine::scheduler::{Request, Scheduler, SequenceEvent};
use runit_engine::{generate, EngineConfig, GenerateParams, Sampler, Session};
use runit_model::Model;

const CONTEXT: usize = 512;
/// The chunk budget: the long prompt takes `LONG / CHUNK` passes.
const CHUNK: usize = 16;
const LONG: usize = 160;

fn alone(model: &Arc<Model>, request: &Request) -> Vec<u32> {
    let config = EngineConfig {
        context_size: CONTEXT,
        batch_size: CHUNK,
        ..Default::default()
    };
    let mut session = Session::new(Arc::clone(model), &config).expect("session");
    let mut sampler = Sampler::new(request.sampling.clone()).expect("sampler");
    let params = GenerateParams {
        max_tokens: request.max_tokens,
        end_of_generation: Vec::new(),
        top_logprobs: 0,
    };
    generate(&mut session, &mut sampler, &request.prompt, &params, |_| {
        true
    })
    .expect("generate")
    .tokens
}

fn prompt(vocab: usize, len: usize, salt: usize) -> Vec<u32> {
    (0..len)
        .map(|i| ((i * 7919 + salt * 104_729 + 13) % (vocab - 1)) as u32 + 1)
        .collect()
}

/// The tokens of the events received so far, and whether the sequence has finished.
fn drain(receiver: &Receiver<SequenceEvent>, tokens: &mut Vec<u32>) -> bool {
    let mut finished = false;
    for event in receiver.try_iter() {
        match event {
            SequenceEvent::Token(token) => tokens.push(token.id),
            SequenceEvent::Finished { .. } => finished = true,
            SequenceEvent::Failed(message) => panic!("sequence failed: {message}"),
        }
    }
    finished
}

fn check_short_request_passes_long_prompt(name: &str) {
    let Some(path) = common::find_model(name) else {
        eprintln!("skipping: {name} not found");
        return;
    };
    let model = common::load(&path, 2);
    let vocab = model.config.vocab_size;
    let decoding = Request::greedy(prompt(vocab, 1, 0), 40);
    let long = Request::greedy(prompt(vocab, LONG, 1), 4);
    let short = Request::greedy(prompt(vocab, 3, 2), 4);
    let scheduler = Scheduler::start(
        Arc::clone(&model),
        &EngineConfig {
            context_size: CONTEXT,
            batch_size: CHUNK,
            max_sequences: 4,
            ..Default::default()
        },
    )
    .expect("scheduler");
    let (events, decoding_events) = channel();
    let (go, go_receiver) = channel();
    let lockstep = Lockstep {
        events,
        go: go_receiver,
    };
    scheduler
        .submit(decoding.clone(), Box::new(lockstep))
        .expect("submit");
    let (long_sender, long_events) = channel();
    let (short_sender, short_events) = channel();
    let mut short_sender = Some(short_sender);
    let (mut decoding_tokens, mut long_tokens, mut short_tokens) =
        (Vec::new(), Vec::new(), Vec::new());
    // The step (counted by the decoding sequence's tokens) at which each event was seen.
    let (mut short_submitted, mut short_first, mut long_first) = (None, None, None);
    loop {
        let event = decoding_events
            .recv_timeout(Duration::from_secs(60))
            .expect("the decoding sequence's next event");
        match event {
            SequenceEvent::Token(token) => decoding_tokens.push(token.id),
            SequenceEvent::Finished { .. } => break,
            SequenceEvent::Failed(message) => panic!("sequence failed: {message}"),
        }
        // The scheduler waits inside this step's decode pass: everything of the steps
        // before has been sent.
        let step = decoding_tokens.len();
        drain(&long_events, &mut long_tokens);
        drain(&short_events, &mut short_tokens);
        if long_first.is_none() && !long_tokens.is_empty() {
            long_first = Some(step);
        }
        if short_first.is_none() && !short_tokens.is_empty() {
            short_first = Some(step);
        }
        if step == 1 {
            scheduler
                .submit(long.clone(), Box::new(long_sender.clone()))
                .expect("submit the long prompt");
        }
        // Two chunks of the long prompt are in the cache; this step's pass takes the third.
        if step == 4 {
            let sender = short_sender.take().expect("submitted once");
            scheduler
                .submit(short.clone(), Box::new(sender))
                .expect("submit the short request");
            short_submitted = Some(step);
        }
        go.send(()).expect("the scheduler waits");
    }
    drain(&long_events, &mut long_tokens);
    drain(&short_events, &mut short_tokens);
    let short_submitted = short_submitted.expect("submitted");
    let short_first = short_first.expect("the short request's first token during the run");
    let long_first = long_first.expect("the long prompt's first token during the run");
    // Submitted during step 4, admitted in step 5, whose prefill pass holds its prompt; its
    // token is there when step 6 decodes.
    assert_eq!(
        short_first,
        short_submitted + 2,
        "{name}: the short request waited behind the long prompt"
    );
    // The long prompt's ten chunks, each in its own pass, one pass left to the short one.
    let chunks = LONG.div_ceil(CHUNK);
    assert!(
        long_first > short_first,
        "{name}: the long prompt ({long_first}) finished before the short request ({short_first})"
    );
    assert_eq!(long_first, 2 + chunks + 1, "{name}: one step per chunk");
    assert!(scheduler.wait_idle(Duration::from_secs(30)));
    assert_eq!(
        scheduler.stats().free_blocks,
        scheduler.stats().total_blocks
    );
    for (what, request, tokens) in [
        ("decoding", &decoding, &decoding_tokens),
        ("long", &long, &long_tokens),
        ("short", &short, &short_tokens),
    ] {
        assert_eq!(
            *tokens,
            alone(&model, request),
            "{name}: the {what} sequence differs from its lone run"
        );
    }
}

#[test]
fn short_request_passes_long_prompt_synthetic() {
    check_short_request_passes_long_prompt("synth-qwen2-Q8_0.gguf");
}

#[test]
fn short_request_passes_long_prompt_smollm2() {
    check_short_request_passes_long_prompt("SmolLM2-135M-Instruct.Q4_1.gguf");
}
