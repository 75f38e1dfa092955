//! The CUDA mixture-of-experts FFN (`moe_ffn`: routing on the device, expert matvecs that
//! read their expert from device memory up to 8 rows, host grouping of the routing table
//! above) against the trait's host-routed default on the same GPU and against the CPU
//! backend: every weight type, 4 and 8 experts, with and without renormalisation, row counts
//! on both sides of the decode bound, tied router logits, and a captured decode step replayed
//! with new inputs.
//!
//! Without a CUDA driver or device every test prints a notice and passes, unless
//! `RUNIT_REQUIRE_GPU=1` (set on the GPU machine), where that fails.

use runit_backend::testing::parity::{MATMUL_BOUND, WEIGHT_TYPES};
use runit_backend::testing::{nmse, LoadedMoe, MoeCase, MoeWorkspace, Rng};
use runit_backend::{Backend, BackendError, Device, FusedOps, StepInputs, StepKey};
use runit_backend_cpu::CpuBackend;
use runit_backend_cuda::CudaBackend;
use runit_quant::GgmlType;

/// Row counts on both sides of the device path's bound (8).
const TOKEN_COUNTS: [usize; 6] = [1, 2, 5, 8, 17, 40];

/// NMSE bound against the host-routed path on the same GPU where both take the same matmul
/// kernels: the same kernels sum the same products, only the softmax's exponentials may differ
/// in the last bit.
const SAME_DEVICE_BOUND: f64 = 1e-9;

/// The bound against the host-routed path for `tokens` rows. Both paths run each expert's
/// rows through the matvecs at one row and through the batched kernels above the matvecs'
/// limit (8); between them the device path keeps the matvecs (its expert groups are
/// gathered rows) while the host-routed path's per-expert matmuls of 2-8 rows take the
/// pipelined tensor-core kernels (f16 activations, from `RUNIT_CUDA_MMQP_MIN`, default 2),
/// so there the two differ as two correct kernels do, and the CPU's bound applies.
/// `scripts/gpu_check.sh` runs this file again with `RUNIT_CUDA_MMQP_MIN=9`, where every
/// row count takes the same kernels on both paths and the tight bound holds throughout.
fn same_device_bound(tokens: usize) -> f64 {
    let pipe_min = std::env::var("RUNIT_CUDA_MMQP_MIN")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .unwrap_or(2);
    if tokens == 1 || tokens > 8 || tokens < pipe_min {
        SAME_DEVICE_BOUND
    } else {
        MATMUL_BOUND
    }
}

fn gpu() -> Option<CudaBackend> {
    match CudaBackend::new(0) {
        Ok(cuda) => Some(cuda),
        Err(error) => {
            let require = std::env::var("RUNIT_REQUIRE_GPU").is_ok_and(|v| v == "1");
            assert!(!require, "RUNIT_REQUIRE_GPU=1 but: {error}");
            println!("NOTICE: no CUDA device, MoE GPU tests not run: {error}");
            None
        }
    }
}

fn cpu() -> CpuBackend {
    CpuBackend::new(4).expect("cpu backend")
}

/// `(embd, ff)` shapes for a type: small, and for the types with long-row or warp-per-row
/// variants shapes that take them (Q8_0's long rows from 2048, the float kernels' warp rows
/// for 4096-row down matrices of short rows); unaligned float rows take the element-wise one.
fn shapes(ty: GgmlType) -> Vec<(usize, usize)> {
    let mut shapes = vec![(256, 256)];
    match ty {
        GgmlType::Q8_0 => shapes.push((4096, 512)),
        GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => shapes.extend([(4096, 512), (100, 36)]),
        _ => {}
    }
    shapes
}

/// `(experts, used, renormalise)`.
const ROUTINGS: [(usize, usize, bool); 4] =
    [(4, 2, false), (4, 2, true), (8, 2, true), (8, 3, false)];

/// `moe_ffn` of `x` on `backend` (or its default sequence when `primitive`).
fn run(
    backend: &dyn Backend,
    moe: &LoadedMoe,
    x: &[f32],
    tokens: usize,
    primitive: bool,
) -> Result<Vec<f32>, BackendError> {
    let mut workspace = MoeWorkspace::new(backend, moe, tokens)?;
    backend.upload(&mut workspace.x, x)?;
    workspace.run(backend, moe, tokens, primitive)?;
    workspace.output(backend, tokens)
}

