//! The exact-numerics mode (`CudaBackend::with_exact_numerics`) against the CPU backend, bit
//! for bit: every op the model runs, for every weight type and the paths the CPU takes
//! (`vec_dot`, tinyBLAS, ggml's repack orders; one-chunk and tiled attention), and every row of
//! a pass computed as if alone (speculative verification) equal to a one-row call's.
//!
//! Without a CUDA driver or device the tests print a notice and pass, unless
//! `RUNIT_REQUIRE_GPU=1` (set on the GPU machine), where that fails.

use runit_backend::testing::parity::WEIGHT_TYPES;
use runit_backend::testing::{make_weight_as, Rng};
use runit_backend::{Backend, BackendError, StepInputs, Weight, WeightRole};
use runit_backend_cpu::CpuBackend;
use runit_backend_cuda::CudaBackend;

fn gpu() -> Option<CudaBackend> {
    match CudaBackend::new(0) {
        Ok(cuda) => Some(cuda.with_exact_numerics(true)),
        Err(error) => {
            let require = std::env::var("RUNIT_REQUIRE_GPU").is_ok_and(|v| v == "1");
            assert!(!require, "RUNIT_REQUIRE_GPU=1 but: {error}");
            println!("NOTICE: no CUDA device, exact-numerics tests not run: {error}");
            None
        }
    }
}

fn cpu() -> CpuBackend {
    // Exact numerics repeats the reference machine's arithmetic; a host CPU without AVX-512
    // would otherwise sum F16 rows of one token in llama.cpp's AVX2 order.
    assert!(
        runit_quant::cpu::keep_f16_reference(),
        "the F16 kernels were chosen before the CPU backend"
    );
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get().min(16));
    CpuBackend::new(threads).expect("cpu backend")
}

/// `W · x` for `tokens` rows on `backend`.
fn run_matmul(
    backend: &dyn Backend,
    weight: &Weight,
    x: &[f32],
    tokens: usize,
) -> Result<Vec<f32>, BackendError> {
    let mut input = backend.alloc(x.len())?;
    backend.upload(&mut input, x)?;
    let n_out = weight.rows();
    let mut out = backend.alloc(tokens * n_out)?;
    backend.matmul(weight, &input, tokens, &mut out)?;
    let mut values = vec![0.0; tokens * n_out];
    backend.download(&out, &mut values)?;
    Ok(values)
}

/// The first output whose bits differ, as a message.
fn first_difference(expected: &[f32], found: &[f32]) -> Option<String> {
    if expected.len() != found.len() {
        return Some(format!(
            "{} values, expected {}",
            found.len(),
            expected.len()
        ));
    }
    let differing = expected
        .iter()
        .zip(found)
        .filter(|(e, f)| e.to_bits() != f.to_bits())
        .count();
    let (index, (e, f)) = expected
        .iter()
        .zip(found)
        .enumerate()
        .find(|(_, (e, f))| e.to_bits() != f.to_bits())?;
    Some(format!(
        "{differing} of {} values differ; first at {index}: {f:e} (cpu {e:e})",
        expected.len()
    ))
}

/// Weights that take each of the CPU's matmul paths: a plain 2-D weight (repacked where
/// ggml repacks its type), the token embedding (never repacked), one expert of a 3-D weight
/// (repacked, every row in the gemv order).
const WEIGHTS: [(&str, WeightRole); 3] = [
    ("blk.0.ffn_up.weight", WeightRole::Matrix),
    ("token_embd.weight", WeightRole::TokenEmbedding),
    ("blk.0.ffn_up_exps.weight", WeightRole::StackedExperts),
];

#[test]
fn exact_matmul_equals_the_cpu_bit_for_bit() {
    let Some(cuda) = gpu() else { return };
    let reference = cpu();
    println!("device: {} ({})", cuda.device_name(), cuda.target().arch());
    let mut failures = Vec::new();
    let mut compared = 0;
    for (n_in, n_out) in [(256usize, 64usize), (512, 40), (1024, 24)] {
        for ty in WEIGHT_TYPES {
            if n_in % ty.block_size() != 0 {
                continue;
            }
            for (name, role) in WEIGHTS {
                let experts = usize::from(role == WeightRole::StackedExperts) * 2 + 1;
                let mut rng = Rng::new(0xe8ac + ty.id() as u64 * 11 + n_in as u64 + experts as u64);
                let w = rng.normal(n_in * n_out * experts, 0.05);
                let shape: Vec<usize> = if experts > 1 {
                    vec![n_in, n_out, experts]
                } else {
                    vec![n_in, n_out]
                };
                let load = |backend: &dyn Backend| -> Result<Weight, BackendError> {
                    let weight = make_weight_as(backend, role, name, ty, &shape, &w)?;
                    Ok(if experts > 1 {
                        weight.matrix(1)
                    } else {
                        weight
                    })
                };
                let expected_weight = load(&reference).expect("cpu weight");
                let weight = match load(&cuda) {
                    Ok(weight) => weight,
                    Err(error) => {
                        failures.push(format!("{ty} {shape:?} {name}: {error}"));
                        continue;
                    }
                };
                for tokens in [1usize, 2, 3, 4, 5, 8, 13, 70] {
                    let x = rng.values(tokens * n_in, -1.0, 1.0);
                    let expected =
                        run_matmul(&reference, &expected_weight, &x, tokens).expect("cpu matmul");
                    let label = format!("{ty} [{n_in}, {n_out}] {name} x {tokens}");
                    match run_matmul(&cuda, &weight, &x, tokens) {
                        Ok(found) => {
                            compared += found.len();
                            if let Some(difference) = first_difference(&expected, &found) {
                                failures.push(format!("{label}: {difference}"));
                            }
                        }
                        Err(error) => failures.push(format!("{label}: {error}")),
                    }
                }
            }
        }
    }
    println!(
        "{compared} outputs compared, {} cases failed",
        failures.len()
    );
    assert!(failures.is_empty(), "failures:\n{}", failures.join("\n"));
}

