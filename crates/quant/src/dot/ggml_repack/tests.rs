//! The repack-order kernels against the exact dot product, and every SIMD level against
//! its scalar twin, bit for bit.

use super::*;
use crate::dot::{activation_format, activation_row_bytes, quantize_activation};
use crate::quantize;

const TYPES: [GgmlType; 4] = [
    GgmlType::Q4_0,
    GgmlType::IQ4_NL,
    GgmlType::Q2_K,
    GgmlType::Q4_K,
];

/// `rows` weight rows of `n` elements and one activation row, quantized.
fn fixture(
    ty: GgmlType,
    n: usize,
    rows: usize,
    seed: f32,
) -> (Vec<f32>, Vec<u8>, Vec<f32>, Vec<u8>) {
    let w: Vec<f32> = (0..n * rows)
        .map(|i| (i as f32 * 0.37 + seed).sin() * (1.0 + (i % 7) as f32))
        .collect();
    let x: Vec<f32> = (0..n).map(|i| (i as f32 * 0.11 - seed).cos()).collect();
    let row_bytes = ty.row_bytes(n as u64).expect("whole blocks") as usize;
    let mut packed = vec![0u8; rows * row_bytes];
    for (row, out) in w.chunks(n).zip(packed.chunks_mut(row_bytes)) {
        quantize(ty, row, out).expect("quantize");
    }
    let format = activation_format(ty).expect("format");
    let mut activation = vec![0u8; activation_row_bytes(format, n)];
    quantize_activation(format, &x, &mut activation);
    (w, packed, x, activation)
}

#[test]
fn repack_order_is_close_to_the_exact_dot() {
    let n = 512;
    for ty in TYPES {
        let (w, packed, x, activation) = fixture(ty, n, 1, 0.5);
        let exact: f32 = w.iter().zip(&x).map(|(a, b)| a * b).sum();
        let vec_dot =
            crate::dot::dot_fn(ty, SimdLevel::Scalar).expect("dot")(n, &packed, &activation);
        let (gemv, gemm) = repack_dot_fn(ty).expect("repacked type");
        for repack in [gemv(n, &packed, &activation), gemm(n, &packed, &activation)] {
            let bound = 0.05 * w.iter().map(|v| v.abs()).sum::<f32>() / n as f32 * n as f32;
            assert!((repack - exact).abs() < bound, "{ty}: {repack} vs {exact}");
            assert!(
                (repack - vec_dot).abs() < 1e-3 * vec_dot.abs().max(1.0),
                "{ty}: {repack} vs {vec_dot}"
            );
        }
    }
}

#[test]
fn rows_kernels_equal_the_scalar_twins_bit_for_bit() {
    let n = 768;
    let rows = 19; // two groups of eight and a tail
    for ty in TYPES {
        for seed in [0.0f32, 1.7, -3.2] {
            let (_, packed, _, activation) = fixture(ty, n, rows, seed);
            let row_bytes = packed.len() / rows;
            let (gemv, gemm) = repack_dot_fn(ty).expect("repacked type");
            let twins = |dot: DotFn| -> Vec<u32> {
                packed
                    .chunks(row_bytes)
                    .map(|row| dot(n, row, &activation).to_bits())
                    .collect()
            };
            let (want_gemv, want_gemm) = (twins(gemv), twins(gemm));
            for level in SimdLevel::ALL.into_iter().filter(|l| l.is_available()) {
                let (rows_gemv, rows_gemm) = repack_rows_fn(ty, level).expect("kernels");
                let mut out = vec![0.0f32; rows];
                rows_gemv(n, &packed, &activation, &mut out);
                let got: Vec<u32> = out.iter().map(|v| v.to_bits()).collect();
                assert_eq!(got, want_gemv, "{ty} gemv at {level:?}");
                rows_gemm(n, &packed, &activation, &mut out);
                let got: Vec<u32> = out.iter().map(|v| v.to_bits()).collect();
                assert_eq!(got, want_gemm, "{ty} gemm at {level:?}");
            }
        }
    }
}

