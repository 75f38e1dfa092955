//! Batched recording: matmuls recorded back to back share one submit, and each still sees
//! its own activations although they pass through one scratch buffer and one parameter ring
//! (each result equals the same matmul run alone, and the CPU's within the parity bound).

use runit_backend::testing::parity::MATMUL_BOUND;
use runit_backend::testing::{make_weight, nmse};
use runit_backend::{Backend, Device, PrimitiveOps};
use runit_backend_cpu::{CpuBackend, SimdLevel};
use runit_backend_wgpu::WgpuBackend;
use runit_quant::GgmlType;

/// Values per row and rows of the weight (whole K-quant blocks).
const SHAPE: (usize, usize) = (256, 24);

fn backend() -> Option<WgpuBackend> {
    match WgpuBackend::new(0) {
        Ok(backend) => Some(backend),
        Err(error) => {
            let required = std::env::var("RUNIT_REQUIRE_WGPU").is_ok_and(|v| v == "1");
            assert!(!required, "RUNIT_REQUIRE_WGPU=1 but: {error}");
            println!("NOTICE: no wgpu adapter: {error}");
            None
        }
    }
}

fn values(len: usize, seed: usize) -> Vec<f32> {
    (0..len)
        .map(|i| (((i + seed) * 7919 % 1000) as f32 / 500.0) - 1.0)
        .collect()
}

/// `tokens` rows of `x` times a weight of [`SHAPE`] on `backend`, alone.
fn matmul_alone(backend: &dyn Backend, ty: GgmlType, x: &[f32], tokens: usize) -> Vec<f32> {
    let (n_in, n_out) = SHAPE;
    let w =
        make_weight(backend, "w", ty, &[n_in, n_out], &values(n_in * n_out, 3)).expect("weight");
    let mut input = backend.alloc(x.len()).expect("alloc");
    backend.upload(&mut input, x).expect("upload");
    let mut out = backend.alloc(tokens * n_out).expect("alloc");
    backend
        .matmul(&w, &input, tokens, &mut out)
        .expect("matmul");
    let mut host = vec![0.0; tokens * n_out];
    backend.download(&out, &mut host).expect("download");
    host
}

#[test]
fn matmuls_recorded_together_match_each_alone() {
    let Some(gpu) = backend() else { return };
    recorded_together_match_each_alone(&gpu.with_early_submit(0), false);
}

/// As [`matmuls_recorded_together_match_each_alone`], with batches submitted early (the
/// first after 2 commands, as on a GPU after 16): more submits, the same results.
#[test]
fn matmuls_submitted_early_match_each_alone() {
    let Some(gpu) = backend() else { return };
    recorded_together_match_each_alone(&gpu.with_early_submit(2), true);
}

/// Six matmuls recorded back to back, then read back, against each alone and the CPU;
/// `early`: the backend submits early (else the first read-back submits them all).
fn recorded_together_match_each_alone(gpu: &WgpuBackend, early: bool) {
    let cpu = CpuBackend::with_simd(1, SimdLevel::Scalar).expect("cpu");
    let (n_in, n_out) = SHAPE;
    for (ty, tokens) in [
        (GgmlType::Q8_0, 1),
        (GgmlType::Q4_K, 1),
        (GgmlType::Q8_0, 5),
    ] {
        let w =
            make_weight(gpu, "w", ty, &[n_in, n_out], &values(n_in * n_out, 3)).expect("weight");
        let xs: Vec<Vec<f32>> = (0..6).map(|k| values(tokens * n_in, 100 + k)).collect();
        let mut inputs = Vec::new();
        for x in &xs {
            let mut input = gpu.alloc(x.len()).expect("alloc");
            gpu.upload(&mut input, x).expect("upload");
            inputs.push(input);
        }
        let mut outs: Vec<_> = (0..xs.len())
            .map(|_| gpu.alloc(tokens * n_out).expect("alloc"))
            .collect();
        let before = gpu.counts();
        for (input, out) in inputs.iter().zip(&mut outs) {
            gpu.matmul(&w, input, tokens, out).expect("matmul");
        }
        let mut together = Vec::new();
        for out in &outs {
            let mut host = vec![0.0; tokens * n_out];
            gpu.download(out, &mut host).expect("download");
            together.push(host);
        }
        let after = gpu.counts();
        // Q8_0 and Q4_K round the activations first (to Q8_0, Q8_K): two dispatches a matmul.
        let per_matmul = 2;
        let dispatches = after.dispatches - before.dispatches;
        assert_eq!(dispatches, per_matmul * xs.len() as u64, "{ty:?}");
        // The first download submits every matmul with its copy; the others, their copy.
        // Submitted early, the twelve dispatches go in batches of 2, 2, 2, 3 and 4 (with
        // the first copy): four submits more.
        let submits = xs.len() as u64 + if early { 4 } else { 0 };
        assert_eq!(after.submits - before.submits, submits, "{ty:?}");
        for (x, result) in xs.iter().zip(&together) {
            assert_eq!(
                result,
                &matmul_alone(gpu, ty, x, tokens),
                "{ty:?} x {tokens}"
            );
            let error = nmse(&matmul_alone(&cpu, ty, x, tokens), result);
            assert!(
                error <= MATMUL_BOUND,
                "{ty:?} x {tokens}: NMSE {error} against the CPU"
            );
        }
    }
}

#[test]
fn one_rounding_serves_consecutive_matmuls_of_one_input_until_it_changes() {
    let Some(gpu) = backend() else { return };
    let (n_in, n_out) = SHAPE;
    let ty = GgmlType::Q8_0;
    let weights: Vec<_> = (0..3)
        .map(|k| {
            make_weight(&gpu, "w", ty, &[n_in, n_out], &values(n_in * n_out, 3 + k))
                .expect("weight")
        })
        .collect();
    let (x1, x2) = (values(n_in, 100), values(n_in, 200));
    let mut input = gpu.alloc(n_in).expect("alloc");
    gpu.upload(&mut input, &x1).expect("upload");
    let mut outs: Vec<_> = (0..4).map(|_| gpu.alloc(n_out).expect("alloc")).collect();
    let before = gpu.counts();
    // Three projections of one input (as Q, K, V): one rounding, three matrix-vector kernels.
    for (w, out) in weights.iter().zip(&mut outs) {
        gpu.matmul(w, &input, 1, out).expect("matmul");
    }
    assert_eq!(gpu.counts().dispatches - before.dispatches, 4);
    // A new upload to the same buffer is rounded again.
    gpu.upload(&mut input, &x2).expect("upload");
    gpu.matmul(&weights[0], &input, 1, &mut outs[3])
        .expect("matmul");
    assert_eq!(gpu.counts().dispatches - before.dispatches, 6);
    let cases = [(0, &x1), (1, &x1), (2, &x1), (0, &x2)];
    for ((k, x), out) in cases.into_iter().zip(&outs) {
        let mut result = vec![0.0; n_out];
        gpu.download(out, &mut result).expect("download");
        let w = make_weight(&gpu, "w", ty, &[n_in, n_out], &values(n_in * n_out, 3 + k))
            .expect("weight");
        let mut alone_input = gpu.alloc(n_in).expect("alloc");
        gpu.upload(&mut alone_input, x).expect("upload");
        let mut alone = gpu.alloc(n_out).expect("alloc");
        gpu.matmul(&w, &alone_input, 1, &mut alone).expect("matmul");
        let mut expected = vec![0.0; n_out];
        gpu.download(&alone, &mut expected).expect("download");
        assert_eq!(result, expected, "weight {k}");
    }
}
