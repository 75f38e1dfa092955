//! Matmul speed on SmolLM2-135M's shapes (576 -> 1536 and 1536 -> 576) with two threads.
//!
//! One token (decode) reports weight bytes per second: decode is memory-bound, so this is
//! the figure to hold against memory bandwidth. 128 tokens (prompt processing) reports
//! multiply-adds x 2 per second (FLOP/s, shown by criterion as elements per second).
//!
//! `cargo bench -p runit-backend-cpu --bench matmul` (set `RUNIT_BENCH_THREADS` to change
//! the thread count, `RUNIT_BENCH_TYPES=F16,Q4_0` to choose the weight types).

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use runit_backend_cpu::matmul::{matmul, PackedWeight, Parallelism};
use runit_quant::{quantize, GgmlType};

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

fn bench_matmul(c: &mut Criterion) {
    let threads = std::env::var("RUNIT_BENCH_THREADS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2);
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .expect("thread pool");
    let parallelism = Parallelism::pool(&pool);
    let mut group = c.benchmark_group(format!("matmul_{threads}threads"));
    group
        .sample_size(20)
        .warm_up_time(std::time::Duration::from_millis(500))
        .measurement_time(std::time::Duration::from_secs(2));
    let types: Vec<GgmlType> = match std::env::var("RUNIT_BENCH_TYPES") {
        Ok(list) => list
            .split(',')
            .map(|name| GgmlType::from_name(name.trim()).expect("a GGML type name"))
            .collect(),
        Err(_) => vec![
            GgmlType::Q4_1,
            GgmlType::Q8_0,
            GgmlType::Q4_K,
            GgmlType::Q6_K,
        ],
    };
    for ty in types {
        for (n_in, n_out) in [(576, 1536), (1536, 576)] {
            if n_in % ty.block_size() != 0 {
                continue;
            }
            let row_bytes = ty.row_bytes(n_in as u64).expect("whole blocks") as usize;
            let mut bytes = vec![0u8; row_bytes * n_out];
            quantize(ty, &values(n_in * n_out, 7), &mut bytes).expect("quantizable");
            let weight = PackedWeight::new(ty, &bytes, n_in, n_out);
            for tokens in [1usize, 128] {
                let x = values(tokens * n_in, 11);
                let mut y = vec![0.0f32; tokens * n_out];
                let mut scratch = Vec::new();
                group.throughput(if tokens == 1 {
                    Throughput::Bytes(bytes.len() as u64)
                } else {
                    Throughput::Elements((2 * n_in * n_out * tokens) as u64)
                });
                let id = BenchmarkId::new(format!("{ty}_{n_in}x{n_out}"), format!("{tokens}tok"));
                group.bench_function(id, |b| {
                    b.iter(|| matmul(&weight, &x, tokens, &mut y, &mut scratch, &parallelism))
                });
            }
        }
    }
    group.finish();
}

criterion_group!(benches, bench_matmul);
criterion_main!(benches);
