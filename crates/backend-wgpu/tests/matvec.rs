//! The matrix-vector kernels (`matvec.wgsl`, every type of `MATVEC_TYPES`) against the CPU's
//! scalar twin, on the shapes the parity suite's one [36 x 512] case does not reach: a last
//! workgroup of fewer than its 4 rows, rows whose pieces do not fill a workgroup's 128
//! invocations or take several rounds of them, and 1 to 3 tokens (one per z), with subgroup
//! sums and without. Runs only where an adapter exists (as `parity.rs`).

use runit_backend::testing::{make_weight, nmse, Rng};
use runit_backend::{Backend, BackendError, Buffer};
use runit_backend_cpu::{CpuBackend, SimdLevel};
use runit_backend_wgpu::{WgpuBackend, MATVEC_TYPES};

/// Far below the parity suite's 5e-4: each kernel sums the CPU's rounded activations in f32
/// (NMSE 1e-13 here, 4e-7 for F16); a piece read from the wrong place or a row or token
/// summed twice moves it by 1e-3 or more.
const BOUND: f64 = 1e-5;

fn backends() -> Vec<WgpuBackend> {
    let backend = match WgpuBackend::new(0) {
        Ok(backend) => backend,
        Err(error) => {
            let required = std::env::var("RUNIT_REQUIRE_WGPU").is_ok_and(|v| v == "1");
            assert!(!required, "RUNIT_REQUIRE_WGPU=1 but: {error}");
            println!("NOTICE: no wgpu adapter, not run: {error}");
            return Vec::new();
        }
    };
    let mut all = vec![WgpuBackend::new(0).expect("adapter").without_subgroups()];
    if backend.uses_subgroups() {
        all.push(backend);
    }
    all
}

/// `W · x` for `tokens` tokens on `backend`.
fn matmul(
    backend: &dyn Backend,
    ty: runit_quant::GgmlType,
    [n, rows]: [usize; 2],
    w: &[f32],
    x: &[f32],
    tokens: usize,
) -> Result<Vec<f32>, BackendError> {
    let weight = make_weight(backend, "matvec", ty, &[n, rows], w)?;
    let mut input: Buffer = backend.alloc(x.len())?;
    backend.upload(&mut input, x)?;
    let mut out = backend.alloc(tokens * rows)?;
    backend.matmul(&weight, &input, tokens, &mut out)?;
    let mut host = vec![0.0; tokens * rows];
    backend.download(&out, &mut host)?;
    Ok(host)
}

#[test]
fn matvec_kernels_match_the_cpu() {
    let reference = CpuBackend::with_simd(1, SimdLevel::Scalar).expect("scalar backend");
    // (values a row, rows): 40 to 1,152 pieces a row, 5 to 37 rows.
    let shapes = [[256, 5], [1280, 37], [4608, 9]];
    for gpu in backends() {
        for ty in MATVEC_TYPES {
            for (s, shape) in shapes.into_iter().enumerate() {
                let mut rng = Rng::new(0x3a7e_c000 + ty.id() as u64 * 7 + s as u64);
                let w = rng.normal(shape[0] * shape[1], 0.06);
                for tokens in 1..=3 {
                    let x = rng.values(tokens * shape[0], -1.0, 1.0);
                    let want = matmul(&reference, ty, shape, &w, &x, tokens).expect("cpu");
                    let got = matmul(&gpu, ty, shape, &w, &x, tokens).expect("wgpu");
                    let error = nmse(&want, &got);
                    assert!(
                        error <= BOUND,
                        "{ty:?} {shape:?} x {tokens}, subgroups {}: NMSE {error:e}",
                        gpu.uses_subgroups()
                    );
                }
            }
        }
    }
}
