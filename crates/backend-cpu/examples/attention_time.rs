//! Wall-clock time of the decode attention op: `ROWS` sequences of `CONTEXT` cached positions
//! each (SmolLM2-135M's heads: 9 query heads, 3 KV heads of 64), one query row per sequence,
//! keys and values of one cache type (f16 unless `KV` names another: `KV=q8_0`). With `LAYERS` caches taken in turn the caches stream from the last-level
//! cache or memory, as a model's layers do; with one they stay in L2.
//!
//! `cargo run --release -p runit-backend-cpu --example attention_time -- [ROWS] [CONTEXT] [LAYERS] [THREADS]`

use std::time::Instant;

use runit_backend::{
    Attention, AttentionParams, Device, KvType, KvWrite, PrimitiveOps, SequenceSpan,
};
use runit_backend_cpu::CpuBackend;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let arg = |i: usize, default: &str| -> usize {
        args.get(i)
            .map_or(default, String::as_str)
            .parse()
            .expect("a number")
    };
    let (rows, context, layers, threads) = (arg(0, "8"), arg(1, "70"), arg(2, "30"), arg(3, "2"));
    let (heads, kv_heads, head_dim, block_size) = (9, 3, 64, 16);
    let kv_width = kv_heads * head_dim;
    let blocks_per_sequence = (context + 1).div_ceil(block_size);
    let cells = rows * blocks_per_sequence * block_size;
    let kv_type: KvType = std::env::var("KV")
        .map_or(Ok(KvType::F16), |name| name.parse())
        .expect("a KV cache type");
    let backend = CpuBackend::new(threads).expect("backend");
    let mut rng = runit_backend::testing::Rng::new(0x1234_5678);
    let mut values = |n: usize| rng.values(n, -0.5, 0.5);
    // Sequences' blocks interleaved through the cache, as a server's allocator leaves them.
    let spans: Vec<SequenceSpan> = (0..rows)
        .map(|r| SequenceSpan {
            first_row: r,
            rows: 1,
            start_position: context,
            block_table: (0..blocks_per_sequence)
                .map(|b| (b * rows + r) as u32)
                .collect(),
            block_size,
        })
        .collect();
    let caches: Vec<_> = (0..layers)
        .map(|_| {
            let mut k = backend
                .alloc_kv(
                    cells,
                    kv_width,
                    head_dim,
                    kv_type,
                    runit_backend::KvRole::Keys,
                )
                .expect("cache");
            let mut v = backend
                .alloc_kv(
                    cells,
                    kv_width,
                    head_dim,
                    kv_type,
                    runit_backend::KvRole::Values,
                )
                .expect("cache");
            let mut kb = backend.alloc(cells * kv_width).expect("buffer");
            let mut vb = backend.alloc(cells * kv_width).expect("buffer");
            backend
                .upload(&mut kb, &values(cells * kv_width))
                .expect("upload");
            backend
                .upload(&mut vb, &values(cells * kv_width))
                .expect("upload");
            let all = [SequenceSpan {
                first_row: 0,
                rows: cells,
                start_position: 0,
                block_table: (0..cells / block_size).map(|b| b as u32).collect(),
                block_size,
            }];
            let write = KvWrite {
                k: &kb,
                v: &vb,
                k_cache: &mut k,
                v_cache: &mut v,
                spans: &all,
            };
            backend.kv_write(write).expect("kv write");
            (k, v)
        })
        .collect();
    let mut q = backend.alloc(rows * heads * head_dim).expect("buffer");
    backend
        .upload(&mut q, &values(rows * heads * head_dim))
        .expect("upload");
    let mut out = backend.alloc(rows * heads * head_dim).expect("buffer");
    let params = AttentionParams {
        heads,
        kv_heads,
        head_dim,
        scale: 0.125,
        sliding_window: None,
    };
    // `FLUSH=1`: stream 128 MB between calls, as a model's weights pass through the caches
    // between its layers' attention.
    let flush: Option<Vec<u64>> = std::env::var_os("FLUSH").map(|_| vec![1u64; 16 << 20]);
    let mut best = f64::MAX;
    for _ in 0..9 {
        let mut elapsed = 0.0;
        for _ in 0..10 {
            for (k, v) in &caches {
                if let Some(flush) = &flush {
                    let sum: u64 = flush.iter().step_by(8).sum();
                    std::hint::black_box(sum);
                }
                let attention = Attention {
                    q: &q,
                    k_cache: k,
                    v_cache: v,
                    spans: &spans,
                    params: &params,
                };
                let start = Instant::now();
                backend.attention(&attention, &mut out).expect("attention");
                elapsed += start.elapsed().as_secs_f64();
            }
        }
        best = best.min(elapsed / (10 * layers) as f64);
    }
    let keys = rows * (context + 1);
    println!(
        "{kv_type} {rows} rows x {} keys, {layers} caches, {threads} threads: {:.1} us per call, {:.1} ns per key (all heads)",
        context + 1,
        best * 1e6,
        best * 1e9 / keys as f64
    );
}
