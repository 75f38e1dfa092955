use super::scalar::{dpbf16_lane, reduce16};
use super::*;
use crate::dot::{activation_format, dot_fn};
use crate::quantize;

const TYPES: [GgmlType; 7] = [
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::Q8_0,
    GgmlType::Q4_0,
    GgmlType::Q5_0,
    GgmlType::IQ4_NL,
];

/// Deterministic values of varied magnitude (so that summation order shows).
fn values(len: usize, seed: u32) -> Vec<f32> {
    let mut state = seed.wrapping_mul(2654435761).wrapping_add(1);
    (0..len)
        .map(|i| {
            state ^= state << 13;
            state ^= state >> 17;
            state ^= state << 5;
            let unit = (state >> 8) as f32 / (1u32 << 24) as f32 - 0.5;
            unit * (1.0 + (i % 7) as f32 * 3.0)
        })
        .collect()
}

fn weights(ty: GgmlType, n: usize, rows: usize, seed: u32) -> Vec<u8> {
    let w = values(n * rows, seed);
    let mut bytes = vec![0u8; rows * ty.row_bytes(n as u64).unwrap() as usize];
    quantize(ty, &w, &mut bytes).unwrap();
    bytes
}

fn prepared(ty: GgmlType, x: &[f32], n: usize, tokens: usize) -> Vec<u8> {
    let unit = unit_tokens(ty);
    let unit_bytes = prepared_unit_bytes(ty, n);
    let mut out = vec![0u8; tokens.div_ceil(unit) * unit_bytes];
    for (u, bytes) in out.chunks_exact_mut(unit_bytes).enumerate() {
        let rows = (tokens - u * unit).min(unit);
        prepare(ty, &x[u * unit * n..(u * unit + rows) * n], n, bytes);
    }
    out
}

/// The seeds of the weights and activations that [`run`] uses.
fn seeds(n: usize, rows: usize, tokens: usize) -> (u32, u32) {
    ((n * 31 + rows) as u32, (tokens * 7 + n) as u32)
}

fn run(ty: GgmlType, level: SimdLevel, n: usize, rows: usize, tokens: usize) -> Vec<f32> {
    let (w_seed, x_seed) = seeds(n, rows, tokens);
    let w = weights(ty, n, rows, w_seed);
    let x = values(n * tokens, x_seed);
    outputs(ty, level, n, &w, &x, tokens)
}

/// The kernel of `ty` at `level` on weight rows `w` (bytes of `ty`) and activations `x`.
fn outputs(
    ty: GgmlType,
    level: SimdLevel,
    n: usize,
    w: &[u8],
    x: &[f32],
    tokens: usize,
) -> Vec<f32> {
    let rows = w.len() / ty.row_bytes(n as u64).unwrap() as usize;
    let prepared = prepared(ty, x, n, tokens);
    let mut out = vec![f32::NAN; rows * tokens];
    kernel(ty, level).expect("kernel")(n, w, &prepared, tokens, &mut out);
    out
}

fn same_bits(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(a, b)| a.to_bits() == b.to_bits())
}

#[test]
fn every_level_matches_the_scalar_twin_bit_for_bit() {
    for ty in TYPES {
        for level in SimdLevel::ALL.into_iter().filter(|l| l.is_available()) {
            if kernel(ty, level).is_none() {
                continue;
            }
            for (n, rows, tokens) in [
                (64, 4, 2),
                (128, 8, 13),
                (256, 12, 7),
                (96, 5, 9),
                (32, 3, 1),
                (16, 4, 3),
                (48, 7, 5),
                (32, 1, 4),
                (160, 9, 17),
                (576, 6, 11),
                (1024, 5, 21),
            ] {
                if n % 32 != 0 && (ty == GgmlType::BF16 || is_q0(ty)) {
                    continue;
                }
                let ours = run(ty, level, n, rows, tokens);
                let twin = run(ty, SimdLevel::Scalar, n, rows, tokens);
                assert!(
                    same_bits(&ours, &twin),
                    "{ty} {level:?} n={n} rows={rows} tokens={tokens}"
                );
            }
        }
    }
}

