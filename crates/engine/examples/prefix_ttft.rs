//! Prefix caching, measured: the time to first token of a request whose prompt begins with
//! the same long prefix as the request before it (a system prompt, a chat's earlier turns),
//! with the prefix cache on and off. Each round submits a first request (the prefix and a
//! tail of its own) and, once it has ended, a second (the prefix and another tail); medians
//! over the rounds are printed. Every round uses a fresh prefix, so the first request of a
//! round finds nothing cached.
//!
//! `cargo run --release -p runit-engine --example prefix_ttft -- MODEL [PREFIX] [TAIL] [THREADS] [ROUNDS] [DEVICE]`
//!
//! Defaults: a prefix of 2000 tokens, tails of 32, 2 threads, 3 rounds, the CPU (`cuda`: GPU
//! 0); the engine's default chunk of 512 tokens and a context of 4096 cells.

use std::sync::Arc;
use std::time::Instant;

use runit_engine::scheduler::{Request, Scheduler, SequenceEvent};
use runit_engine::EngineConfig;
use runit_model::Model;

/// Seconds from submission to the first token of a greedy request for `prompt` (run to
/// its end).
fn time_to_first_token(scheduler: &Scheduler, prompt: Vec<u32>) -> f64 {
    let (sender, receiver) = std::sync::mpsc::channel();
    let start = Instant::now();
    let request = Request {
        logprobs: false,
        ..Request::greedy(prompt, 4)
    };
    scheduler
        .submit(request, Box::new(sender))
        .expect("submitted");
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

/// `len` token ids from `seed`, below `vocab`.
fn tokens(vocab: usize, seed: usize, len: usize) -> Vec<u32> {
    (0..len)
        .map(|i| ((i * 7919 + seed * 104_729 + 13) % (vocab - 1)) as u32 + 1)
        .collect()
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let usage = "usage: prefix_ttft MODEL [PREFIX] [TAIL] [THREADS] [ROUNDS] [DEVICE]";
    let path = args.get(1).expect(usage);
    let prefix_tokens: usize = args.get(2).map_or(2000, |a| a.parse().expect("PREFIX"));
    let tail_tokens: usize = args.get(3).map_or(32, |a| a.parse().expect("TAIL"));
    let threads: usize = args.get(4).map_or(2, |a| a.parse().expect("THREADS"));
    let rounds: usize = args.get(5).map_or(3, |a| a.parse().expect("ROUNDS"));
    let device = args.get(6).map_or("cpu", String::as_str);
    let file = Arc::new(runit_gguf::GgufFile::open(path).expect("model opens"));
    let backend: Arc<dyn runit_backend::Backend> = match device {
        "cpu" => Arc::new(runit_backend_cpu::CpuBackend::new(threads).expect("cpu backend")),
        "cuda" => Arc::new(runit_backend_cuda::CudaBackend::new(0).expect("GPU 0")),
        other => panic!("DEVICE: `cpu` or `cuda`, found `{other}`"),
    };
    let model = Arc::new(Model::load(file, backend).expect("model loads"));
    let vocab = model.config.vocab_size;
    println!(
        "prefix {prefix_tokens} tokens, tails {tail_tokens}, {device}, {threads} threads, {rounds} rounds"
    );
    println!("cache | first request TTFT (s) | second request TTFT (s) | speed-up");
    for prefix_cache in [false, true] {
        let config = EngineConfig {
            prefix_cache,
            ..EngineConfig::default()
        };
        let scheduler = Scheduler::start(Arc::clone(&model), &config).expect("scheduler");
        let (mut firsts, mut seconds) = (Vec::new(), Vec::new());
        for round in 0..rounds {
            let prefix = tokens(vocab, round * 3, prefix_tokens);
            let with_tail = |seed: usize| {
                let mut prompt = prefix.clone();
                prompt.extend(tokens(vocab, seed, tail_tokens));
                prompt
            };
            firsts.push(time_to_first_token(&scheduler, with_tail(round * 3 + 1)));
            seconds.push(time_to_first_token(&scheduler, with_tail(round * 3 + 2)));
        }
        let metrics = scheduler.metrics();
        println!(
            "{:5} | {:.3} | {:.3} | {:.1}x  (prompt tokens cached {}, evaluated {})",
            if prefix_cache { "on" } else { "off" },
            median(&firsts),
            median(&seconds),
            median(&firsts) / median(&seconds),
            metrics.prefix_hit_tokens,
            metrics.prefix_miss_tokens,
        );
    }
}
