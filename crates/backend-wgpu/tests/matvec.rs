//! The matrix-vector kernels (`matvec.wgsl`, every type of `MATVEC_TYPES` on f32 activations,
//! every type of `MATVEC_INT8_TYPES` on int8 ones with either dot product) against the CPU's
//! scalar twin, on the shapes the parity suite's one [36 x 512] case does not reach: a last
//! workgroup of fewer than its 4 rows, rows whose pieces do not fill a workgroup's 128
//! invocations or take several rounds of them, rows of Q8_0-style blocks whose tokens start
//! inside the int8 layout's groups of 256 values, and 1 to 3 tokens (one per z), with
//! subgroup sums and without; and Q6_K's kernels with their rows staged through workgroup
//! memory against those reading in place. Runs only where an adapter exists (as
//! `parity.rs`).

use runit_backend::testing::{make_weight, nmse, Rng};
use runit_backend::{Backend, BackendError, Buffer, Device, FusedOps, Projection};
use runit_backend_cpu::{CpuBackend, SimdLevel};
use runit_backend_wgpu::{Dot4, WgpuBackend, MATVEC_INT8_TYPES, MATVEC_TYPES};
use runit_quant::GgmlType;

/// Far below the parity suite's 5e-4: each kernel sums the CPU's rounded activations in f32
/// (NMSE 1e-13 here, 4e-7 for F16), or their integers exactly and the scaled sums in f32; a
/// piece read from the wrong place or a row or token summed twice moves it by 1e-3 or more.
const BOUND: f64 = 1e-5;

