//! Matmul and embedding on the GPU against the CPU backend, for every weight type: the decode
//! matvec (1, 3 and 8 token rows; rows whose bytes are not 16-byte aligned, and the shapes
//! that pick each float variant), the batched tensor-core kernels (9 to 16 rows, odd shapes,
//! ranges of the row length split over blocks, biases), the GEMM path (17 to 300 rows), an
//! expert view of a 3-D weight, and embedding lookups.
//!
//! Without a CUDA driver or device the tests print a notice and pass, unless
//! `RUNIT_REQUIRE_GPU=1` (set on the GPU machine), where that fails.

use runit_backend::testing::parity::{ELEMENTWISE_BOUND, MATMUL_BOUND, WEIGHT_TYPES};
use runit_backend::testing::{make_weight, nmse, Rng};
use runit_backend::{Backend, BackendError, Projection, Weight};
use runit_backend_cpu::CpuBackend;
use runit_backend_cuda::CudaBackend;
use runit_quant::GgmlType;

fn gpu() -> Option<CudaBackend> {
    match CudaBackend::new(0) {
        Ok(cuda) => Some(cuda),
        Err(error) => {
            let require = std::env::var("RUNIT_REQUIRE_GPU").is_ok_and(|v| v == "1");
            assert!(!require, "RUNIT_REQUIRE_GPU=1 but: {error}");
            println!("NOTICE: no CUDA device, GPU matmul tests not run: {error}");
            None
        }
    }
}

fn cpu() -> CpuBackend {
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get().min(16));
    CpuBackend::new(threads).expect("cpu backend")
}

/// `W · x (+ bias)` for `tokens` rows on `backend`.
fn run_matmul(
    backend: &dyn Backend,
    weight: &Weight,
    bias: Option<&Weight>,
    x: &[f32],
    tokens: usize,
) -> Result<Vec<f32>, BackendError> {
    let mut input = backend.alloc(x.len())?;
    backend.upload(&mut input, x)?;
    let n_out = weight.rows();
    let mut out = backend.alloc(tokens * n_out)?;
    backend.matmul_bias(Projection { weight, bias }, &input, tokens, &mut out)?;
    let mut values = vec![0.0; tokens * n_out];
    backend.download(&out, &mut values)?;
    Ok(values)
}

/// Compares the GPU with the CPU on one weight (`matrix` picks one expert of a 3-D weight;
/// `bias`: an F32 bias of the row count is added) for each token count, collecting failures.
#[allow(clippy::too_many_arguments)]
fn compare(
    cuda: &CudaBackend,
    reference: &CpuBackend,
    ty: GgmlType,
    shape: &[usize],
    values: &[f32],
    matrix: Option<usize>,
    bias: bool,
    token_counts: &[usize],
    rng: &mut Rng,
    failures: &mut Vec<String>,
) {
    let bias_values = rng.values(shape[1], -1.0, 1.0);
    let load = |backend: &dyn Backend| -> Result<(Weight, Option<Weight>), BackendError> {
        let weight = make_weight(backend, "test.matmul", ty, shape, values)?;
        let bias = bias
            .then(|| {
                make_weight(
                    backend,
                    "test.bias",
                    GgmlType::F32,
                    &shape[1..2],
                    &bias_values,
                )
            })
            .transpose()?;
        Ok((
            matrix.map_or(weight.clone(), |index| weight.matrix(index)),
            bias,
        ))
    };
    let (expected_weight, expected_bias) = load(reference).expect("cpu weight");
    let (weight, bias) = match load(cuda) {
        Ok(loaded) => loaded,
        Err(error) => return failures.push(format!("{ty} {shape:?}: {error}")),
    };
    for &tokens in token_counts {
        let x = rng.values(tokens * shape[0], -1.0, 1.0);
        let expected = run_matmul(
            reference,
            &expected_weight,
            expected_bias.as_ref(),
            &x,
            tokens,
        )
        .expect("cpu matmul");
        let label = format!(
            "{ty} {shape:?}{}{} x {tokens}",
            matrix.map_or(String::new(), |m| format!("[{m}]")),
            if bias.is_some() { " + bias" } else { "" }
        );
        match run_matmul(cuda, &weight, bias.as_ref(), &x, tokens) {
            Ok(found) => {
                let error = nmse(&expected, &found);
                println!("{label}: nmse {error:.3e}");
                if error.is_nan() || error > MATMUL_BOUND {
                    failures.push(format!("{label}: nmse {error:e}"));
                }
            }
            Err(error) => failures.push(format!("{label}: {error}")),
        }
    }
}

