//! Head-of-line blocking, measured: the time to first token of a short request submitted
//! while a long prompt is being prefilled, against the same short request alone and the
//! long prompt's own prefill. Each round runs the long request alone, the short one alone,
//! then the long one with the short one submitted a quarter of the long prefill's time
//! after it; medians over the rounds are printed.
//!
//! `cargo run --release -p runit-engine --example ttft -- MODEL [LONG] [SHORT] [THREADS] [CONTEXT] [ROUNDS]`
//!
//! Defaults: a prompt of 4000 tokens, a short one of 30, 2 threads, a context of 8192 cells
//! and 3 rounds; the batch (chunk) is the engine's default of 512 tokens.

use std::sync::mpsc::Receiver;
use std::sync::Arc;
use std::time::{Duration, Instant};

use runit_engine::scheduler::{Request, Scheduler, SequenceEvent};
use runit_engine::EngineConfig;
use runit_model::Model;

/// A greedy request of `prompt` for `max_tokens` tokens, without log-probabilities.
fn request(prompt: &[u32], max_tokens: usize) -> Request {
    Request {
        logprobs: false,
        ..Request::greedy(prompt.to_vec(), max_tokens)
    }
}

/// Submits `request` and returns a thread that answers the seconds from `start` to its
/// first token once the request is over.
fn submit(scheduler: &Scheduler, request: Request, start: Instant) -> std::thread::JoinHandle<f64> {
    let (sender, receiver) = std::sync::mpsc::channel();
    scheduler
        .submit(request, Box::new(sender))
        .expect("submitted");
    std::thread::spawn(move || first_token(&receiver, start))
}

/// Seconds from `start` to the first token of `receiver`'s sequence, after draining it.
fn first_token(receiver: &Receiver<SequenceEvent>, start: Instant) -> f64 {
    let mut first = None;
    for event in receiver {
        match event {
            SequenceEvent::Token(_) => {
                first.get_or_insert_with(|| start.elapsed().as_secs_f64());
            }
            SequenceEvent::Failed(message) => panic!("sequence failed: {message}"),
            SequenceEvent::Finished { .. } => break,
        }
    }
    first.expect("a first token")
}

fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    sorted[sorted.len() / 2]
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let usage = "usage: ttft MODEL [LONG] [SHORT] [THREADS] [CONTEXT] [ROUNDS]";
    let path = args.get(1).expect(usage);
    let long_tokens: usize = args.get(2).map_or(4000, |a| a.parse().expect("LONG"));
    let short_tokens: usize = args.get(3).map_or(30, |a| a.parse().expect("SHORT"));
    let threads: usize = args.get(4).map_or(2, |a| a.parse().expect("THREADS"));
    let context: usize = args.get(5).map_or(8192, |a| a.parse().expect("CONTEXT"));
    let rounds: usize = args.get(6).map_or(3, |a| a.parse().expect("ROUNDS"));
    let file = Arc::new(runit_gguf::GgufFile::open(path).expect("model opens"));
    let backend = Arc::new(runit_backend_cpu::CpuBackend::new(threads).expect("cpu backend"));
    let model = Arc::new(Model::load(file, backend).expect("model loads"));
    // The rounds repeat their prompts: without the prefix cache, each prefill is measured.
    let config = EngineConfig {
        context_size: context,
        prefix_cache: false,
        ..EngineConfig::default()
    };
    let scheduler = Scheduler::start(model, &config).expect("scheduler");
    let vocab = 49_000;
    let long: Vec<u32> = (0..long_tokens)
        .map(|i| ((i * 7919 + 13) % vocab) as u32 + 1)
        .collect();
    let short: Vec<u32> = (0..short_tokens)
        .map(|i| ((i * 104_729 + 29) % vocab) as u32 + 1)
        .collect();
    println!(
        "long prompt {long_tokens} tokens ({} chunks of {}), short prompt {short_tokens} tokens",
        long_tokens.div_ceil(config.batch_size),
        config.batch_size
    );
    // A first pass faults the weights in.
    submit(&scheduler, request(&short, 2), Instant::now())
        .join()
        .expect("warm-up");
    let (mut long_alone, mut short_alone, mut short_behind, mut long_with) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for _ in 0..rounds.max(1) {
        let long_time = submit(&scheduler, request(&long, 4), Instant::now())
            .join()
            .expect("long alone");
        let short_time = submit(&scheduler, request(&short, 4), Instant::now())
            .join()
            .expect("short alone");
        let start = Instant::now();
        let long_thread = submit(&scheduler, request(&long, 4), start);
        std::thread::sleep(Duration::from_secs_f64(long_time / 4.0));
        let short_start = Instant::now();
        let behind = submit(&scheduler, request(&short, 4), short_start)
            .join()
            .expect("short behind");
        let with = long_thread.join().expect("long with short");
        println!(
            "round: long alone {long_time:.3} s to first token, short alone {short_time:.3} s; \
             together: short {behind:.3} s after its submission, long {with:.3} s"
        );
        long_alone.push(long_time);
        short_alone.push(short_time);
        short_behind.push(behind);
        long_with.push(with);
    }
    let chunk_time = median(&long_alone) / long_tokens.div_ceil(config.batch_size) as f64;
    println!(
        "median: short request's first token {:.3} s behind the long prompt (alone {:.3} s; \
         one chunk of the long prompt about {chunk_time:.3} s); long prompt's first token \
         {:.3} s with the short one, {:.3} s alone",
        median(&short_behind),
        median(&short_alone),
        median(&long_with),
        median(&long_alone)
    );
}
