//! Matmul speed on the GPU, per weight type: the decode matvec's weight bandwidth (GB/s) and
//! the prompt GEMM's TFLOP/s.
//!
//! ```text
//! cargo run --release -p runit-backend-cuda --example matmul_bench [n_in n_out [runs]]
//! ```
//!
//! Without arguments: the decode table, i.e. the matvec (1 and 8 token rows) on the matrix
//! shapes of Qwen2.5-7B and Qwen2.5-0.5B (`RUNIT_BENCH_TYPES=Q4_K,Q8_0` picks the types).
//! Each time is one call's share of a CUDA graph of back-to-back calls (as a captured decode
//! step runs them), so host launch overhead is not included.
//!
//! With a shape: every type on that weight (`n_out` rows of `n_in`), wall-clock over `runs`
//! back-to-back uncaptured calls (default 200) after a warm-up, with the 8-row matvec and
//! the 512-row GEMM. Weights are random bytes (the speed of these kernels does not depend on
//! the values).

mod common;

use std::sync::Arc;

use runit_backend::testing::parity::WEIGHT_TYPES;
use runit_backend::{
    BackendError, Buffer, Device, HostMemory, PrimitiveOps, StepKey, Weight, WeightRole,
    WeightSource,
};
use runit_backend_cuda::CudaBackend;
use runit_quant::GgmlType;

/// Random bytes from a seeded xorshift generator.
fn random_bytes(len: usize, mut state: u64) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(len + 8);
    while bytes.len() < len {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        bytes.extend_from_slice(&state.to_le_bytes());
    }
    bytes.truncate(len);
    bytes
}

/// Seconds per matmul of `tokens` rows, from replays of a graph of `calls` back-to-back calls.
fn time_graph(
    cuda: &CudaBackend,
    key: StepKey,
    weight: &Weight,
    x: &Buffer,
    tokens: usize,
    out: &mut Buffer,
) -> Result<f64, BackendError> {
    let (calls, replays) = (20, 10);
    let mut body = || {
        for _ in 0..calls {
            cuda.matmul(weight, x, tokens, out)?;
        }
        Ok(())
    };
    common::graph_seconds(cuda, key, calls, replays, &mut body)
}

/// A weight of random bytes.
fn random_weight(
    cuda: &CudaBackend,
    ty: GgmlType,
    n_in: usize,
    n_out: usize,
) -> Result<(Weight, usize), Box<dyn std::error::Error>> {
    let row_bytes = ty
        .row_bytes(n_in as u64)
        .ok_or_else(|| format!("{n_in} is not a whole number of {ty} blocks"))?
        as usize;
    let bytes = random_bytes(row_bytes * n_out, 0x9e37_79b9 + ty.id() as u64);
    let len = bytes.len();
    let memory: Arc<dyn HostMemory> = Arc::new(bytes);
    let weight = cuda.load_weight(WeightSource {
        name: "bench.weight",
        role: WeightRole::Matrix,
        ty,
        shape: &[n_in, n_out],
        memory,
        range: 0..len,
    })?;
    Ok((weight, len))
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .map(|a| a.parse())
        .collect::<Result<_, _>>()?;
    let cuda = CudaBackend::new(0)?;
    cuda.warm_up()?;
    match args.as_slice() {
        [n_in, n_out, rest @ ..] => shape_table(&cuda, *n_in, *n_out, rest.first().copied()),
        _ => decode_table(&cuda),
    }
}

/// The decode shapes: (model, n_in, n_out, types to time; empty = every type).
const DECODE_SHAPES: &[(&str, usize, usize, &[GgmlType])] = {
    use GgmlType::*;
    const SMALL: &[GgmlType] = &[Q8_0, Q4_0, F16];
    &[
        ("7B up", 3584, 18944, &[]),
        ("7B down", 18944, 3584, &[Q4_K, Q6_K, Q8_0, Q4_0, Q5_K, F16]),
        ("7B q/o", 3584, 3584, &[Q4_K, Q6_K, Q8_0, F16]),
        ("7B k/v", 3584, 512, &[Q4_K, Q6_K, Q8_0, F16]),
        ("7B out", 3584, 152_064, &[Q6_K, Q8_0]),
        ("0.5B q/o", 896, 896, SMALL),
        ("0.5B k/v", 896, 128, SMALL),
        ("0.5B up", 896, 4864, SMALL),
        ("0.5B down", 4864, 896, SMALL),
        ("0.5B out", 896, 151_936, &[Q8_0, Q4_0, F16]),
    ]
};