/// The adapter's backends with subgroup sums and without, their matrix-vector kernels on the
/// activations `int8` says.
fn backends(int8: Option<Dot4>) -> Vec<WgpuBackend> {
    let backend = match WgpuBackend::new(0) {
        Ok(backend) => backend,
        Err(error) => {
            let required = std::env::var("RUNIT_REQUIRE_WGPU").is_ok_and(|v| v == "1");
            assert!(!required, "RUNIT_REQUIRE_WGPU=1 but: {error}");
            println!("NOTICE: no wgpu adapter, not run: {error}");
            return Vec::new();
        }
    };
    let shared = WgpuBackend::new(0).expect("adapter").without_subgroups();
    let mut all = vec![shared.with_matvec_int8(int8)];
    if backend.uses_subgroups() {
        all.push(backend.with_matvec_int8(int8));
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

/// Every type of `types` on every backend of `backends(int8)` against the CPU's scalar twin.
fn check(types: &[GgmlType], int8: Option<Dot4>) {
    let reference = CpuBackend::with_simd(1, SimdLevel::Scalar).expect("scalar backend");
    // (values a row, rows): 40 to 1,152 pieces a row, 5 to 37 rows; for the types of blocks
    // of 32 rows of 96 and 896 values too (the int8 layout's groups of 256 values then hold
    // parts of two tokens: the second token's values start inside a group).
    let shapes: [[usize; 2]; 5] = [[256, 5], [1280, 37], [4608, 9], [96, 6], [896, 7]];
    for gpu in backends(int8) {
        for &ty in types {
            for (s, shape) in shapes.into_iter().enumerate() {
                if !shape[0].is_multiple_of(ty.block_size()) {
                    continue;
                }
                let mut rng = Rng::new(0x3a7e_c000 + ty.id() as u64 * 7 + s as u64);
                let w = rng.normal(shape[0] * shape[1], 0.06);
                for tokens in 1..=3 {
                    let x = rng.values(tokens * shape[0], -1.0, 1.0);
                    let want = matmul(&reference, ty, shape, &w, &x, tokens).expect("cpu");
                    let got = matmul(&gpu, ty, shape, &w, &x, tokens).expect("wgpu");
                    let error = nmse(&want, &got);
                    assert!(
                        error <= BOUND,
                        "{ty:?} {shape:?} x {tokens}, subgroups {}, int8 {int8:?}: NMSE \
                         {error:e}",
                        gpu.uses_subgroups()
                    );
                }
            }
        }
    }
}

#[test]
fn matvec_kernels_match_the_cpu() {
    check(&MATVEC_TYPES, None);
}

#[test]
fn int8_matvec_kernels_match_the_cpu() {
    check(&MATVEC_INT8_TYPES, Some(Dot4::Builtin));
}

/// The plain arithmetic's dot product, as an adapter without the instruction would not
/// need (naga writes its own there) but a comparison may force (`RUNIT_WGPU_MATVEC_INT8=plain`).
#[test]
fn int8_matvec_kernels_with_plain_dot_products_match_the_cpu() {
    check(&MATVEC_INT8_TYPES, Some(Dot4::Plain));
}

/// Q6_K's matrix-vector kernels with each workgroup's rows staged through workgroup memory
/// (`matvec_staged.wgsl`, the default) and reading each piece in place
/// (`RUNIT_WGPU_Q6K_ALIGNED=0`), against the CPU's scalar twin at `BOUND` and against each
/// other (far tighter: the same arithmetic on the same words), on f32 and int8 activations,
/// with subgroup sums and without: rows of 1 to 18 blocks (one stage of 16 blocks or less,
/// then a second of 1 or 2; an odd count puts every other row on a 2-byte boundary), 3 to
/// 13 rows (most not a multiple of the workgroup's 4), 1 to 3 tokens. Then the Q, K and V
/// projections of Q6_K weights in one dispatch (`matvec_parts`), each output against the CPU.
#[test]
fn staged_q6_k_matvec_matches_the_cpu() {
    const SAME: f64 = 1e-10;
    let reference = CpuBackend::with_simd(1, SimdLevel::Scalar).expect("scalar backend");
    let ty = GgmlType::Q6_K;
    for int8 in [None, Some(Dot4::Builtin)] {
        let pairs = backends(int8).into_iter().zip(backends(int8));
        for (staged, in_place) in pairs {
            let (staged, in_place) = (
                staged.with_q6_k_staged(true),
                in_place.with_q6_k_staged(false),
            );
            let subgroups = staged.uses_subgroups();
            let detail = |shape: [usize; 2], tokens| {
                format!("{shape:?} x {tokens}, subgroups {subgroups}, int8 {int8:?}")
            };
            for blocks in 1..=18 {
                let shape = [256 * blocks, [5, 7, 9, 6, 13, 3][blocks % 6]];
                let mut rng = Rng::new(0x6b00 + blocks as u64);
                let w = rng.normal(shape[0] * shape[1], 0.06);
                for tokens in 1..=3 {
                    let x = rng.values(tokens * shape[0], -1.0, 1.0);
                    let want = matmul(&reference, ty, shape, &w, &x, tokens).expect("cpu");
                    let got = matmul(&staged, ty, shape, &w, &x, tokens).expect("staged");
                    let read = matmul(&in_place, ty, shape, &w, &x, tokens).expect("in place");
                    let (error, apart) = (nmse(&want, &got), nmse(&read, &got));
                    let detail = detail(shape, tokens);
                    assert!(error <= BOUND, "staged {detail}: NMSE {error:e}");
                    assert!(
                        apart <= SAME,
                        "staged {detail}: NMSE {apart:e} from in place"
                    );
                }
            }
            let staged = staged.with_matvec_parts();
            for blocks in [1, 7, 17] {
                let (n, rows) = (256 * blocks, [9, 5, 7]);
                let mut rng = Rng::new(0x6b80 + blocks as u64);
                let ws: Vec<Vec<f32>> = rows.iter().map(|r| rng.normal(n * r, 0.06)).collect();
                let weights: Vec<_> = ws
                    .iter()
                    .zip(rows)
                    .map(|(w, r)| make_weight(&staged, "qkv", ty, &[n, r], w).expect("weight"))
                    .collect();
                for tokens in 1..=3 {
                    let x = rng.values(tokens * n, -1.0, 1.0);
                    let mut input = staged.alloc(x.len()).expect("alloc");
                    staged.upload(&mut input, &x).expect("upload");
                    let mut outs: Vec<Buffer> = rows
                        .iter()
                        .map(|r| staged.alloc(tokens * r).expect("alloc"))
                        .collect();
                    let [q, k, v] = &mut outs[..] else {
                        unreachable!()
                    };
                    let projections = [0, 1, 2].map(|i| Projection {
                        weight: &weights[i],
                        bias: None,
                    });
                    let before = staged.counts().dispatches;
                    staged
                        .matmul_qkv(projections, &input, tokens, [q, k, v])
                        .expect("matmul_qkv");
                    // The rounding of x and one matrix-vector dispatch for the three.
                    let used = staged.counts().dispatches - before;
                    let detail = detail([n, rows[0]], tokens);
                    assert!(used <= 2, "parts {detail}: {used} dispatches");
                    for ((out, w), r) in outs.iter().zip(&ws).zip(rows) {
                        let want = matmul(&reference, ty, [n, r], w, &x, tokens).expect("cpu");
                        let mut got = vec![0.0; tokens * r];
                        staged.download(out, &mut got).expect("download");
                        let error = nmse(&want, &got);
                        assert!(error <= BOUND, "parts {detail}, {r} rows: NMSE {error:e}");
                    }
                }
            }
        }
    }
}
