//! Matmul speed on the GPU, per weight type: the decode matvec's weight bandwidth (GB/s) and
//! the prompt GEMM's TFLOP/s.
//!
//! ```text
//! cargo run --release -p runit-backend-cuda --example matmul_bench [n_in n_out [runs]]
//! ```
//!
//! The default weight is 4096 x 14336 (a LLaMA-3-8B FFN matrix); weights are random bytes (the
//! speed of these kernels does not depend on the values). Times are wall-clock over `runs`
//! back-to-back calls (default 200) after a warm-up, synchronized once at the end, so launch
//! overhead is included as it is in an uncaptured decode step.

use std::sync::Arc;
use std::time::Instant;

use runit_backend::testing::parity::WEIGHT_TYPES;
use runit_backend::{Backend, BackendError, HostMemory};
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

/// Seconds per call of `body`, over `runs` calls after three warm-up calls.
fn time(
    backend: &CudaBackend,
    runs: usize,
    mut body: impl FnMut() -> Result<(), BackendError>,
) -> Result<f64, BackendError> {
    for _ in 0..3 {
        body()?;
    }
    backend.synchronize()?;
    let start = Instant::now();
    for _ in 0..runs {
        body()?;
    }
    backend.synchronize()?;
    Ok(start.elapsed().as_secs_f64() / runs as f64)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .map(|a| a.parse())
        .collect::<Result<_, _>>()?;
    let (n_in, n_out) = match args.as_slice() {
        [n_in, n_out, ..] => (*n_in, *n_out),
        _ => (4096, 14336),
    };
    let runs = args.get(2).copied().unwrap_or(200);
    let prompt_tokens = 512;

    let cuda = CudaBackend::new(0)?;
    cuda.warm_up()?;
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
        let row_bytes = ty
            .row_bytes(n_in as u64)
            .ok_or_else(|| format!("{n_in} is not a whole number of {ty} blocks"))?
            as usize;
        let bytes = random_bytes(row_bytes * n_out, 0x9e37_79b9 + ty.id() as u64);
        let len = bytes.len();
        let memory: Arc<dyn HostMemory> = Arc::new(bytes);
        let weight = cuda.load_weight("bench.weight", ty, &[n_in, n_out], memory, 0..len)?;

        let matvec = time(&cuda, runs, || cuda.matmul(&weight, &x, 1, &mut out))?;
        let eight = time(&cuda, runs, || cuda.matmul(&weight, &x, 8, &mut out))?;
        let gemm_runs = (runs / 10).max(5);
        let gemm = time(&cuda, gemm_runs, || {
            cuda.matmul(&weight, &x, prompt_tokens, &mut out)
        })?;
        let flops = 2.0 * prompt_tokens as f64 * n_in as f64 * n_out as f64;
        println!(
            "{:<8} {:>10.1} {:>12.1} {:>10.0} {:>12.1} {:>12.1}",
            ty_name(ty),
            len as f64 / (1 << 20) as f64,
            matvec * 1e6,
            len as f64 / matvec / 1e9,
            eight * 1e6,
            flops / gemm / 1e12
        );
    }
    Ok(())
}

fn ty_name(ty: GgmlType) -> String {
    format!("{ty}")
}