#[test]
fn rows_kernels_over_many_activation_rows_equal_the_scalar_twins() {
    let n = 256;
    let rows = 17;
    let tokens = 7; // a group of four and three single rows
    for ty in TYPES {
        let (_, packed, _, _) = fixture(ty, n, rows, 0.9);
        let row_bytes = packed.len() / rows;
        let format = activation_format(ty).expect("format");
        let activation_bytes = activation_row_bytes(format, n);
        let mut activations = vec![0u8; tokens * activation_bytes];
        for (t, out) in activations.chunks_mut(activation_bytes).enumerate() {
            let x: Vec<f32> = (0..n)
                .map(|i| ((i * (t + 3)) as f32 * 0.21 + t as f32).sin() * (1.0 + t as f32))
                .collect();
            quantize_activation(format, &x, out);
        }
        let (gemv, gemm) = repack_dot_fn(ty).expect("repacked type");
        let twins = |dot: DotFn| -> Vec<u32> {
            activations
                .chunks(activation_bytes)
                .flat_map(|a| {
                    packed
                        .chunks(row_bytes)
                        .map(move |w| dot(n, w, a).to_bits())
                })
                .collect()
        };
        let (want_gemv, want_gemm) = (twins(gemv), twins(gemm));
        for level in SimdLevel::ALL.into_iter().filter(|l| l.is_available()) {
            let (rows_gemv, rows_gemm) = repack_rows_fn(ty, level).expect("kernels");
            let mut out = vec![0.0f32; rows * tokens];
            rows_gemv(n, &packed, &activations, &mut out);
            let got: Vec<u32> = out.iter().map(|v| v.to_bits()).collect();
            assert_eq!(got, want_gemv, "{ty} gemv at {level:?}");
            rows_gemm(n, &packed, &activations, &mut out);
            let got: Vec<u32> = out.iter().map(|v| v.to_bits()).collect();
            assert_eq!(got, want_gemm, "{ty} gemm at {level:?}");
        }
    }
}

/// The rows kernels (sixteen-row AVX-512 passes, eight-row passes, scalar tail) over every
/// mix of weight-row and activation-row counts, both orders, bit for bit against the twins.
#[test]
fn rows_kernels_over_row_and_token_counts_equal_the_scalar_twins() {
    for ty in TYPES {
        let n = if ty.block_size() == 256 { 512 } else { 320 };
        let format = activation_format(ty).expect("format");
        let activation_bytes = activation_row_bytes(format, n);
        for rows in [1, 2, 7, 8, 15, 16, 17, 24, 33, 48, 64] {
            let (_, packed, _, _) = fixture(ty, n, rows, rows as f32 * 0.3);
            let row_bytes = packed.len() / rows;
            for tokens in [1, 2, 3, 4, 5, 7, 8, 9, 13, 17] {
                let mut activations = vec![0u8; tokens * activation_bytes];
                for (t, out) in activations.chunks_mut(activation_bytes).enumerate() {
                    // Large and small rows, so the activation scales differ widely.
                    let x: Vec<f32> = (0..n)
                        .map(|i| {
                            ((i * (t + 2)) as f32 * 0.17 - t as f32).sin()
                                * (0.01 + (t % 3) as f32 * 40.0)
                        })
                        .collect();
                    quantize_activation(format, &x, out);
                }
                let what = format!("{rows} rows {tokens} tokens");
                rows_kernels_equal_twins(ty, n, (&packed, row_bytes), &activations, &what);
            }
        }
    }
}

