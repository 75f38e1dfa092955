//! The KV pool under pressure: how it is sized, a request that cannot fit now waits and then
//! runs, and sequences cancelled while waiting or in the middle of a prefill leave no block
//! behind, the prefix cache included (what they cached is still exact for the next prompt).

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::Arc;
use std::time::{Duration, Instant};

use runit_engine::scheduler::{EventSink, Request, Scheduler, SequenceEvent};
use runit_engine::{EngineConfig, EngineError};
use runit_model::Model;

fn model() -> Option<Arc<Model>> {
    let name = "synth-qwen2-Q8_0.gguf";
    match common::find_model(name) {
        Some(path) => Some(common::load(&path, 2)),
        None => {
            eprintln!("skipping: {name} not found");
            None
        }
    }
}

fn config(context_size: usize) -> EngineConfig {
    EngineConfig {
        context_size,
        batch_size: 64,
        max_sequences: 4,
        ..EngineConfig::default()
    }
}

#[test]
fn the_pool_is_sized_from_the_context_on_the_host() {
    let Some(model) = model() else { return };
    let host = EngineConfig {
        device_memory_fraction: Some(0.5),
        ..config(200)
    };
    let scheduler = Scheduler::start(Arc::clone(&model), &host).expect("scheduler");
    // A host backend has no device memory to size from: 200 cells in blocks of 16.
    assert_eq!(scheduler.stats().total_blocks, 13);
    assert_eq!(scheduler.context_size(), 200);
    for fraction in [0.0, -1.0, 1.5, f64::NAN] {
        let bad = EngineConfig {
            device_memory_fraction: Some(fraction),
            ..config(200)
        };
        match Scheduler::start(Arc::clone(&model), &bad) {
            Err(EngineError::InvalidParameter { name, .. }) => {
                assert_eq!(name, "device_memory_fraction");
            }
            Err(other) => panic!("{fraction}: {other}"),
            Ok(_) => panic!("{fraction} accepted"),
        }
    }
}

/// Events of several sequences in the order the scheduler sent them.
struct Tagged {
    tag: usize,
    events: Sender<(usize, SequenceEvent, Instant)>,
}

impl EventSink for Tagged {
    fn send(&mut self, event: SequenceEvent) -> bool {
        self.events.send((self.tag, event, Instant::now())).is_ok()
    }
}

/// Two requests that each need the whole pool: the second waits for the first to end, then
/// runs; both are answered in full and every block returns.
#[test]
fn a_pool_past_the_training_context_keeps_every_cell() {
    let Some(model) = model() else { return };
    let trained = model.config.context_length;
    // Sequences share the pool: it holds all the cells asked for, while one sequence stops
    // at the training context.
    let scheduler = Scheduler::start(Arc::clone(&model), &config(3 * trained)).expect("scheduler");
    assert_eq!(scheduler.stats().total_blocks, (3 * trained).div_ceil(16));
    assert_eq!(scheduler.context_size(), trained);
}

#[test]
fn a_request_that_cannot_fit_now_waits() {
    let Some(model) = model() else { return };
    let scheduler = Scheduler::start(model, &config(96)).expect("scheduler");
    let total = scheduler.stats().total_blocks;
    assert_eq!(total, 6);
    let (sender, receiver) = channel();
    for tag in 0..2 {
        let sink = Tagged {
            tag,
            events: sender.clone(),
        };
        // 4 prompt tokens and 90 to generate: 94 cells, all 6 blocks.
        let request = Request::greedy(vec![3 + tag as u32, 5, 7, 9], 90);
        scheduler.submit(request, Box::new(sink)).expect("queued");
    }
    drop(sender);
    let events: Vec<(usize, SequenceEvent, Instant)> = receiver.iter().collect();
    let end_of_first = events
        .iter()
        .position(|(tag, event, _)| *tag == 0 && matches!(event, SequenceEvent::Finished { .. }))
        .expect("the first ends");
    let start_of_second = events
        .iter()
        .position(|(tag, event, _)| *tag == 1 && matches!(event, SequenceEvent::Token(_)))
        .expect("the second runs");
    assert!(end_of_first < start_of_second, "the second waited");
    for tag in 0..2 {
        let tokens = events
            .iter()
            .filter(|(t, event, _)| *t == tag && matches!(event, SequenceEvent::Token(_)))
            .count();
        assert_eq!(tokens, 90, "sequence {tag}");
    }
    assert!(scheduler.wait_idle(Duration::from_secs(10)));
    assert_eq!(scheduler.stats().free_blocks, total);
}

