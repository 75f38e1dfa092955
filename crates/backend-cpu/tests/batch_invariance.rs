//! Batch invariance of the CPU matmul: every output row is bit-identical whether its
//! activation row is multiplied alone or inside a batch of any size (the server's outputs must
//! not depend on what else is in the batch, and llama.cpp's per-row order does not either for
//! the `vec_dot` types).

use runit_backend::testing::{make_weight, Rng};
use runit_backend::{Backend, Buffer};
use runit_backend_cpu::CpuBackend;
use runit_quant::GgmlType;

fn buffer(b: &dyn Backend, values: &[f32]) -> Buffer {
    let mut buffer = b.alloc(values.len()).unwrap();
    b.upload(&mut buffer, values).unwrap();
    buffer
}

fn read(b: &dyn Backend, buffer: &Buffer) -> Vec<f32> {
    let mut out = vec![0.0; buffer.len()];
    b.download(buffer, &mut out).unwrap();
    out
}

fn matmul(
    b: &dyn Backend,
    w: &runit_backend::Weight,
    x: &[f32],
    tokens: usize,
    n_out: usize,
) -> Vec<f32> {
    let input = buffer(b, x);
    let mut out = b.alloc(tokens * n_out).unwrap();
    b.matmul(w, &input, tokens, &mut out).unwrap();
    read(b, &out)
}

/// Types whose ggml order is the same for one row and for many (`vec_dot` or tinyBLAS with the
/// same per-element arithmetic). Q4_0, Q4_K, IQ4_NL and Q2_K follow ggml's repacked gemm for
/// groups of four rows and its gemv for the rest, as llama.cpp does, so they are not invariant
/// by design; F16/BF16/F32 batches follow tinyBLAS.
const INVARIANT: &[GgmlType] = &[
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Q3_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
    GgmlType::IQ4_XS,
];

#[test]
fn matmul_rows_do_not_depend_on_the_batch() {
    let backend = CpuBackend::new(2).unwrap();
    let (k, n_out) = (1536, 64);
    let mut rng = Rng::new(11);
    let weights = rng.normal(k * n_out, 0.06);
    let mut x = rng.normal(k * 128, 1.0);
    // Massive outliers like SmolLM2's SwiGLU outputs.
    for t in 0..128 {
        x[t * k + (t * 37) % k] = 40.0;
    }
    let mut failures = Vec::new();
    for &ty in INVARIANT {
        let w = make_weight(&backend, "w", ty, &[k, n_out], &weights).unwrap();
        let whole = matmul(&backend, &w, &x, 128, n_out);
        for batch in [1usize, 3, 4, 8, 32, 48, 64] {
            let mut pieces = Vec::new();
            let mut t = 0;
            while t < 128 {
                let rows = batch.min(128 - t);
                pieces.extend(matmul(&backend, &w, &x[t * k..(t + rows) * k], rows, n_out));
                t += rows;
            }
            let differing = whole
                .iter()
                .zip(&pieces)
                .filter(|(a, b)| a.to_bits() != b.to_bits())
                .count();
            if differing > 0 {
                failures.push(format!("{ty}: batch {batch}: {differing} outputs differ"));
            }
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}
