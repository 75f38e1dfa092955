//! Attention speed on the GPU per KV cache type and kernel, on Qwen2.5-7B's attention shape
//! (28 query heads, 4 KV heads of 128 values): one decode row at depth D, and a prompt chunk
//! of 512 rows after D cached positions.
//!
//! ```text
//! cargo run --release -p runit-backend-cuda --example attention_bench [depth [prompt rows]]
//! ```
//!
//! Caches are filled with random rows (the speed of these kernels does not depend on the
//! values). A decode time is one call's share of a CUDA graph of back-to-back calls (as a
//! captured decode step runs them), so host launch overhead is not included; the bandwidth
//! is the cache bytes of the visible positions (keys and values) over that time. A prompt
//! time is wall-clock over uncaptured calls. TurboQuant caches run every decoder
//! ([`TurboDecode`]) and prefill ([`TurboPrefill`]). `RUNIT_BENCH_KV=f16,tq4` picks the
//! caches (f16, q8_0, tq4, tq (tq4 keys, tq3 values), tq3).

mod common;

use runit_backend::{
    Attention, AttentionParams, BackendError, Buffer, Device, KvCache, KvRole, KvType, KvWrite,
    PrimitiveOps, SequenceSpan, StepInputs, StepKey,
};
use runit_backend_cuda::{CudaBackend, TurboDecode, TurboPrefill};

const HEADS: usize = 28;
const KV_HEADS: usize = 4;
const HEAD_DIM: usize = 128;
const BLOCK_SIZE: usize = 16;
/// Rows written to the caches a call while filling them.
const FILL_ROWS: usize = 2048;

/// Values of a seeded xorshift generator in [-1, 1).
fn random_values(len: usize, mut state: u64) -> Vec<f32> {
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        })
        .collect()
}

fn buffer(cuda: &CudaBackend, values: &[f32]) -> Result<Buffer, BackendError> {
    let mut buffer = cuda.alloc(values.len())?;
    cuda.upload(&mut buffer, values)?;
    Ok(buffer)
}

/// One sequence's span: `rows` rows from `start`, over the whole block table.
fn span(rows: usize, start: usize, table: &[u32]) -> SequenceSpan {
    SequenceSpan {
        first_row: 0,
        rows,
        start_position: start,
        block_table: table.to_vec(),
        block_size: BLOCK_SIZE,
    }
}

/// Writes random rows at positions `from .. to` of the caches.
fn fill(
    cuda: &CudaBackend,
    caches: &mut (KvCache, KvCache),
    table: &[u32],
    from: usize,
    to: usize,
) -> Result<(), BackendError> {
    let width = KV_HEADS * HEAD_DIM;
    let mut at = from;
    while at < to {
        let rows = FILL_ROWS.min(to - at);
        let k = buffer(cuda, &random_values(rows * width, 0x51ed + at as u64))?;
        let v = buffer(cuda, &random_values(rows * width, 0xa11e + at as u64))?;
        let spans = [span(rows, at, table)];
        let (k_cache, v_cache) = caches;
        cuda.kv_write(KvWrite {
            k: &k,
            v: &v,
            k_cache,
            v_cache,
            spans: &spans,
        })?;
        at += rows;
    }
    cuda.synchronize()
}

/// One attention call of `q`'s rows over `caches`.
fn attend(
    cuda: &CudaBackend,
    q: &Buffer,
    (k_cache, v_cache): &(KvCache, KvCache),
    spans: &[SequenceSpan],
    params: &AttentionParams,
    out: &mut Buffer,
) -> Result<(), BackendError> {
    let attention = Attention {
        q,
        k_cache,
        v_cache,
        spans,
        params,
    };
    cuda.attention(&attention, out)
}

/// Seconds per decode attention call of one row at position `depth`, from replays of a graph
/// of back-to-back calls.
fn time_decode(
    cuda: &CudaBackend,
    caches: &(KvCache, KvCache),
    table: &[u32],
    depth: usize,
    params: &AttentionParams,
) -> Result<f64, BackendError> {
    let (calls, replays) = (20, 10);
    let q = buffer(cuda, &random_values(HEADS * HEAD_DIM, 0x9e37))?;
    let mut out = cuda.alloc(HEADS * HEAD_DIM)?;
    let spans = [span(1, depth, table)];
    let positions = [depth as u32];
    let inputs = StepInputs {
        tokens: &[0],
        positions: &positions,
        spans: &spans,
        window_spans: None,
        logit_rows: &[0],
        rows_alone: false,
    };
    let key = StepKey {
        workspace: 0xa77e,
        tokens: 1,
        spans: 1,
        logit_rows: 1,
    };
    let mut body = || {
        for _ in 0..calls {
            attend(cuda, &q, caches, &spans, params, &mut out)?;
        }
        Ok(())
    };
    cuda.begin_step(&inputs)?;
    let result = common::graph_seconds(cuda, key, calls, replays, &mut body);
    cuda.end_step()?;
    result
}