/// `body` inside a step whose rows must each get the numbers of a pass of their own
/// (`StepInputs::rows_alone`, as speculative verification's pass).
fn alone<T>(backend: &dyn Backend, rows: usize, body: impl FnOnce() -> T) -> T {
    let tokens = vec![0u32; rows];
    let positions: Vec<u32> = (0..rows as u32).collect();
    let inputs = StepInputs {
        tokens: &tokens,
        positions: &positions,
        spans: &[],
        window_spans: None,
        logit_rows: &[],
        rows_alone: true,
    };
    backend.begin_step(&inputs).expect("begin_step");
    let result = body();
    backend.end_step().expect("end_step");
    result
}

/// Speculative verification in exact mode: under `rows_alone` each row of an R-row matmul
/// has the bits of a one-row call (R = 1 to 17, every weight type), where the CPU's batched
/// orders (the repacked K-quants' gemm order for groups of four rows, tinyBLAS) would give
/// other bits; the CPU under the same flag gives them too. Session 32 saw greedy speculation
/// part from plain greedy on K-quant files on the H200 when the flag was ignored.
#[test]
fn rows_alone_matmul_rows_equal_one_row_calls() {
    let Some(cuda) = gpu() else { return };
    let reference = cpu();
    // 40 weight rows: a multiple of 8 (ggml repacks the type's weights) and of 4 (tinyBLAS).
    let (n_in, n_out, most) = (512usize, 40usize, 17usize);
    let mut failures = Vec::new();
    for ty in WEIGHT_TYPES {
        if n_in % ty.block_size() != 0 {
            continue;
        }
        let mut rng = Rng::new(0xa10e + ty.id() as u64);
        let w = rng.normal(n_in * n_out, 0.05);
        let x = rng.values(most * n_in, -1.0, 1.0);
        let load = |backend: &dyn Backend| {
            make_weight_as(
                backend,
                WeightRole::Matrix,
                "blk.0.ffn_up.weight",
                ty,
                &[n_in, n_out],
                &w,
            )
        };
        let (weight, cpu_weight) = match (load(&cuda), load(&reference)) {
            (Ok(weight), Ok(cpu_weight)) => (weight, cpu_weight),
            (Err(error), _) | (_, Err(error)) => {
                failures.push(format!("{ty}: {error}"));
                continue;
            }
        };
        let lone: Vec<f32> = (0..most)
            .flat_map(|t| {
                run_matmul(&cuda, &weight, &x[t * n_in..(t + 1) * n_in], 1).expect("one row")
            })
            .collect();
        for rows in 1..=most {
            let x = &x[..rows * n_in];
            let lone = &lone[..rows * n_out];
            let found = alone(&cuda, rows, || run_matmul(&cuda, &weight, x, rows));
            match found {
                Ok(found) => {
                    if let Some(difference) = first_difference(lone, &found) {
                        failures.push(format!("{ty} x {rows} rows alone: {difference}"));
                    }
                }
                Err(error) => failures.push(format!("{ty} x {rows}: {error}")),
            }
            let cpu = alone(&reference, rows, || {
                run_matmul(&reference, &cpu_weight, x, rows)
            })
            .expect("cpu matmul");
            if let Some(difference) = first_difference(&cpu, lone) {
                failures.push(format!(
                    "{ty} x {rows}: one-row calls vs the CPU alone: {difference}"
                ));
            }
        }
    }
    assert!(failures.is_empty(), "failures:\n{}", failures.join("\n"));
}

/// The whole parity suite (every op, every weight type, the attention and MoE cases) in
/// exact mode: every case must come out with an NMSE of exactly zero (and the bad-input
/// checks must still be refused).
#[test]
fn every_parity_case_is_exact() {
    use runit_backend::testing::{run_parity, ParityOutcome};
    use runit_backend_cpu::SimdLevel;
    let Some(cuda) = gpu() else { return };
    let reference = CpuBackend::with_simd(1, SimdLevel::Scalar).expect("scalar backend");
    let report = run_parity(&reference, &cuda);
    println!("{report}");
    let inexact: Vec<String> = report
        .cases
        .iter()
        .filter(|case| !case.ok() || (case.outcome == ParityOutcome::Passed && case.nmse != 0.0))
        .map(|case| {
            format!(
                "{} {} {:?}: nmse {:e} ({:?})",
                case.op, case.detail, case.ty, case.nmse, case.outcome
            )
        })
        .collect();
    let skipped = report.skipped().len();
    println!(
        "{} cases, {} not exact, {skipped} skipped",
        report.cases.len(),
        inexact.len()
    );
    assert!(inexact.is_empty(), "not exact:\n{}", inexact.join("\n"));
}
