//! Times matmul per weight type on adapter 0: the per-type kernels against the generic
//! (value-by-value) kernel, alternated, at one token (decode) and at a prompt's tokens, and at
//! one token the matrix-vector kernels on f32 activations against those on int8 ones (the
//! types of `MATVEC_INT8_TYPES`), and Q6_K's staged kernel against its in-place one; and
//! first the host's cost of recording one small dispatch (a `scale` of 64 values). With
//! `RUNIT_WGPU_PROFILE=1` the backends print each kernel's device time when they close
//! (`matvec_TYPE..._int8` the int8 kernels, `..._staged` Q6_K's staged ones).
//!
//! `cargo run --release -p runit-backend-wgpu --example matmul_speed -- [ROWS COLS [TOKENS]]`

use std::time::Instant;

use runit_backend::testing::make_weight;
use runit_backend::{Backend, BackendError, Device, PrimitiveOps};
use runit_backend_wgpu::{thread_cpu_ns, WgpuBackend};
use runit_quant::GgmlType;

/// Seconds per matmul of `tokens` rows, the best of a few batches after a warm-up.
fn time(
    backend: &WgpuBackend,
    ty: GgmlType,
    shape: [usize; 2],
    tokens: usize,
) -> Result<f64, BackendError> {
    let [n_in, n_out] = shape;
    let values: Vec<f32> = (0..n_in * n_out)
        .map(|i| ((i * 7919 % 1000) as f32 / 500.0) - 1.0)
        .collect();
    let weight = make_weight(backend as &dyn Backend, "speed", ty, &shape, &values)?;
    let mut x = backend.alloc(tokens * n_in)?;
    let input: Vec<f32> = (0..tokens * n_in)
        .map(|i| ((i * 31 % 97) as f32 / 48.0) - 1.0)
        .collect();
    backend.upload(&mut x, &input)?;
    let mut out = backend.alloc(tokens * n_out)?;
    backend.matmul(&weight, &x, tokens, &mut out)?;
    backend.synchronize()?;
    let repeats = 8;
    let mut best = f64::INFINITY;
    for _ in 0..3 {
        let start = Instant::now();
        for _ in 0..repeats {
            backend.matmul(&weight, &x, tokens, &mut out)?;
        }
        backend.synchronize()?;
        best = best.min(start.elapsed().as_secs_f64() / repeats as f64);
    }
    Ok(best)
}

/// Dispatches [`record_small`] records.
const SMALL_DISPATCHES: usize = 20_000;

/// Microseconds per dispatch of [`SMALL_DISPATCHES`] small `scale`s (64 values): wall time
/// to record them, the recording thread's CPU time (where the system tells it), and wall
/// time to record and run them.
fn record_small(backend: &WgpuBackend) -> Result<[Option<f64>; 3], BackendError> {
    let mut small = backend.alloc(64)?;
    backend.upload(&mut small, &[1.0; 64])?;
    backend.synchronize()?;
    let start = Instant::now();
    let cpu_start = thread_cpu_ns();
    for _ in 0..SMALL_DISPATCHES {
        backend.scale(&mut small, 1.0, 64)?;
    }
    let recorded = start.elapsed().as_secs_f64();
    let cpu = cpu_start
        .zip(thread_cpu_ns())
        .map(|(a, b)| (b - a) as f64 * 1e-9);
    backend.synchronize()?;
    let total = start.elapsed().as_secs_f64();
    let per = |seconds: f64| seconds / SMALL_DISPATCHES as f64 * 1e6;
    Ok([Some(per(recorded)), cpu.map(per), Some(per(total))])
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let shape = [
        args.first().copied().unwrap_or(2048),
        args.get(1).copied().unwrap_or(2048),
    ];
    let prompt = args.get(2).copied().unwrap_or(32);
    let fast = WgpuBackend::new(0)?;
    let generic = WgpuBackend::new(0)?.with_generic_matmul();
    let f32_input = WgpuBackend::new(0)?.with_matvec_int8(None);
    println!(
        "adapter: {}, subgroup sums: {}",
        fast.adapter(),
        fast.uses_subgroups()
    );
    // Recording cost, bind groups reused across batches (new) or made per dispatch (old),
    // alternated.
    let old_way = WgpuBackend::new(0)?.without_bind_group_reuse();
    for round in 0..3 {
        for (name, backend) in [("old", &old_way), ("new", &fast)] {
            let [recorded, cpu, total] = record_small(backend)?.map(|us| us.unwrap_or(f64::NAN));
            println!(
                "host ({name}, round {round}): {recorded:.2} us to record a dispatch \
                 ({cpu:.2} us of the recording thread's CPU time); {total:.2} us each with the \
                 device's work ({SMALL_DISPATCHES} in a row)"
            );
        }
    }
    println!(
        "[{}x{}] weights; ms per matmul (weight GB/s)",
        shape[1], shape[0]
    );
    println!(
        "type    tokens  generic          per-type         speed-up  f32 x (int8 x: per-type)"
    );
    for ty in runit_backend_wgpu::MATVEC_TYPES {
        let bytes = ty.row_bytes(shape[0] as u64).unwrap_or(0) as f64 * shape[1] as f64;
        for tokens in [1, prompt] {
            let old = time(&generic, ty, shape, tokens)?;
            let new = time(&fast, ty, shape, tokens)?;
            let int8 = tokens == 1 && runit_backend_wgpu::MATVEC_INT8_TYPES.contains(&ty);
            let f32_x = match int8 {
                true => {
                    let f32_x = time(&f32_input, ty, shape, tokens)?;
                    format!("{:>7.3} ({:>5.2})", f32_x * 1e3, bytes / f32_x / 1e9)
                }
                false => String::new(),
            };
            println!(
                "{:<7} {tokens:>6}  {:>7.3} ({:>5.2})  {:>7.3} ({:>5.2})  {:>5.2}x  {f32_x}",
                format!("{ty:?}"),
                old * 1e3,
                bytes / old / 1e9,
                new * 1e3,
                bytes / new / 1e9,
                old / new
            );
        }
    }
    // Q6_K at one token with its rows read in place (the default) and staged through
    // workgroup memory (`RUNIT_WGPU_Q6K_ALIGNED=1`), alternated.
    let in_place = WgpuBackend::new(0)?.with_q6_k_staged(false);
    let staged = WgpuBackend::new(0)?.with_q6_k_staged(true);
    let ty = GgmlType::Q6_K;
    let bytes = ty.row_bytes(shape[0] as u64).unwrap_or(0) as f64 * shape[1] as f64;
    for round in 0..3 {
        for (name, backend) in [("in place", &in_place), ("staged", &staged)] {
            let seconds = time(backend, ty, shape, 1)?;
            println!(
                "Q6_K x 1 {name} (round {round}): {:.3} ms ({:.2} GB/s)",
                seconds * 1e3,
                bytes / seconds / 1e9
            );
        }
    }
    Ok(())
}