#[test]
fn matmul_matches_the_cpu_for_every_type() {
    let Some(cuda) = gpu() else { return };
    let reference = cpu();
    println!("device: {} ({})", cuda.device_name(), cuda.target().arch());
    let mut failures = Vec::new();
    for (n_in, n_out) in [(256usize, 64usize), (4096, 1024)] {
        for ty in WEIGHT_TYPES {
            let mut rng = Rng::new(0xc0da + ty.id() as u64 * 7 + n_in as u64);
            let w = rng.normal(n_in * n_out, 0.05);
            let counts = [1, 3, 8, 64, 200, 300];
            let shape = [n_in, n_out];
            compare(
                &cuda,
                &reference,
                ty,
                &shape,
                &w,
                None,
                false,
                &counts,
                &mut rng,
                &mut failures,
            );
        }
    }
    assert!(failures.is_empty(), "failures:\n{}", failures.join("\n"));
}

/// [`compare`] for every weight type (whose blocks divide the row) and every `(n_in, n_out,
/// bias)` shape, on normal weights drawn from `seed(type, n_out)`.
fn compare_shapes(
    shapes: &[(usize, usize, bool)],
    seed: impl Fn(GgmlType, usize) -> u64,
    token_counts: &[usize],
) {
    let Some(cuda) = gpu() else { return };
    let reference = cpu();
    let mut failures = Vec::new();
    for &(n_in, n_out, bias) in shapes {
        for ty in WEIGHT_TYPES {
            if n_in % ty.block_size() != 0 {
                continue;
            }
            let mut rng = Rng::new(seed(ty, n_out));
            let w = rng.normal(n_in * n_out, 0.05);
            compare(
                &cuda,
                &reference,
                ty,
                &[n_in, n_out],
                &w,
                None,
                bias,
                token_counts,
                &mut rng,
                &mut failures,
            );
        }
    }
    assert!(failures.is_empty(), "failures:\n{}", failures.join("\n"));
}

/// The batched kernels (tiles of 16, 32 and 64 rows) and the GEMM path past them, rows that fill no
/// whole block, rows of 896 (no whole K-quant super-block: ranges of whole 128-element
/// chunks), long rows split into ranges (partial sums), with and without a bias.
#[test]
fn batched_matmul_matches_the_cpu_at_every_row_count() {
    compare_shapes(
        &[(896, 139, true), (4608, 300, false), (256, 1000, true)],
        |ty, n_out| 0xba7c + ty.id() as u64 * 3 + n_out as u64,
        &[9, 16, 17, 32, 33, 64, 65, 127, 256],
    );
}

/// 133 row blocks of 1024-element rows at 64 rows: with `RUNIT_CUDA_MMQP_BLOCKS=1` (one
/// block per multiprocessor, 132 on an H200) the pipelined kernels' grid blocks each take
/// whole row blocks and the start of the next (stream-K shares crossing row blocks, merged);
/// with the defaults each grid block takes one whole row block.
#[test]
fn pipelined_shares_cross_row_blocks() {
    compare_shapes(
        &[(1024, 133 * 128, true)],
        |ty, n_out| 0x5e9 + ty.id() as u64 * 11 + n_out as u64,
        &[64],
    );
}

/// 896 values: Q8_0 rows of 952 bytes (off 16-byte boundaries) and a row count that is no
/// multiple of the rows per block. 9001 rows of 256: short float rows take the warp-per-row
/// kernels, with more rows than a device holds warps (several per warp). 8200 rows of 1152:
/// the float kernels with four loads per thread.
#[test]
fn matvec_reads_unaligned_rows_and_every_float_variant() {
    compare_shapes(
        &[(896, 139, false), (256, 9001, false), (1152, 8200, false)],
        |ty, n_out| 0x3a7 + ty.id() as u64 * 5 + n_out as u64,
        &[1, 2, 5, 8],
    );
}

