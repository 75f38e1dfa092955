//! Exact admission: a request's sequences are queued together or refused together by the
//! room left at that moment (`max_sequences + max_queued` running or waiting), a refusal
//! leaves nothing behind, a place is free again before its sequence's last event arrives,
//! and the queue reports and drains to zero.

mod common;

use std::sync::mpsc::{channel, Receiver};
use std::sync::Arc;
use std::time::Duration;

use common::Lockstep;
use runit_engine::scheduler::{
    EventSink, Request, Scheduler, SchedulerStats, SequenceEvent, SubmitError,
};
use runit_engine::{EngineConfig, StopReason};
use runit_model::Model;

const CONTEXT: usize = 512;

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

/// `count` greedy requests of `max_tokens` tokens with distinct short prompts, and the
/// receivers of their events.
type Group = (
    Vec<(Request, Box<dyn EventSink>)>,
    Vec<Receiver<SequenceEvent>>,
);

fn group(count: usize, max_tokens: usize) -> Group {
    let mut requests = Vec::with_capacity(count);
    let mut receivers = Vec::with_capacity(count);
    for i in 0..count as u32 {
        let (sender, receiver) = channel();
        let sink: Box<dyn EventSink> = Box::new(sender);
        requests.push((
            Request::greedy(vec![1 + i % 50, 7, 3 + i % 11], max_tokens),
            sink,
        ));
        receivers.push(receiver);
    }
    (requests, receivers)
}

/// Waits for every sequence's end; each must generate `max_tokens` tokens.
fn finish(receivers: &[Receiver<SequenceEvent>], max_tokens: usize) {
    for receiver in receivers {
        let mut tokens = 0;
        loop {
            match receiver
                .recv_timeout(Duration::from_secs(60))
                .expect("event")
            {
                SequenceEvent::Token(_) => tokens += 1,
                SequenceEvent::Finished { stop, .. } => {
                    assert_eq!(stop, StopReason::Limit);
                    break;
                }
                SequenceEvent::Failed(message) => panic!("sequence failed: {message}"),
            }
        }
        assert_eq!(tokens, max_tokens);
    }
}

/// Waits until the scheduler is idle and checks that it reports so, every block free.
fn assert_drained(scheduler: &Scheduler) {
    assert!(scheduler.wait_idle(Duration::from_secs(60)));
    let stats = scheduler.stats();
    assert_eq!(
        stats,
        SchedulerStats {
            free_blocks: stats.total_blocks,
            total_blocks: stats.total_blocks,
            active: 0,
            queued: 0,
        }
    );
}

/// The case: a request for 16 sequences of one token, then at once one for 64, on
/// an idle scheduler running 64 with 64 waiting: always queued, fifty times over; and as
/// soon as every sequence has ended, the whole room is free again (64 running and 64
/// waiting are accepted at once).
#[test]
fn sixteen_then_sixty_four_are_always_admitted() {
    let Some(model) = model() else { return };
    let scheduler = Scheduler::start(
        model,
        &EngineConfig {
            context_size: CONTEXT,
            max_sequences: 64,
            max_queued: 64,
            ..Default::default()
        },
    )
    .expect("scheduler");
    for repetition in 0..50 {
        let (chat, chat_receivers) = group(16, 1);
        let (completions, completion_receivers) = group(64, 1);
        scheduler.submit_all(chat).expect("16 sequences queued");
        if let Err(error) = scheduler.submit_all(completions) {
            panic!("repetition {repetition}: 64 sequences after 16 refused: {error}");
        }
        finish(&chat_receivers, 1);
        finish(&completion_receivers, 1);
        // Every place is free once the last sequence's end has arrived.
        let (first, first_receivers) = group(64, 2);
        let (second, second_receivers) = group(64, 1);
        scheduler.submit_all(first).expect("64 running");
        if let Err(error) = scheduler.submit_all(second) {
            panic!("repetition {repetition}: 64 waiting refused: {error}");
        }
        finish(&first_receivers, 2);
        finish(&second_receivers, 1);
        assert_drained(&scheduler);
    }
}

/// With the scheduler held inside a step: a request for more sequences than run at once is
/// refused, one for more than the room left is refused whole (and leaves the queue as it
/// was), an invalid member refuses the whole request, and what was queued runs and drains.
#[test]
fn refusals_are_exact_and_leave_nothing_behind() {
    let Some(model) = model() else { return };
    let scheduler = Scheduler::start(
        model,
        &EngineConfig {
            context_size: CONTEXT,
            max_sequences: 4,
            max_queued: 2,
            ..Default::default()
        },
    )
    .expect("scheduler");
    let (events, held_events) = channel();
    let (go, go_receiver) = channel();
    let lockstep = Lockstep {
        events,
        go: go_receiver,
    };
    scheduler
        .submit(Request::greedy(vec![5, 6, 7], 3), Box::new(lockstep))
        .expect("submit");
    // The scheduler now waits inside its first step, the sequence's first token sent.
    assert!(matches!(
        held_events.recv_timeout(Duration::from_secs(60)),
        Ok(SequenceEvent::Token(_))
    ));
    let stats = scheduler.stats();
    assert_eq!((stats.active, stats.queued), (1, 0));
    assert!(matches!(
        scheduler.submit_all(group(5, 2).0),
        Err(SubmitError::TooManySequences {
            requested: 5,
            max_sequences: 4
        })
    ));
    let (four, mut receivers) = group(4, 2);
    scheduler.submit_all(four).expect("room for 5");
    assert_eq!(scheduler.stats().queued, 4);
    assert!(matches!(
        scheduler.submit_all(group(2, 2).0),
        Err(SubmitError::QueueFull {
            requested: 2,
            room: 1
        })
    ));
    assert_eq!(
        scheduler.stats().queued,
        4,
        "a refusal leaves nothing behind"
    );
    let (one, one_receivers) = group(1, 2);
    scheduler.submit_all(one).expect("room for 1");
    receivers.extend(one_receivers);
    assert!(matches!(
        scheduler.submit_all(group(1, 2).0),
        Err(SubmitError::QueueFull {
            requested: 1,
            room: 0
        })
    ));
    let (mut invalid, _) = group(2, 2);
    invalid[1].0.prompt.clear();
    assert!(matches!(
        scheduler.submit_all(invalid),
        Err(SubmitError::InvalidParameter { name: "prompt", .. })
    ));
    assert_eq!(scheduler.stats().queued, 5);
    // Let the held sequence and the queue run: one go-ahead per token of the held sequence
    // (the first is waiting for its own).
    for _ in 0..3 {
        go.send(()).expect("the scheduler waits");
    }
    finish(&receivers, 2);
    let held_rest: Vec<SequenceEvent> = (0..3)
        .map(|_| {
            held_events
                .recv_timeout(Duration::from_secs(60))
                .expect("event")
        })
        .collect();
    assert!(matches!(
        held_rest[2],
        SequenceEvent::Finished {
            generated_tokens: 3,
            ..
        }
    ));
    assert_drained(&scheduler);
    // The whole room again: 4 running and 2 waiting.
    let (four, four_receivers) = group(4, 2);
    let (two, two_receivers) = group(2, 2);
    scheduler.submit_all(four).expect("4 running");
    scheduler.submit_all(two).expect("2 waiting");
    finish(&four_receivers, 2);
    finish(&two_receivers, 2);
    assert_drained(&scheduler);
}