/// Q4_0 and IQ4_NL at the bounds of the lane-per-row kernels' integer sums (every nibble
/// 15 or 0 against activation quants of -128 or 127: the AVX2 kernel's i16 pair sums
/// reach -30720), over more activation rows than one block sums table holds (the kernels
/// then take the rows in chunks), bit for bit against the twins at every level. IQ4_NL's
/// lowest quant is -127: on plain AVX2 its kernel's sign trick (ggml's) wraps -128, which
/// ggml's quantizers never make.
#[test]
fn rows_kernels_at_extreme_quants_and_over_table_chunks_equal_the_scalar_twins() {
    let n = 2048; // 64 blocks: a table holds 64 activation rows
    let (rows, tokens) = (17, 70);
    let blocks = n / 32;
    for ty in [GgmlType::Q4_0, GgmlType::IQ4_NL] {
        let row_bytes = ty.row_bytes(n as u64).expect("whole blocks") as usize;
        let mut packed = vec![0u8; rows * row_bytes];
        for (r, row) in packed.chunks_mut(row_bytes).enumerate() {
            for (b, block) in row.chunks_mut(18).enumerate() {
                let d = half::f16::from_f32(0.5 + (r * 7 + b) as f32 * 1e-3);
                block[..2].copy_from_slice(&d.to_le_bytes());
                let nibbles = match (r + b) % 3 {
                    0 => 0xff,
                    1 => 0x00,
                    _ => ((r * 5 + b) % 256) as u8,
                };
                block[2..].fill(nibbles);
            }
        }
        let activation_bytes = blocks * 34;
        let mut activations = vec![0u8; tokens * activation_bytes];
        for (t, row) in activations.chunks_mut(activation_bytes).enumerate() {
            for (b, block) in row.chunks_mut(34).enumerate() {
                let d = half::f16::from_f32(0.25 + (t + b) as f32 * 1e-3);
                block[..2].copy_from_slice(&d.to_le_bytes());
                let lowest = if ty == GgmlType::Q4_0 { -128 } else { -127 };
                let quant: i8 = match (t + 2 * b) % 4 {
                    0 => lowest,
                    1 => 127,
                    2 => -127,
                    _ => (((t * 3 + b) % 255) as i16 - 127) as i8,
                };
                block[2..].fill(quant as u8);
            }
        }
        rows_kernels_equal_twins(ty, n, (&packed, row_bytes), &activations, "extreme");
    }
}

/// Both rows kernels of `ty` at every level this CPU has, on `packed` weight rows of
/// `row_bytes` against every activation row of `activations`, bit for bit against the twins.
fn rows_kernels_equal_twins(
    ty: GgmlType,
    n: usize,
    (packed, row_bytes): (&[u8], usize),
    activations: &[u8],
    what: &str,
) {
    let format = activation_format(ty).expect("format");
    let activation_bytes = activation_row_bytes(format, n);
    let (rows, tokens) = (
        packed.len() / row_bytes,
        activations.len() / activation_bytes,
    );
    let (twin_gemv, twin_gemm) = repack_dot_fn(ty).expect("repacked type");
    let want = |twin: DotFn| -> Vec<u32> {
        activations
            .chunks(activation_bytes)
            .flat_map(|a| {
                packed
                    .chunks(row_bytes)
                    .map(move |w| twin(n, w, a).to_bits())
            })
            .collect()
    };
    let (want_gemv, want_gemm) = (want(twin_gemv), want(twin_gemm));
    for level in SimdLevel::ALL.into_iter().filter(|l| l.is_available()) {
        let (gemv, gemm) = repack_rows_fn(ty, level).expect("kernels");
        for (kernel, want) in [(gemv, &want_gemv), (gemm, &want_gemm)] {
            let mut out = vec![f32::NAN; rows * tokens];
            kernel(n, packed, activations, &mut out);
            let got: Vec<u32> = out.iter().map(|v| v.to_bits()).collect();
            let first = got.iter().zip(want.iter()).position(|(a, b)| a != b);
            assert_eq!(first, None, "{ty} {what} at {level:?}: first difference");
        }
    }
}