/// Compares `moe_ffn` on the GPU with the GPU's host-routed default and with the CPU for
/// every token count; failures are collected in `failures`.
fn compare(
    cuda: &CudaBackend,
    cpu: &CpuBackend,
    case: &MoeCase,
    inputs: &dyn Fn(&mut Rng, usize) -> Vec<f32>,
    with_cpu: bool,
    failures: &mut Vec<String>,
) {
    let loaded = case.load(cuda).and_then(|g| Ok((g, case.load(cpu)?)));
    let (on_gpu, on_cpu) = match loaded {
        Ok(pair) => pair,
        Err(error) => return failures.push(format!("{}: loading: {error}", case.describe(0))),
    };
    let mut rng = Rng::new(0x3e0 + case.ty.id() as u64 + case.embd as u64);
    for tokens in TOKEN_COUNTS {
        let label = format!("{} {}", case.ty, case.describe(tokens));
        let x = inputs(&mut rng, tokens);
        let device = run(cuda, &on_gpu, &x, tokens, false);
        let host_routed = run(cuda, &on_gpu, &x, tokens, true);
        let (device, host_routed) = match (device, host_routed) {
            (Ok(d), Ok(h)) => (d, h),
            (d, h) => {
                failures.push(format!("{label}: {:?} / {:?}", d.err(), h.err()));
                continue;
            }
        };
        let same = nmse(&host_routed, &device);
        if same > same_device_bound(tokens) {
            failures.push(format!(
                "{label}: nmse {same:e} against the host-routed path"
            ));
        }
        if with_cpu {
            match run(cpu, &on_cpu, &x, tokens, false) {
                Ok(reference) => {
                    let error = nmse(&reference, &device);
                    if error > MATMUL_BOUND {
                        failures.push(format!("{label}: nmse {error:e} against the CPU"));
                    }
                }
                Err(error) => failures.push(format!("{label}: cpu: {error}")),
            }
        }
    }
}

#[test]
fn moe_ffn_matches_the_host_routed_path_and_the_cpu() {
    let Some(cuda) = gpu() else { return };
    let cpu = cpu();
    let mut failures = Vec::new();
    for ty in WEIGHT_TYPES {
        for (embd, ff) in shapes(ty) {
            for (experts, used, renormalise) in ROUTINGS {
                let seed = 0x30e + ty.id() as u64 * 97 + (embd * experts + used) as u64;
                let case = MoeCase::new(seed, ty, (embd, ff), (experts, used), renormalise);
                compare(
                    &cuda,
                    &cpu,
                    &case,
                    &|rng, t| case.inputs(rng, t),
                    true,
                    &mut failures,
                );
            }
        }
    }
    assert!(failures.is_empty(), "failures:\n{}", failures.join("\n"));
}

#[test]
fn a_quantized_router_routes_as_the_host_does() {
    // Realistic logits from a Q8_0 (and an F16) router: the GPU's routing of its own logits
    // against route_tokens on the same logits read back.
    let Some(cuda) = gpu() else { return };
    let cpu = cpu();
    let mut failures = Vec::new();
    for (ty, router_ty) in [
        (GgmlType::Q4_K, GgmlType::Q8_0),
        (GgmlType::Q8_0, GgmlType::F16),
    ] {
        for (experts, used, renormalise) in [(8, 2, false), (64, 8, true)] {
            let embd = 256;
            let case = MoeCase::new(
                0x7a + experts as u64,
                ty,
                (embd, 256),
                (experts, used),
                renormalise,
            )
            .with_random_router(0x7b, router_ty);
            let inputs = |rng: &mut Rng, t: usize| rng.values(t * embd, -1.0, 1.0);
            compare(&cuda, &cpu, &case, &inputs, false, &mut failures);
        }
    }
    assert!(failures.is_empty(), "failures:\n{}", failures.join("\n"));
}