#[test]
fn q8_0_q4_0_q5_0_equal_their_vec_dot() {
    for ty in [GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::Q5_0] {
        let (n, rows, tokens) = (160, 3, 5);
        let (w_seed, x_seed) = seeds(n, rows, tokens);
        let w = weights(ty, n, rows, w_seed);
        let x = values(n * tokens, x_seed);
        let ours = run(ty, SimdLevel::Scalar, n, rows, tokens);
        let format = activation_format(ty).unwrap();
        let dot = dot_fn(ty, SimdLevel::Scalar).unwrap();
        let row_bytes = w.len() / rows;
        for t in 0..tokens {
            let mut a = vec![0u8; activation_row_bytes(format, n)];
            quantize_activation(format, &x[t * n..(t + 1) * n], &mut a);
            for r in 0..rows {
                let want = dot(n, &w[r * row_bytes..(r + 1) * row_bytes], &a);
                assert_eq!(
                    ours[t * rows + r].to_bits(),
                    want.to_bits(),
                    "{ty} r={r} t={t}"
                );
            }
        }
    }
}

#[test]
fn float_outputs_follow_sixteen_lanes_and_the_avx512_reduction() {
    let (n, rows, tokens) = (48, 4, 2);
    let (w_seed, x_seed) = seeds(n, rows, tokens);
    let w = weights(GgmlType::F32, n, rows, w_seed);
    let x = values(n * tokens, x_seed);
    let ours = run(GgmlType::F32, SimdLevel::Scalar, n, rows, tokens);
    let wf: &[f32] = bytemuck::cast_slice(&w);
    for r in 0..rows {
        for t in 0..tokens {
            let mut lanes = [0.0f32; 16];
            for i in 0..n {
                lanes[i % 16] = wf[r * n + i].mul_add(x[t * n + i], lanes[i % 16]);
            }
            let mut eight = [0.0f32; 8];
            for q in 0..8 {
                eight[q] = lanes[q] + lanes[q + 8];
            }
            let quad: [f32; 4] = std::array::from_fn(|q| eight[q] + eight[q + 4]);
            let want = (quad[0] + quad[2]) + (quad[1] + quad[3]);
            assert_eq!(ours[t * rows + r].to_bits(), want.to_bits());
            assert_eq!(reduce16(&lanes).to_bits(), want.to_bits());
        }
    }
}

#[test]
fn dpbf16_takes_the_odd_element_first() {
    // 1 + (-1) + 2^-30 is 2^-30 in that order, 0 the other way round.
    let tiny = 2.0f32.powi(-30);
    assert_eq!(dpbf16_lane(1.0, [tiny, -1.0], [1.0, 1.0]), tiny);
    assert_eq!(
        dpbf16_lane(0.0, [f32::from_bits(1 << 16), 1.0], [1.0, 0.0]),
        0.0
    );
}

#[test]
fn acceptance_follows_llamafile() {
    assert!(!accepts(GgmlType::F16, 64, 8, 1));
    assert!(accepts(GgmlType::F16, 64, 8, 2));
    assert!(!accepts(GgmlType::F16, 64, 6, 2));
    assert!(!accepts(GgmlType::F16, 40, 8, 2));
    assert!(!accepts(GgmlType::BF16, 48, 8, 2));
    assert!(accepts(GgmlType::Q8_0, 64, 3, 2));
    assert!(!accepts(GgmlType::Q4_1, 64, 4, 2));
}

#[test]
fn bf16_kernels_take_the_odd_element_first() {
    // Lane 0 holds 1 after the first step; the second adds -1 (odd element) and 2^-30
    // (even element): 2^-30 when the odd one comes first, 0 otherwise.
    let n = 64;
    let mut w = vec![0.0f32; 4 * n];
    w[0] = 1.0;
    w[33] = -1.0;
    w[32] = 2.0f32.powi(-30);
    let mut bytes = vec![0u8; 4 * n * 2];
    quantize(GgmlType::BF16, &w, &mut bytes).unwrap();
    let x = vec![1.0f32; 2 * n];
    let prepared = prepared(GgmlType::BF16, &x, n, 2);
    for level in SimdLevel::ALL.into_iter().filter(|l| l.is_available()) {
        let mut out = vec![f32::NAN; 8];
        kernel(GgmlType::BF16, level).unwrap()(n, &bytes, &prepared, 2, &mut out);
        assert_eq!(out[0], 2.0f32.powi(-30), "{level:?}");
    }
}