#[test]
fn matmul_reads_expert_views_and_odd_float_rows() {
    let Some(cuda) = gpu() else { return };
    let reference = cpu();
    let (n_in, n_out, experts) = (512, 48, 3);
    let mut failures = Vec::new();
    for ty in WEIGHT_TYPES {
        let mut rng = Rng::new(0xe7e7 + ty.id() as u64);
        let w = rng.normal(n_in * n_out * experts, 0.05);
        let shape = [n_in, n_out, experts];
        compare(
            &cuda,
            &reference,
            ty,
            &shape,
            &w,
            Some(2),
            false,
            &[2, 17],
            &mut rng,
            &mut failures,
        );
    }
    // Float rows whose length is not a multiple of 8 take the element-wise kernels.
    for ty in [GgmlType::F32, GgmlType::F16, GgmlType::BF16] {
        let mut rng = Rng::new(0x0dd + ty.id() as u64);
        let w = rng.normal(100 * 7, 0.05);
        compare(
            &cuda,
            &reference,
            ty,
            &[100, 7],
            &w,
            None,
            false,
            &[1, 5, 20],
            &mut rng,
            &mut failures,
        );
    }
    assert!(failures.is_empty(), "failures:\n{}", failures.join("\n"));
}

fn run_embedding(
    backend: &dyn Backend,
    ty: GgmlType,
    width: usize,
    rows: usize,
    table: &[f32],
    ids: &[u32],
) -> Result<Vec<f32>, BackendError> {
    let weight = make_weight(backend, "test.token_embd", ty, &[width, rows], table)?;
    let mut out = backend.alloc(ids.len() * width)?;
    backend.embedding(&weight, ids, &mut out)?;
    let mut values = vec![0.0; ids.len() * width];
    backend.download(&out, &mut values)?;
    Ok(values)
}

#[test]
fn embedding_matches_the_cpu_for_every_type() {
    let Some(cuda) = gpu() else { return };
    let reference = cpu();
    let mut failures = Vec::new();
    for (width, rows) in [(256usize, 40usize), (3584, 9)] {
        let ids: Vec<u32> = [7u32, 0, 3, 7, 8, 1]
            .iter()
            .map(|i| i % rows as u32)
            .collect();
        for ty in WEIGHT_TYPES {
            let mut rng = Rng::new(0xe3b + ty.id() as u64 + width as u64);
            let table = rng.normal(width * rows, 0.5);
            let label = format!("{ty} [{rows}x{width}]");
            let expected =
                run_embedding(&reference, ty, width, rows, &table, &ids).expect("cpu embedding");
            match run_embedding(&cuda, ty, width, rows, &table, &ids) {
                Ok(found) => {
                    let error = nmse(&expected, &found);
                    let exact = expected.iter().zip(&found).all(|(a, b)| a == b);
                    println!("{label}: nmse {error:.3e}, bit-exact {exact}");
                    if error.is_nan() || error > ELEMENTWISE_BOUND {
                        failures.push(format!("{label}: nmse {error:e}"));
                    }
                }
                Err(error) => failures.push(format!("{label}: {error}")),
            }
        }
    }
    // An odd-width float table takes the element-wise tail path.
    let mut rng = Rng::new(0x0dd);
    let table = rng.normal(13 * 5, 0.5);
    for ty in [GgmlType::F32, GgmlType::F16, GgmlType::BF16] {
        let expected = run_embedding(&reference, ty, 13, 5, &table, &[4, 2]).expect("cpu");
        match run_embedding(&cuda, ty, 13, 5, &table, &[4, 2]) {
            Ok(found) if found == expected => {}
            Ok(found) => failures.push(format!("{ty} width 13: {found:?} vs {expected:?}")),
            Err(error) => failures.push(format!("{ty} width 13: {error}")),
        }
    }
    assert!(failures.is_empty(), "failures:\n{}", failures.join("\n"));
}