#[test]
fn tied_logits_go_to_the_lower_expert_as_on_the_host() {
    // The exact router's logits are the first values of each row: plant ties in them. Every
    // expert has its own weights, so a wrongly broken tie changes the row's output.
    let Some(cuda) = gpu() else { return };
    let cpu = cpu();
    let mut failures = Vec::new();
    for (experts, used) in [(4, 2), (8, 2), (8, 3)] {
        let case = MoeCase::new(0x71e, GgmlType::Q8_0, (256, 256), (experts, used), true);
        let inputs = |rng: &mut Rng, tokens: usize| {
            let mut x = case.inputs(rng, tokens);
            for (t, row) in x.chunks_mut(256).enumerate() {
                let logits = &mut row[..experts];
                // The untied logits below 1, the planted ones above.
                for value in logits.iter_mut() {
                    *value *= 0.5;
                }
                match t % 4 {
                    // Experts 1, 2 and 3 tie for the top.
                    0 => logits[1..4].fill(1.75),
                    // Every expert ties.
                    1 => logits.fill(0.5),
                    // Expert 0 leads; 2 and 3 tie for the second place.
                    2 => {
                        logits[0] = 1.95;
                        logits[2..4].fill(1.5);
                    }
                    // The last two tie for the top.
                    _ => logits[experts - 2..].fill(1.25),
                }
            }
            x
        };
        compare(&cuda, &cpu, &case, &inputs, true, &mut failures);
    }
    assert!(failures.is_empty(), "failures:\n{}", failures.join("\n"));
}

#[test]
fn a_captured_moe_decode_step_replays_with_new_inputs() {
    // One row per sequence (decode): the first pass of a key runs op by op, the second is
    // captured, later ones replay the graph. Each pass gets new inputs (so new experts) and
    // must equal an uncaptured call bit for bit.
    let Some(cuda) = gpu() else { return };
    assert!(cuda.moe_ffn_on_device(1) && cuda.moe_ffn_on_device(8));
    assert!(!cuda.moe_ffn_on_device(9));
    let mut failures = Vec::new();
    for (index, (ty, tokens)) in [(GgmlType::Q4_K, 1), (GgmlType::F16, 4), (GgmlType::Q8_0, 8)]
        .into_iter()
        .enumerate()
    {
        let case = MoeCase::new(0xca9 + index as u64, ty, (256, 256), (8, 2), true);
        let moe = case.load(&cuda).expect("weights");
        let mut captured = MoeWorkspace::new(&cuda, &moe, tokens).expect("workspace");
        let mut rng = Rng::new(0xcaa);
        let ids = vec![0u32; tokens];
        let positions = vec![0u32; tokens];
        let logit_rows: Vec<u32> = (0..tokens as u32).collect();
        let inputs = StepInputs {
            tokens: &ids,
            positions: &positions,
            spans: &[],
            window_spans: None,
            logit_rows: &logit_rows,
            rows_alone: false,
        };
        let key = StepKey {
            workspace: 0x0e00 + index as u64,
            tokens,
            spans: 0,
            logit_rows: tokens,
        };
        for step in 0..4 {
            let label = format!("{ty} x {tokens} step {step}");
            let x = case.inputs(&mut rng, tokens);
            let mut pass = || -> Result<Vec<f32>, BackendError> {
                cuda.upload(&mut captured.x, &x)?;
                cuda.begin_step(&inputs)?;
                let result =
                    cuda.run_captured(key, &mut || captured.run(&cuda, &moe, tokens, false));
                cuda.end_step()?;
                result?;
                captured.output(&cuda, tokens)
            };
            let got = match pass() {
                Ok(values) => values,
                Err(error) => {
                    failures.push(format!("{label}: {error}"));
                    continue;
                }
            };
            let expected = run(&cuda, &moe, &x, tokens, false).expect("uncaptured moe_ffn");
            let same = got
                .iter()
                .zip(&expected)
                .all(|(a, b)| a.to_bits() == b.to_bits());
            if !same {
                failures.push(format!(
                    "{label}: nmse {:e} against uncaptured",
                    nmse(&expected, &got)
                ));
            }
        }
    }
    assert!(failures.is_empty(), "failures:\n{}", failures.join("\n"));
}