#[test]
fn simd_preparation_equals_the_portable_one() {
    for (n, rows) in [(32, 1), (96, 2), (256, 2), (64, 1)] {
        let mut x = values(n * rows, n as u32);
        x[5] = 0.0;
        if n >= 64 {
            x[32..64].fill(0.0);
        }
        let mut fast = vec![1u8; prepared_unit_bytes(GgmlType::Q8_0, n)];
        let mut portable = vec![2u8; fast.len()];
        prepare(GgmlType::Q8_0, &x, n, &mut fast);
        super::prepare_q0_scalar(&x, n, rows, &mut portable);
        assert_eq!(fast, portable, "n={n} rows={rows}");
    }
}

/// Rows of [`values`] scaled row by row by the powers of two `exponents` (cycled), so that
/// products and partial sums reach f32's (and f16's) denormal range.
fn tiny_values(n: usize, rows: usize, seed: u32, exponents: &[i32]) -> Vec<f32> {
    let mut x = values(n * rows, seed);
    for (row, chunk) in x.chunks_exact_mut(n).enumerate() {
        let scale = 2.0f32.powi(exponents[row % exponents.len()]);
        chunk.iter_mut().for_each(|v| *v *= scale);
    }
    x
}

#[test]
fn float_kernels_match_the_twin_on_denormals() {
    for ty in [GgmlType::F32, GgmlType::F16, GgmlType::BF16] {
        // AVX-512 without AVX512_BF16 emulates `vdpbf16ps` without its flushing.
        let levels = SimdLevel::ALL.into_iter().filter(|l| {
            l.is_available()
                && !(ty == GgmlType::BF16 && matches!(l, SimdLevel::Avx512 | SimdLevel::Avx512Vnni))
        });
        for level in levels {
            for (n, rows, tokens) in [(64, 6, 5), (96, 5, 7), (32, 8, 9)] {
                let (w_seed, x_seed) = seeds(n, rows, tokens);
                let w_values = tiny_values(n, rows, w_seed, &[0, -64, -12, -75, -20, -130]);
                let mut w = vec![0u8; rows * ty.row_bytes(n as u64).unwrap() as usize];
                quantize(ty, &w_values, &mut w).unwrap();
                let x = tiny_values(n, tokens, x_seed, &[-70, 0, -8, -64, -140, -16, -60]);
                let ours = outputs(ty, level, n, &w, &x, tokens);
                let twin = outputs(ty, SimdLevel::Scalar, n, &w, &x, tokens);
                assert!(
                    same_bits(&ours, &twin),
                    "{ty} {level:?} n={n} rows={rows} tokens={tokens}"
                );
            }
        }
    }
}

#[test]
fn bf16_kernels_flush_denormals_as_vdpbf16ps() {
    // Row 0 holds the smallest bf16 denormal (read as zero), row 1 2^-70; token 0 holds
    // 2^100, token 1 2^-70 (2^-70 * 2^-70 = 2^-140 is flushed), all at element 1.
    let n = 32;
    let mut w = vec![0u8; 2 * 2 * n];
    w[2..4].copy_from_slice(&1u16.to_le_bytes());
    let tiny = (2.0f32.powi(-70).to_bits() >> 16) as u16;
    w[2 * n + 2..2 * n + 4].copy_from_slice(&tiny.to_le_bytes());
    let mut x = vec![0.0f32; 2 * n];
    x[1] = 2.0f32.powi(100);
    x[n + 1] = 2.0f32.powi(-70);
    let want = [0.0, 2.0f32.powi(30), 0.0, 0.0];
    let levels = [SimdLevel::Scalar, SimdLevel::Avx2, SimdLevel::AvxVnni];
    for level in levels.into_iter().filter(|l| l.is_available()) {
        let ours = outputs(GgmlType::BF16, level, n, &w, &x, 2);
        assert!(same_bits(&ours, &want), "{level:?}: {ours:?}");
    }
}
