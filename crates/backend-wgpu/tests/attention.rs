//! The split attention path (`attention_split.wgsl`, `attention_merge.wgsl`: spans of fewer
//! than 64 rows where matmul is not exact) against the CPU's scalar twin at depths the
//! parity suite does not reach: a decode row over 2,000 keys (32 chunks of two tiles a
//! head), 40 rows after 2,000 keys (one chunk of 64 tiles a query and head), and rows under a
//! sliding window, with grouped-query heads. Runs only where an adapter exists (as
//! `parity.rs`).

use runit_backend::testing::parity::ATTENTION_BOUND;
use runit_backend::testing::{nmse, Rng};
use runit_backend::{
    Attention, AttentionParams, Backend, BackendError, KvRole, KvType, KvWrite, SequenceSpan,
};
use runit_backend_cpu::{CpuBackend, SimdLevel};
use runit_backend_wgpu::WgpuBackend;

/// Over f32 caches both sum in f32 (NMSE 3e-13 here); a chunk dropped or counted twice, or
/// a tile's rescaling lost, moves the outputs by 1e-3 and more.
const F32_BOUND: f64 = 1e-9;

/// One case: heads, kv_heads, head_dim, cache type, sliding window, cached keys, new rows.
type Case = (usize, usize, usize, KvType, Option<usize>, usize, usize);

/// The attention of a case's new rows over its cached keys and their own on `backend`.
fn run(backend: &dyn Backend, case: Case, seed: u64) -> Result<Vec<f32>, BackendError> {
    let (heads, kv_heads, head_dim, ty, window, prefix, rows) = case;
    let (kv_width, q_width, block_size) = (kv_heads * head_dim, heads * head_dim, 16);
    let keys = prefix + rows;
    let blocks = keys.div_ceil(block_size);
    // Blocks in reverse order, so that cells are not positions.
    let block_table: Vec<u32> = (0..blocks as u32).rev().collect();
    let n_cells = blocks * block_size;
    let mut k_cache = backend.alloc_kv(n_cells, kv_width, head_dim, ty, KvRole::Keys)?;
    let mut v_cache = backend.alloc_kv(n_cells, kv_width, head_dim, ty, KvRole::Values)?;
    let mut rng = Rng::new(seed);
    let upload = |values: Vec<f32>| {
        let mut buffer = backend.alloc(values.len())?;
        backend.upload(&mut buffer, &values)?;
        Ok::<_, BackendError>(buffer)
    };
    let k = upload(rng.values(keys * kv_width, -1.0, 1.0))?;
    let v = upload(rng.values(keys * kv_width, -1.0, 1.0))?;
    let q = upload(rng.values(rows * q_width, -2.0, 2.0))?;
    let span = |first_row, rows, start_position| SequenceSpan {
        first_row,
        rows,
        start_position,
        block_table: block_table.clone(),
        block_size,
    };
    backend.kv_write(KvWrite {
        k: &k,
        v: &v,
        k_cache: &mut k_cache,
        v_cache: &mut v_cache,
        spans: &[span(0, keys, 0)],
    })?;
    let params = AttentionParams {
        heads,
        kv_heads,
        head_dim,
        scale: 1.0 / (head_dim as f32).sqrt(),
        sliding_window: window,
    };
    let mut out = backend.alloc(rows * q_width)?;
    let attention = Attention {
        q: &q,
        k_cache: &k_cache,
        v_cache: &v_cache,
        spans: &[span(0, rows, prefix)],
        params: &params,
    };
    backend.attention(&attention, &mut out)?;
    let mut host = vec![0.0; rows * q_width];
    backend.download(&out, &mut host)?;
    Ok(host)
}

#[test]
fn split_attention_matches_the_cpu_at_depth() {
    let gpu = match WgpuBackend::new(0) {
        Ok(backend) => backend,
        Err(error) => {
            let required = std::env::var("RUNIT_REQUIRE_WGPU").is_ok_and(|v| v == "1");
            assert!(!required, "RUNIT_REQUIRE_WGPU=1 but: {error}");
            println!("NOTICE: no wgpu adapter, not run: {error}");
            return;
        }
    };
    let reference = CpuBackend::with_simd(1, SimdLevel::Scalar).expect("scalar backend");
    // Over an f16 cache the CPU rounds its value accumulator to f16 at every key (ggml's
    // one-chunk path) and the split path sums in f32: 4e-5 apart at this depth, within the
    // parity suite's bound.
    // Heads of 256 dims (an invocation's second value dim) and of 66 (a score's last
    // quarter longer than the others), at a depth of one tile and of a few.
    let cases: [(Case, f64); 7] = [
        ((32, 8, 128, KvType::F32, None, 2000, 1), F32_BOUND),
        ((32, 8, 128, KvType::F32, None, 2000, 40), F32_BOUND),
        ((16, 2, 64, KvType::F32, Some(500), 1500, 3), F32_BOUND),
        ((32, 8, 128, KvType::F16, None, 2000, 1), ATTENTION_BOUND),
        ((8, 2, 256, KvType::F32, None, 20, 1), F32_BOUND),
        ((8, 2, 256, KvType::F32, None, 300, 2), F32_BOUND),
        ((8, 4, 66, KvType::F32, None, 90, 1), F32_BOUND),
    ];
    for (index, (case, bound)) in cases.into_iter().enumerate() {
        let want = run(&reference, case, 71 + index as u64).expect("cpu");
        let got = run(&gpu, case, 71 + index as u64).expect("wgpu");
        let error = nmse(&want, &got);
        assert!(error <= bound, "{case:?}: NMSE {error:e}");
    }
}