/// Seconds per prefill attention call of `rows` rows from position `depth` (their keys and
/// values already in the caches), wall-clock over uncaptured calls.
fn time_prefill(
    cuda: &CudaBackend,
    caches: &(KvCache, KvCache),
    table: &[u32],
    depth: usize,
    rows: usize,
    params: &AttentionParams,
) -> Result<f64, BackendError> {
    let runs = 5;
    let q = buffer(cuda, &random_values(rows * HEADS * HEAD_DIM, 0x7a11))?;
    let mut out = cuda.alloc(rows * HEADS * HEAD_DIM)?;
    let spans = [span(rows, depth, table)];
    common::wall_seconds(cuda, runs, || {
        attend(cuda, &q, caches, &spans, params, &mut out)
    })
}

/// The caches the bench runs: (name, keys, values).
const CACHES: &[(&str, KvType, KvType)] = &[
    ("f16", KvType::F16, KvType::F16),
    ("q8_0", KvType::Q8_0, KvType::Q8_0),
    ("tq4", KvType::Tq4, KvType::Tq4),
    ("tq", KvType::Tq4, KvType::Tq3),
    ("tq3", KvType::Tq3, KvType::Tq3),
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .map(|a| a.parse())
        .collect::<Result<_, _>>()?;
    let depth = args.first().copied().unwrap_or(16_384);
    let prompt = args.get(1).copied().unwrap_or(512);
    let wanted = std::env::var("RUNIT_BENCH_KV").ok();
    let mut cuda = CudaBackend::new(0)?;
    cuda.warm_up()?;
    let width = KV_HEADS * HEAD_DIM;
    let cells = (depth + prompt + 1).next_multiple_of(BLOCK_SIZE);
    let table: Vec<u32> = (0..(cells / BLOCK_SIZE) as u32).collect();
    let params = AttentionParams {
        heads: HEADS,
        kv_heads: KV_HEADS,
        head_dim: HEAD_DIM,
        scale: 1.0 / (HEAD_DIM as f32).sqrt(),
        sliding_window: None,
    };
    println!(
        "{} ({}), {HEADS} heads, {KV_HEADS} KV heads of {HEAD_DIM}: decode of 1 row at depth {depth}, \
         prefill of {prompt} rows after {depth}",
        cuda.name(),
        cuda.device_name()
    );
    println!("| cache | kernel | decode µs | cache MB | GB/s | prefill ms |");
    println!("|---|---|---:|---:|---:|---:|");
    for &(name, keys, values) in CACHES {
        if wanted
            .as_deref()
            .is_some_and(|list| !list.split(',').any(|w| w == name))
        {
            continue;
        }
        let row_bytes = |ty: KvType, role| ty.row_bytes(width, role).unwrap_or(0);
        let bytes =
            (depth + 1) * (row_bytes(keys, KvRole::Keys) + row_bytes(values, KvRole::Values));
        let mut caches = (
            cuda.alloc_kv(cells, width, HEAD_DIM, keys, KvRole::Keys)?,
            cuda.alloc_kv(cells, width, HEAD_DIM, values, KvRole::Values)?,
        );
        fill(&cuda, &mut caches, &table, 0, depth + prompt)?;
        let kernels: &[(&str, TurboDecode, TurboPrefill)] = if keys.is_turbo() {
            &[
                (
                    "tensor cores",
                    TurboDecode::TensorCores,
                    TurboPrefill::TensorCores,
                ),
                ("codes / tiles", TurboDecode::Codes, TurboPrefill::Tiles),
                ("tiles", TurboDecode::Tiles, TurboPrefill::Tiles),
            ]
        } else {
            &[("default", TurboDecode::TensorCores, TurboPrefill::Tiles)]
        };
        for &(kernel, decode, prefill) in kernels {
            cuda = cuda.with_turbo_decode(decode).with_turbo_prefill(prefill);
            let decode_s = time_decode(&cuda, &caches, &table, depth, &params)?;
            let prefill_s = time_prefill(&cuda, &caches, &table, depth, prompt, &params)?;
            println!(
                "| {name} | {kernel} | {:.2} | {:.2} | {:.0} | {:.3} |",
                decode_s * 1e6,
                bytes as f64 / 1e6,
                bytes as f64 / decode_s / 1e9,
                prefill_s * 1e3
            );
        }
    }
    Ok(())
}