/// A sink whose receiver goes away after the scheduler has looked at it `steps` times (one
/// look per step), before any event: a client that leaves in the middle of a prefill.
struct LeavesAfter {
    looks: AtomicUsize,
    steps: usize,
}

impl EventSink for LeavesAfter {
    fn send(&mut self, _: SequenceEvent) -> bool {
        false
    }

    fn is_closed(&self) -> bool {
        self.looks.fetch_add(1, Ordering::Relaxed) >= self.steps
    }
}

fn collect(receiver: &Receiver<SequenceEvent>) -> Vec<(u32, u64)> {
    let mut out = Vec::new();
    loop {
        match receiver
            .recv_timeout(Duration::from_secs(60))
            .expect("event")
        {
            SequenceEvent::Token(token) => out.push((token.id, token.logprob.to_bits())),
            SequenceEvent::Finished { .. } => return out,
            SequenceEvent::Failed(message) => panic!("sequence failed: {message}"),
        }
    }
}

/// A 300-token prompt left after three of its five chunks (and requests left while
/// waiting): every block returns, the chunks it evaluated stay cached, and the same prompt
/// submitted again reuses them with the numbers of a scheduler without the cache.
#[test]
fn clients_leaving_mid_prefill_leave_no_block_behind() {
    let Some(model) = model() else { return };
    let prompt: Vec<u32> = (0..300).map(|i| (i * 31 % 500) as u32 + 1).collect();
    let scheduler = Scheduler::start(Arc::clone(&model), &config(1024)).expect("scheduler");
    let total = scheduler.stats().total_blocks;
    let leaving = LeavesAfter {
        looks: AtomicUsize::new(0),
        steps: 3,
    };
    scheduler
        .submit(Request::greedy(prompt.clone(), 8), Box::new(leaving))
        .expect("queued");
    // Requests that leave while they wait behind a full slot set.
    for i in 0..6 {
        let leaving = LeavesAfter {
            looks: AtomicUsize::new(0),
            steps: i % 3,
        };
        scheduler
            .submit(Request::greedy(vec![9, 8, 7], 8), Box::new(leaving))
            .expect("queued");
    }
    assert!(scheduler.wait_idle(Duration::from_secs(30)));
    assert_eq!(scheduler.stats().free_blocks, total, "no block leaks");
    let cached = scheduler.metrics().cached_blocks;
    assert!(cached > 0, "the evaluated chunks stay cached");
    assert!(cached < 300 / 16, "the prompt was not evaluated whole");
    let (sender, receiver) = channel();
    scheduler
        .submit(Request::greedy(prompt.clone(), 8), Box::new(sender))
        .expect("queued");
    let reused = collect(&receiver);
    assert!(scheduler.metrics().prefix_hit_tokens > 0);
    let uncached = Scheduler::start(
        model,
        &EngineConfig {
            prefix_cache: false,
            ..config(1024)
        },
    )
    .expect("scheduler");
    let (sender, receiver) = channel();
    uncached
        .submit(Request::greedy(prompt, 8), Box::new(sender))
        .expect("queued");
    assert_eq!(reused, collect(&receiver));
    assert!(scheduler.wait_idle(Duration::from_secs(10)));
    assert_eq!(scheduler.stats().free_blocks, total, "no block leaks");
}