fn decode_table(cuda: &CudaBackend) -> Result<(), Box<dyn std::error::Error>> {
    let wanted: Option<Vec<String>> = std::env::var("RUNIT_BENCH_TYPES")
        .ok()
        .map(|v| v.split(',').map(|s| s.trim().to_uppercase()).collect());
    println!(
        "device: {} ({}), matvec per call inside a CUDA graph",
        cuda.device_name(),
        cuda.target().arch()
    );
    println!(
        "{:<10} {:>6} {:>7} {:<7} {:>8} {:>9} {:>7} {:>9} {:>7}",
        "shape", "n_in", "n_out", "type", "MiB", "t1 µs", "GB/s", "t8 µs", "GB/s"
    );
    let max_in = DECODE_SHAPES.iter().map(|s| s.1).max().unwrap_or(0);
    let max_out = DECODE_SHAPES.iter().map(|s| s.2).max().unwrap_or(0);
    let tokens = 8;
    let activations: Vec<f32> = random_bytes(tokens * max_in * 4, 7)
        .chunks_exact(4)
        .map(|b| (u32::from_le_bytes([b[0], b[1], b[2], b[3]]) >> 8) as f32 / 8_388_608.0 - 1.0)
        .collect();
    let mut x = cuda.alloc(tokens * max_in)?;
    cuda.upload(&mut x, &activations)?;
    let mut out = cuda.alloc(tokens * max_out)?;
    let mut workspace = 0x6265_6e63_6800;
    for &(label, n_in, n_out, types) in DECODE_SHAPES {
        let types: Vec<GgmlType> = if types.is_empty() {
            WEIGHT_TYPES.to_vec()
        } else {
            types.to_vec()
        };
        for ty in types {
            if let Some(wanted) = &wanted {
                if !wanted.contains(&ty.to_string().to_uppercase()) {
                    continue;
                }
            }
            let (weight, len) = random_weight(cuda, ty, n_in, n_out)?;
            let mut per_tokens = [0.0; 2];
            for (slot, tokens) in [1usize, 8].into_iter().enumerate() {
                workspace += 1;
                let key = StepKey {
                    workspace,
                    tokens,
                    spans: 1,
                    logit_rows: 0,
                };
                per_tokens[slot] = time_graph(cuda, key, &weight, &x, tokens, &mut out)?;
            }
            println!(
                "{:<10} {:>6} {:>7} {:<7} {:>8.1} {:>9.2} {:>7.0} {:>9.2} {:>7.0}",
                label,
                n_in,
                n_out,
                ty.to_string(),
                len as f64 / (1 << 20) as f64,
                per_tokens[0] * 1e6,
                len as f64 / per_tokens[0] / 1e9,
                per_tokens[1] * 1e6,
                len as f64 / per_tokens[1] / 1e9,
            );
        }
    }
    Ok(())
}

fn shape_table(
    cuda: &CudaBackend,
    n_in: usize,
    n_out: usize,
    runs: Option<usize>,
) -> Result<(), Box<dyn std::error::Error>> {
    let runs = runs.unwrap_or(200);
    let prompt_tokens = 512;
    println!(
        "device: {} ({}), weight {n_out} x {n_in}, {runs} runs",
        cuda.device_name(),
        cuda.target().arch()
    );
    let activations: Vec<f32> = random_bytes(prompt_tokens * n_in * 4, 7)
        .chunks_exact(4)
        .map(|b| (u32::from_le_bytes([b[0], b[1], b[2], b[3]]) >> 8) as f32 / 8_388_608.0 - 1.0)
        .collect();
    let mut x = cuda.alloc(prompt_tokens * n_in)?;
    cuda.upload(&mut x, &activations)?;
    let mut out = cuda.alloc(prompt_tokens * n_out)?;

    println!(
        "{:<8} {:>10} {:>12} {:>10} {:>12} {:>12}",
        "type", "MiB", "matvec µs", "GB/s", "8-row µs", "pp512 TFLOP/s"
    );
    for ty in WEIGHT_TYPES {
        let (weight, len) = random_weight(cuda, ty, n_in, n_out)?;
        let matvec = common::wall_seconds(cuda, runs, || cuda.matmul(&weight, &x, 1, &mut out))?;
        let eight = common::wall_seconds(cuda, runs, || cuda.matmul(&weight, &x, 8, &mut out))?;
        let gemm_runs = (runs / 10).max(5);
        let gemm = common::wall_seconds(cuda, gemm_runs, || {
            cuda.matmul(&weight, &x, prompt_tokens, &mut out)
        })?;
        let flops = 2.0 * prompt_tokens as f64 * n_in as f64 * n_out as f64;
        println!(
            "{:<8} {:>10.1} {:>12.1} {:>10.0} {:>12.1} {:>12.1}",
            ty.to_string(),
            len as f64 / (1 << 20) as f64,
            matvec * 1e6,
            len as f64 / matvec / 1e9,
            eight * 1e6,
            flops / gemm / 1e12
        );
    }
    Ok(())
}
