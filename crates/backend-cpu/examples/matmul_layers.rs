//! Wall-clock time of the decode-batch matmul as a model runs it: `LAYERS` distinct
//! weights of one shape (so they stream from the last-level cache or memory, as a model's
//! layers do) times `TOKENS` activation rows, on 1 and on `THREADS` threads; prints ns per
//! weight block, to set beside the kernel alone (`runit-quant`'s `tile_rows_time`).
//!
//! `cargo run --release -p runit-backend-cpu --example matmul_layers -- [TYPE] [N_IN] [N_OUT] [TOKENS] [LAYERS] [THREADS] [repacked]`
//! (`repacked`: in the order of ggml's repacked weights, as a model's Q4_0, IQ4_NL, Q2_K and
//! Q4_K matrices are; `alone`: every token row in its one-row order, as speculative
//! verification runs them).

use std::time::Instant;

use runit_backend_cpu::matmul::{matmul, Layout, PackedWeight, Parallelism};
use runit_quant::{quantize, GgmlType};

/// Values in [-1, 1) from a generator fixed by `seed`.
fn values(count: usize, seed: u64) -> Vec<f32> {
    runit_backend::testing::Rng::new(seed).values(count, -1.0, 1.0)
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let arg = |i: usize, default: &str| args.get(i).cloned().unwrap_or(default.into());
    let ty = GgmlType::from_name(&arg(0, "Q4_1")).expect("a ggml type name");
    let n_in: usize = arg(1, "576").parse().expect("N_IN");
    let n_out: usize = arg(2, "1536").parse().expect("N_OUT");
    let tokens: usize = arg(3, "8").parse().expect("TOKENS");
    let layers: usize = arg(4, "30").parse().expect("LAYERS");
    let threads: usize = arg(5, "2").parse().expect("THREADS");
    let mode = arg(6, "plain");
    let layout = match mode.as_str() {
        "repacked" => Layout::Repacked,
        _ => Layout::Plain,
    };
    let row_bytes = ty.row_bytes(n_in as u64).expect("whole blocks") as usize;
    let weights: Vec<Vec<u8>> = (0..layers)
        .map(|l| {
            let mut bytes = vec![0u8; row_bytes * n_out];
            quantize(ty, &values(n_in * n_out, 7 + l as u64), &mut bytes).expect("quantizable");
            bytes
        })
        .collect();
    let x = values(tokens * n_in, 11);
    let mut y = vec![0.0f32; tokens * n_out];
    let blocks = (n_in / ty.block_size() * n_out * layers) as f64;
    for threads in [1, threads] {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .expect("pool");
        let parallelism = Parallelism {
            rows_alone: mode == "alone",
            ..Parallelism::pool(&pool)
        };
        let mut scratch = Vec::new();
        let mut best = f64::MAX;
        for _ in 0..9 {
            let start = Instant::now();
            for _ in 0..10 {
                for bytes in &weights {
                    let weight = PackedWeight::new(ty, bytes, n_in, n_out).with_layout(layout);
                    matmul(&weight, &x, tokens, &mut y, &mut scratch, &parallelism);
                }
            }
            best = best.min(start.elapsed().as_secs_f64() / 10.0);
        }
        println!(
            "{ty} {n_in}x{n_out}, {tokens} tokens, {layers} weights, {threads} threads: {:.1} us per pass, {:.2} ns per block ({:.2} ns of thread time)",
            best * 1e6,
            best * 1e9 / blocks,
            best * 1e9 / blocks * threads as f64
        );
    }
}
