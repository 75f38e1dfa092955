//! Matmul kernel speed measured in per-thread CPU time, on the calling thread only: a figure
//! that stays meaningful on a machine shared with other jobs (wall-clock benchmarks there
//! mostly measure the neighbours). Shapes are SmolLM2-135M's; prints GB/s of weights for
//! one token, µs per token for a decode batch of 8, and GFLOP/s for 128 tokens, per thread,
//! at the detected SIMD level (pass `avx2` or `scalar` to force a lower one;
//! `RUNIT_BENCH_TYPE=Q4_1` measures one weight type).
//!
//! `cargo bench -p runit-backend-cpu --bench matmul_cpu_time [-- avx2]` (Linux only).

use runit_backend_cpu::matmul::{matmul, PackedWeight, Parallelism};
use runit_quant::dot::SimdLevel;
use runit_quant::{quantize, GgmlType};

/// CPU time of the calling thread, in seconds.
fn thread_cpu_seconds() -> f64 {
    let ns = runit_backend::clock::thread_cpu_ns().expect("the thread's CPU clock (Linux)");
    ns as f64 * 1e-9
}

fn values(count: usize, seed: u64) -> Vec<f32> {
    let mut state = seed | 1;
    (0..count)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            ((state >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 2.0
        })
        .collect()
}

fn main() {
    let level = match std::env::args()
        .skip(1)
        .find(|a| !a.starts_with('-'))
        .as_deref()
    {
        Some("avx2") => SimdLevel::Avx2,
        Some("scalar") => SimdLevel::Scalar,
        _ => SimdLevel::detect(),
    };
    let parallelism = Parallelism {
        pool: None,
        level,
        rows_alone: false,
    };
    if std::env::args().any(|a| a == "stream") {
        stream(&parallelism);
        return;
    }
    let types = [
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q8_0,
        GgmlType::Q4_K,
        GgmlType::Q6_K,
        GgmlType::F16,
    ];
    let only = std::env::var("RUNIT_BENCH_TYPE").ok();
    for ty in types {
        if only.as_ref().is_some_and(|only| *only != ty.to_string()) {
            continue;
        }
        for (n_in, n_out) in [(576usize, 1536usize), (1536, 576)] {
            if n_in % ty.block_size() != 0 {
                continue;
            }
            let row_bytes = ty.row_bytes(n_in as u64).expect("whole blocks") as usize;
            let mut bytes = vec![0u8; row_bytes * n_out];
            quantize(ty, &values(n_in * n_out, 7), &mut bytes).expect("quantizable");
            let weight = PackedWeight::new(ty, &bytes, n_in, n_out);
            for tokens in [1usize, 8, 128] {
                let x = values(tokens * n_in, 11);
                let mut y = vec![0.0f32; tokens * n_out];
                let mut scratch = Vec::new();
                let iterations = if tokens < 128 { 1000 / tokens } else { 10 };
                let mut best = f64::MAX;
                for _ in 0..5 {
                    let start = thread_cpu_seconds();
                    for _ in 0..iterations {
                        matmul(&weight, &x, tokens, &mut y, &mut scratch, &parallelism);
                    }
                    best = best.min((thread_cpu_seconds() - start) / iterations as f64);
                }
                let figure = if tokens == 1 {
                    format!("{:.2} GB/s", bytes.len() as f64 / best / 1e9)
                } else if tokens < 128 {
                    format!("{:.1} us per token", best * 1e6 / tokens as f64)
                } else {
                    format!(
                        "{:.1} GFLOP/s",
                        2.0 * (n_in * n_out * tokens) as f64 / best / 1e9
                    )
                };
                println!(
                    "{level:?} {ty} {n_in}->{n_out} {tokens} tok: {:.1} us, {figure} per thread",
                    best * 1e6
                );
            }
        }
    }
}

/// Decode from memory rather than cache: one token through a weight far larger than the
/// caches (49152 x 576, the shape of SmolLM2's output matrix, times three), so the figure
/// is the kernel's share of the memory bandwidth of one core (`-- stream`).
fn stream(parallelism: &Parallelism) {
    for ty in [
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q8_0,
        GgmlType::Q4_K,
        GgmlType::Q6_K,
    ] {
        let n_in = if ty.block_size() == 256 { 1536 } else { 576 };
        let n_out = 3 * 49152 * 576 / n_in;
        let row_bytes = ty.row_bytes(n_in as u64).expect("whole blocks") as usize;
        let mut bytes = vec![0u8; row_bytes * n_out];
        quantize(ty, &values(n_in * n_out, 7), &mut bytes).expect("quantizable");
        let weight = PackedWeight::new(ty, &bytes, n_in, n_out);
        let x = values(n_in, 11);
        let mut y = vec![0.0f32; n_out];
        let mut scratch = Vec::new();
        let mut best = f64::MAX;
        for _ in 0..8 {
            let start = thread_cpu_seconds();
            matmul(&weight, &x, 1, &mut y, &mut scratch, parallelism);
            best = best.min(thread_cpu_seconds() - start);
        }
        println!(
            "{:?} {ty} stream {} MB: {:.0} us, {:.2} GB/s per thread",
            parallelism.level,
            bytes.len() >> 20,
            best * 1e6,
            bytes.len() as f64 / best / 1e9
        );
    }
}
