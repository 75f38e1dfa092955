//! Scheduler throughput without HTTP: `N` greedy requests of `T` tokens submitted at once,
//! against one request alone; prints aggregate generated tok/s of both. The two alternate
//! for `ROUNDS` rounds (a shared machine's speed drifts between runs) and the median of
//! each is reported.
//!
//! `cargo run --release -p runit-engine --example batch_decode -- MODEL [N] [T] [THREADS] [ROUNDS] [batch-only]`
//!
//! With `batch-only` the single requests are skipped, so that a profiler (`perf record`)
//! samples the `N`-row decode steps alone.
//!
//! Each batch round also prints its steps' rate at the first decile of their times (the
//! `N` tokens of one step over the step's time): the speed of the undisturbed steps, which
//! shared machines' bursts of other work (that move a round's figure by 10% and more)
//! leave alone, for comparing builds.

use std::sync::Arc;
use std::time::Instant;

use runit_engine::scheduler::{Request, Scheduler, SequenceEvent};
use runit_engine::EngineConfig;
use runit_model::Model;

/// One round: (tokens generated, seconds, the intervals between the first request's tokens).
fn run(scheduler: &Scheduler, prompts: &[Vec<u32>], tokens: usize) -> (usize, f64, Vec<f64>) {
    let start = Instant::now();
    let receivers: Vec<_> = prompts
        .iter()
        .map(|prompt| {
            let (sender, receiver) = std::sync::mpsc::channel();
            scheduler
                .submit(
                    // No log-probabilities, as `serve_bench.py`'s requests ask for none.
                    Request {
                        logprobs: false,
                        ..Request::greedy(prompt.clone(), tokens)
                    },
                    Box::new(sender),
                )
                .expect("submitted");
            receiver
        })
        .collect();
    let (mut generated, mut steps, mut last) = (0, Vec::new(), None);
    for (index, receiver) in receivers.into_iter().enumerate() {
        for event in receiver {
            if let SequenceEvent::Token(_) = event {
                generated += 1;
                // The first request's tokens arrive one per step, as the steps end (the
                // others' wait in their channels until it is done).
                if index == 0 {
                    let now = Instant::now();
                    if let Some(last) = last.replace(now) {
                        steps.push(now.duration_since(last).as_secs_f64());
                    }
                }
            }
        }
    }
    (generated, start.elapsed().as_secs_f64(), steps)
}

/// The first decile of `values` (NaN for none).
fn first_decile(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values.get(values.len() / 10).copied().unwrap_or(f64::NAN)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let path = args
        .get(1)
        .expect("usage: batch_decode MODEL [N] [T] [THREADS]");
    let count: usize = args.get(2).map_or(8, |a| a.parse().expect("N"));
    let tokens: usize = args.get(3).map_or(128, |a| a.parse().expect("T"));
    let threads: usize = args.get(4).map_or(2, |a| a.parse().expect("THREADS"));
    let rounds: usize = args.get(5).map_or(3, |a| a.parse().expect("ROUNDS"));
    let batch_only = args.get(6).is_some_and(|a| a == "batch-only");
    let file = Arc::new(runit_gguf::GgufFile::open(path).expect("model opens"));
    let backend = Arc::new(runit_backend_cpu::CpuBackend::new(threads).expect("cpu backend"));
    let model = Arc::new(Model::load(file, backend).expect("model loads"));
    let config = EngineConfig {
        max_sequences: count,
        ..EngineConfig::default()
    };
    let scheduler = Scheduler::start(model, &config).expect("scheduler");
    let prompts: Vec<Vec<u32>> = (0..count as u32)
        .map(|i| vec![1, 504 + i, 314 + 7 * i, 28 + i])
        .collect();
    // A first pass faults the weights in.
    run(&scheduler, &prompts[..1], 8);
    let (mut singles, mut batches, mut step_rates) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..rounds.max(1) {
        let single = (!batch_only).then(|| {
            let (one, one_time, _) = run(&scheduler, &prompts[..1], tokens);
            one as f64 / one_time
        });
        let (all, all_time, mut steps) = run(&scheduler, &prompts, tokens);
        let batch = all as f64 / all_time;
        let step_rate = count as f64 / first_decile(&mut steps);
        batches.push(batch);
        step_rates.push(step_rate);
        let steps = format!("(steps at the first decile: {step_rate:.1} tok/s)");
        match single {
            Some(single) => {
                singles.push(single);
                println!(
                    "round: one request {single:.1} tok/s; {count} at once {batch:.1} tok/s {steps}"
                );
            }
            None => println!("round: {count} at once {batch:.1} tok/s {steps}"),
        }
    }
    let median = |values: &[f64]| {
        let mut sorted = values.to_vec();
        sorted.sort_by(f64::total_cmp);
        sorted[sorted.len() / 2]
    };
    if batch_only {
        println!(
            "median: {count} at once: {:.1} tok/s; steps at the first decile: {:.1} tok/s",
            median(&batches),
            median(&step_rates)
        );
        return;
    }
    let ratios: Vec<f64> = batches.iter().zip(&singles).map(|(b, s)| b / s).collect();
    println!(
        "median: one request: {:.1} tok/s; {count} at once: {:.1} tok/s; ratio per round {:.2}x (median)",
        median(&singles),
        median(&batches),
        median(&ratios)
    );
}
