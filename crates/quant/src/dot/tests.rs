//! Every SIMD kernel against its scalar twin (bit for bit), every scalar twin against
//! `dequantize(weight) . dequantize(activation)` in f64, multi-row kernels against
//! single-row ones, on random rows with odd block counts.

use super::*;
use crate::{dequantize, quantize};

pub(crate) use super::WEIGHT_TYPES as DOT_TYPES;

/// A small deterministic generator (xorshift64*).
struct Random(u64);

impl Random {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform in [-1, 1).
    fn uniform(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }

    /// Roughly normal, occasionally with an outlier.
    fn value(&mut self) -> f32 {
        let v = (0..4).map(|_| self.uniform()).sum::<f32>();
        if self.next().is_multiple_of(97) {
            v * 8.0
        } else {
            v
        }
    }
}

/// Byte offsets of the f16 scale fields inside one block.
fn scale_offsets(ty: GgmlType) -> &'static [usize] {
    use GgmlType::*;
    match ty {
        Q4_0 | Q5_0 | Q8_0 | IQ4_NL | IQ4_XS => &[0],
        Q4_1 | Q5_1 | Q4_K | Q5_K => &[0, 2],
        Q2_K => &[80, 82],
        Q3_K => &[108],
        Q6_K => &[208],
        _ => &[],
    }
}

/// A weight row of `n` elements: quantized from random floats, or (for quantized types,
/// `raw == true`) random bytes with sane f16 scales, which reaches every bit pattern.
fn weight_row(ty: GgmlType, n: usize, raw: bool, random: &mut Random) -> Vec<u8> {
    let bytes = ty.row_bytes(n as u64).expect("whole blocks") as usize;
    let mut row = vec![0u8; bytes];
    if raw && ty.is_quantized() {
        row.iter_mut().for_each(|b| *b = random.next() as u8);
        for block in row.chunks_exact_mut(ty.type_size()) {
            for &offset in scale_offsets(ty) {
                let scale = half::f16::from_f32(random.uniform() * 0.05);
                block[offset..offset + 2].copy_from_slice(&scale.to_le_bytes());
            }
        }
    } else {
        let values: Vec<f32> = (0..n).map(|_| random.value()).collect();
        quantize(ty, &values, &mut row).expect("quantizable type");
    }
    row
}

/// `weight_rows` weight rows of `n` elements (row `r` of random bytes where `raw(r)`) and
/// `activation_rows` activation rows of random values, each set back to back.
fn random_rows(
    ty: GgmlType,
    n: usize,
    weight_rows: usize,
    activation_rows: usize,
    raw: impl Fn(usize) -> bool,
    random: &mut Random,
) -> (Vec<u8>, Vec<u8>) {
    let weights: Vec<u8> = (0..weight_rows)
        .flat_map(|r| weight_row(ty, n, raw(r), random))
        .collect();
    let x: Vec<f32> = (0..n * activation_rows).map(|_| random.value()).collect();
    let activations = x
        .chunks(n)
        .flat_map(|row| activation_row(ty, row))
        .collect();
    (weights, activations)
}

fn activation_row(ty: GgmlType, x: &[f32]) -> Vec<u8> {
    let format = activation_format(ty).expect("dot type");
    let mut row = vec![0u8; activation_row_bytes(format, x.len())];
    quantize_activation(format, x, &mut row);
    row
}

/// Element counts with odd block counts (and, for float types, ragged tails).
fn lengths(ty: GgmlType) -> Vec<usize> {
    match ty.block_size() {
        1 => vec![1, 31, 33, 96, 577],
        32 => vec![32, 96, 224, 576],
        _ => vec![256, 768, 1280],
    }
}

fn levels() -> Vec<SimdLevel> {
    SimdLevel::ALL
        .into_iter()
        .filter(|level| *level != SimdLevel::Scalar && level.is_available())
        .collect()
}

#[test]
fn every_simd_kernel_equals_its_scalar_twin_bit_for_bit() {
    let mut random = Random(0x9e37_79b9_7f4a_7c15);
    let mut compared = 0;
    for ty in DOT_TYPES {
        for n in lengths(ty) {
            for raw in [false, true] {
                let w = weight_row(ty, n, raw, &mut random);
                let x: Vec<f32> = (0..n).map(|_| random.value()).collect();
                let a = activation_row(ty, &x);
                for level in levels() {
                    let expected = twin_dot_fn(ty, level).expect("scalar twin")(n, &w, &a);
                    let kernel = dot_fn(ty, level).expect("a kernel at every level");
                    let got = kernel(n, &w, &a);
                    assert_eq!(
                        got.to_bits(),
                        expected.to_bits(),
                        "{ty} n={n} raw={raw} {level:?}: {got} vs scalar {expected}"
                    );
                    compared += 1;
                }
            }
        }
    }
    if !levels().is_empty() {
        assert!(compared > 100);
    }
}

#[test]
fn scalar_twins_match_dequantized_f64_dot() {
    let mut random = Random(0x1234_5678_9abc_def1);
    for ty in DOT_TYPES {
        let scalar = dot_fn(ty, SimdLevel::Scalar).expect("scalar twin");
        let format = activation_format(ty).expect("dot type");
        for n in lengths(ty) {
            for raw in [false, true] {
                let w = weight_row(ty, n, raw, &mut random);
                let x: Vec<f32> = (0..n).map(|_| random.value()).collect();
                let a = activation_row(ty, &x);
                let mut wf = vec![0.0f32; n];
                dequantize(ty, &w, &mut wf).expect("dequantizable weight");
                let mut af = vec![0.0f32; n];
                dequantize(format.ggml_type(), &a, &mut af).expect("dequantizable activation");
                let exact: f64 = wf
                    .iter()
                    .zip(&af)
                    .map(|(p, q)| f64::from(*p) * f64::from(*q))
                    .sum::<f64>()
                    + q8_1_sum_correction(ty, &w, &a, &af);
                let magnitude: f64 = wf
                    .iter()
                    .zip(&af)
                    .map(|(p, q)| (f64::from(*p) * f64::from(*q)).abs())
                    .sum();
                let got = f64::from(scalar(n, &w, &a));
                // F16 sums in native f16 (as the AVX512-FP16 reference does): one f16
                // rounding per 128-element step and per reduction level.
                let relative = if ty == GgmlType::F16 {
                    2f64.powi(-11) * ((n / 128) as f64 + 8.0)
                } else {
                    2e-5
                };
                assert!(
                    (got - exact).abs() <= relative * magnitude + 1e-6,
                    "{ty} n={n} raw={raw}: {got} vs {exact} (magnitude {magnitude})"
                );
            }
        }
    }
}

/// Q4_1 / Q5_1 meet the activation sum through Q8_1's f16 `s = d * sum(q)`, not through
/// the dequantized values: `m * s` replaces `m * sum(a)` per block.
fn q8_1_sum_correction(ty: GgmlType, w: &[u8], a: &[u8], af: &[f32]) -> f64 {
    if activation_format(ty) != Some(ActivationFormat::Q8_1) {
        return 0.0;
    }
    let f16_at = |bytes: &[u8], at: usize| {
        f64::from(half::f16::from_le_bytes([bytes[at], bytes[at + 1]]).to_f32())
    };
    let mut correction = 0.0;
    for (i, values) in af.chunks(32).enumerate() {
        let m = f16_at(w, i * ty.type_size() + 2);
        let s = f16_at(a, i * 36 + 2);
        let sum: f64 = values.iter().map(|v| f64::from(*v)).sum();
        correction += m * (s - sum);
    }
    correction
}

#[test]
fn activation_quantization_keeps_values_close() {
    let mut random = Random(7);
    for format in [
        ActivationFormat::Q8_0,
        ActivationFormat::Q8_1,
        ActivationFormat::Q8K,
    ] {
        let n = 512;
        let x: Vec<f32> = (0..n).map(|_| random.value()).collect();
        let mut row = vec![0u8; activation_row_bytes(format, n)];
        quantize_activation(format, &x, &mut row);
        let mut back = vec![0.0f32; n];
        dequantize(format.ggml_type(), &row, &mut back).expect("dequantizable activation");
        let block = format.block_size();
        for (xs, bs) in x.chunks(block).zip(back.chunks(block)) {
            let amax = xs.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            for (v, b) in xs.iter().zip(bs) {
                assert!(
                    (v - b).abs() <= amax / 127.0 * 0.51 + amax * 1e-3,
                    "{format:?} {v} {b}"
                );
            }
        }
    }
}

#[test]
fn multi_row_kernels_equal_single_row_kernels() {
    let mut random = Random(0xfeed_beef);
    for ty in DOT_TYPES {
        let n = lengths(ty)[1];
        let w = weight_row(ty, n, true, &mut random);
        let rows = 9;
        let x: Vec<f32> = (0..n * rows).map(|_| random.value()).collect();
        let activations: Vec<u8> = x
            .chunks(n)
            .flat_map(|row| activation_row(ty, row))
            .collect();
        let row_bytes = activations.len() / rows;
        let mut levels = levels();
        levels.push(SimdLevel::Scalar);
        for level in levels {
            let single = dot_fn(ty, level).expect("single-row kernel");
            let multi = multi_dot_fn(ty, level).expect("multi-row kernel");
            for count in 1..=rows {
                let mut out = vec![0.0f32; count];
                multi(n, &w, &activations[..count * row_bytes], &mut out);
                for (c, value) in out.iter().enumerate() {
                    let expected = single(n, &w, &activations[c * row_bytes..(c + 1) * row_bytes]);
                    assert_eq!(
                        value.to_bits(),
                        expected.to_bits(),
                        "{ty} {level:?} {count} rows, row {c}"
                    );
                }
            }
        }
    }
}

#[test]
fn gemv_and_tile_kernels_equal_the_scalar_twin() {
    let mut random = Random(0x0dd_ba11);
    let mut compared = 0;
    for ty in DOT_TYPES {
        let Some(format) = activation_format(ty) else {
            continue;
        };
        for n in lengths(ty) {
            let rows = 19;
            let (weights, activations) =
                random_rows(ty, n, rows, rows, |r| r % 2 == 1, &mut random);
            let w_bytes = weights.len() / rows;
            let a_bytes = activations.len() / rows;
            let len = block_scales_len(n, rows);
            let (mut d, mut s) = (vec![f32::NAN; len], vec![f32::NAN; len]);
            let has_tables = block_scales(format, &activations, rows, n, &mut d, &mut s);
            // The quant table in both layouts; each level's kernels read theirs.
            let tables: Vec<(QuantLayout, Vec<u8>)> = [QuantLayout::Rows, QuantLayout::Pairs]
                .into_iter()
                .map(|layout| {
                    let mut quants = vec![0xa5u8; block_quants_len(n, rows)];
                    let has_quants =
                        block_quants(format, &activations, rows, n, &mut quants, layout);
                    assert_eq!(
                        has_quants, has_tables,
                        "{ty}: quant and scale tables go together"
                    );
                    (layout, quants)
                })
                .collect();
            let mut offsets = vec![0.0f32; d.len()];
            let offsets: &[f32] = if block_offsets(&d, &mut offsets) {
                &offsets
            } else {
                &[]
            };
            let plain = BlockScales {
                d: &d,
                s: &s,
                quants: &[],
                stride: rows,
                layout: QuantLayout::Rows,
                offsets: &[],
            };
            let mut levels = levels();
            levels.push(SimdLevel::Scalar);
            for level in levels {
                let scalar = twin_dot_fn(ty, level).expect("scalar twin");
                let layout = QuantLayout::for_level(level);
                let table = |wanted: QuantLayout| {
                    let (layout, quants) = tables
                        .iter()
                        .find(|(layout, _)| *layout == wanted)
                        .expect("both layouts made");
                    BlockScales {
                        quants,
                        layout: *layout,
                        ..plain
                    }
                };
                let with_quants = table(layout);
                // The pair kernel's offsets too (the 4-bit formats' exact products).
                let with_offsets = BlockScales {
                    offsets,
                    ..with_quants
                };
                let other = table(match layout {
                    QuantLayout::Rows => QuantLayout::Pairs,
                    QuantLayout::Pairs => QuantLayout::Rows,
                });
                if let Some(gemv) = gemv_fn(ty, level) {
                    for count in 1..=rows {
                        let a = &activations[(count - 1) * a_bytes..count * a_bytes];
                        let mut out = vec![0.0f32; count];
                        gemv(n, &weights[..count * w_bytes], a, &mut out);
                        for (r, value) in out.iter().enumerate() {
                            let expected = scalar(n, &weights[r * w_bytes..(r + 1) * w_bytes], a);
                            assert_eq!(
                                value.to_bits(),
                                expected.to_bits(),
                                "gemv {ty} n={n} {level:?} {count} rows, row {r}"
                            );
                            compared += 1;
                        }
                    }
                }
                if let Some(tile_rows) = tile_rows_fn(ty, level) {
                    for first in [0, 2, 3] {
                        for count in [1, 2, 7, 16, rows - first] {
                            let a = &activations[first * a_bytes..(first + count) * a_bytes];
                            let mut out = vec![0.0f32; rows * count];
                            assert!(
                                !tile_rows(
                                    n,
                                    &weights,
                                    a,
                                    plain.from_row(first),
                                    TileOut::new(&mut out, rows)
                                ),
                                "tile_rows {ty} runs without block-major quants"
                            );
                            assert!(
                                !tile_rows(
                                    n,
                                    &weights,
                                    a,
                                    other.from_row(first),
                                    TileOut::new(&mut out, rows)
                                ),
                                "tile_rows {ty} {level:?} runs on the other layout"
                            );
                            // A paired table cannot start at an odd row: the caller then
                            // loops over the tile kernel.
                            let runs = !(layout == QuantLayout::Pairs && first % 2 == 1);
                            assert_eq!(
                                tile_rows(
                                    n,
                                    &weights,
                                    a,
                                    with_quants.from_row(first),
                                    TileOut::new(&mut out, rows)
                                ),
                                runs,
                                "tile_rows {ty} {level:?} from row {first}"
                            );
                            if !runs {
                                continue;
                            }
                            for r in 0..rows {
                                let w = &weights[r * w_bytes..(r + 1) * w_bytes];
                                for (c, value) in out.iter().skip(r).step_by(rows).enumerate() {
                                    let row = first + c;
                                    let expected = scalar(
                                        n,
                                        w,
                                        &activations[row * a_bytes..(row + 1) * a_bytes],
                                    );
                                    assert_eq!(
                                        value.to_bits(),
                                        expected.to_bits(),
                                        "tile_rows {ty} n={n} {level:?} rows {first}+{count}, weight row {r}, row {c}"
                                    );
                                    compared += 1;
                                }
                            }
                        }
                    }
                }
                if let Some(tile) = tile_fn(ty, level) {
                    assert!(has_tables, "{ty} has a tile kernel but no scale tables");
                    let w = &weights[..w_bytes];
                    for (first, scales) in (0..rows)
                        .flat_map(|f| [(f, plain), (f, with_quants), (f, with_offsets), (f, other)])
                    {
                        for count in 1..=rows - first {
                            let a = &activations[first * a_bytes..(first + count) * a_bytes];
                            let mut out = vec![0.0f32; count];
                            tile(n, w, a, scales.from_row(first), &mut out);
                            for (c, value) in out.iter().enumerate() {
                                let row = first + c;
                                let expected =
                                    scalar(n, w, &activations[row * a_bytes..(row + 1) * a_bytes]);
                                assert_eq!(
                                    value.to_bits(),
                                    expected.to_bits(),
                                    "tile {ty} n={n} {level:?} rows {first}+{count}, row {c}"
                                );
                                compared += 1;
                            }
                        }
                    }
                }
            }
        }
    }
    assert!(compared > 1000, "{compared} comparisons");
}

#[test]
fn unavailable_levels_fall_back() {
    for ty in DOT_TYPES {
        for level in SimdLevel::ALL {
            assert!(dot_fn(ty, level).is_some(), "{ty} {level:?}");
            assert!(multi_dot_fn(ty, level).is_some(), "{ty} {level:?}");
        }
    }
    assert!(dot_fn(GgmlType::Q8_K, SimdLevel::Scalar).is_none());
    assert!(dot_fn(GgmlType::IQ2_XXS, SimdLevel::detect()).is_none());
}

/// The several-weight-rows kernels over more rows than one pass of widened weight scales
/// holds, and over rows too long for that pass's buffer, still equal the scalar twin.
#[test]
fn tile_rows_kernels_equal_the_scalar_twin_past_one_scale_pass() {
    let mut random = Random(0x5ca1e);
    for ty in [GgmlType::Q4_1, GgmlType::Q8_0] {
        // 131 and 133 rows: passes of 12, the last of 11 (threes or pairs of weight rows,
        // then two or one) or 1; rows of 1056 blocks take a heap buffer.
        for (n, rows) in [(576, 131), (576, 133), (32 * 1056, 3)] {
            let tokens = 8;
            let (weights, activations) = random_rows(ty, n, rows, tokens, |_| false, &mut random);
            tile_rows_equal_the_scalar_twin(ty, n, &weights, &activations, tokens);
        }
    }
}

/// The pair kernels' unpacking of 4-bit weights without VBMI (one permute, a shift and a
/// mask instead of `vpmultishiftqb` and a mask) gives the same results.
#[cfg(target_arch = "x86_64")]
#[test]
fn pair_kernels_without_vbmi_equal_the_scalar_twin() {
    use std::sync::atomic::Ordering;
    let mut random = Random(0x0b_e71);
    super::x86::pairs::WITHOUT_VBMI.store(true, Ordering::Relaxed);
    for ty in [GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q8_0] {
        let (n, rows, tokens) = (96, 7, 8);
        let (weights, activations) = random_rows(ty, n, rows, tokens, |r| r % 2 == 1, &mut random);
        tile_rows_equal_the_scalar_twin(ty, n, &weights, &activations, tokens);
    }
    super::x86::pairs::WITHOUT_VBMI.store(false, Ordering::Relaxed);
}

/// The 4-bit formats' pair kernel takes `sum * d_a` as exact (see its `exact_products`):
/// the largest lane sums (quants at their extremes) against scales across f16's whole
/// finite range, subnormals and the largest included, still equal the scalar twin.
#[test]
fn tile_rows_kernels_equal_the_scalar_twin_at_extreme_quants_and_scales() {
    extreme_quants_and_scales(0xe7_7e3e, false);
}

/// As the test above with some weight and activation scales infinite.
#[test]
fn tile_rows_kernels_equal_the_scalar_twin_at_infinite_scales() {
    extreme_quants_and_scales(0x1_1f, true);
}

/// One infinite activation scale among finite ones, where every product is positive: the
/// reference's `(d_w * d_a) * sum` is then `+inf` (the exact products' `inf - inf` would
/// give NaN), and so must the pair kernel's result be (it takes the other arithmetic).
#[test]
fn tile_rows_kernels_keep_an_infinite_activation_scale_infinite() {
    let (n, rows, tokens) = (96, 4, 8);
    for ty in [GgmlType::Q4_0, GgmlType::Q4_1] {
        let block = ty.type_size();
        let mut weights = vec![0u8; rows * n / 32 * block];
        for b in weights.chunks_exact_mut(block) {
            b[..2].copy_from_slice(&0x3c00u16.to_le_bytes()); // d = 1
                                                              // Quants 1 (Q4_1 nibbles 1; Q4_0 nibbles 9, less 8), m = 0.
            let first = scale_offsets(ty).len() * 2;
            let nibbles = if ty == GgmlType::Q4_0 { 0x99 } else { 0x11 };
            b[first..].fill(nibbles);
            if ty == GgmlType::Q4_1 {
                b[2..4].fill(0);
            }
        }
        let a_block = match activation_format(ty).expect("dot type") {
            ActivationFormat::Q8_0 => 34,
            _ => 36,
        };
        let blocks = n / 32;
        let mut activations = vec![0u8; tokens * blocks * a_block];
        for (k, b) in activations.chunks_exact_mut(a_block).enumerate() {
            let d: u16 = if k == 3 * blocks + 1 { 0x7c00 } else { 0x3c00 };
            b[..2].copy_from_slice(&d.to_le_bytes());
            let first = if a_block == 36 { 4 } else { 2 };
            b[first..].fill(1);
            if a_block == 36 {
                b[2..4].fill(0);
            }
        }
        tile_rows_equal_the_scalar_twin(ty, n, &weights, &activations, tokens);
        let scalar = dot_fn(ty, SimdLevel::Scalar).expect("scalar twin");
        let w_bytes = ty.row_bytes(n as u64).expect("whole blocks") as usize;
        let a_bytes = blocks * a_block;
        let value = scalar(
            n,
            &weights[..w_bytes],
            &activations[3 * a_bytes..4 * a_bytes],
        );
        assert_eq!(value, f32::INFINITY, "{ty}: the case this test is for");
    }
}

fn extreme_quants_and_scales(seed: u64, infinite: bool) {
    // The lowest activation quant: -128 where the pair kernel runs (exact for it too);
    // -127 for the 256-bit kernels, whose sign trick (`vpsignb`, as ggml's AVX2 code) wraps
    // -128 and which, as there, only ever see ggml's quantizers' -127..=127.
    let lowest: u8 = if SimdLevel::detect() == SimdLevel::Avx512Vnni {
        0x80
    } else {
        0x81
    };
    let mut random = Random(seed);
    let scale = |random: &mut Random| {
        let bits = match random.next() % 8 {
            0 | 1 => 0x7bff,                         // 65504, the largest
            2 | 3 => (random.next() % 0x400) as u16, // subnormal
            4 if infinite => 0x7c00,
            _ => (random.next() % 0x7c00) as u16,
        };
        let sign = if random.next().is_multiple_of(2) {
            0
        } else {
            0x8000
        };
        (bits | sign).to_le_bytes()
    };
    let extreme = |random: &mut Random, values: [u8; 2]| values[(random.next() % 2) as usize];
    let n = 96;
    let tokens = 8;
    let rows = 5;
    for ty in [GgmlType::Q4_0, GgmlType::Q4_1] {
        let (block, scales) = (ty.type_size(), scale_offsets(ty));
        let mut weights = vec![0u8; rows * n / 32 * block];
        for b in weights.chunks_exact_mut(block) {
            for &at in scales {
                b[at..at + 2].copy_from_slice(&scale(&mut random));
            }
            let first = scales.len() * 2;
            b[first..]
                .iter_mut()
                .for_each(|q| *q = extreme(&mut random, [0x00, 0xff]));
        }
        let format = activation_format(ty).expect("dot type");
        let (a_block, sums) = match format {
            ActivationFormat::Q8_0 => (34, 1),
            _ => (36, 2),
        };
        let mut activations = vec![0u8; tokens * n / 32 * a_block];
        for b in activations.chunks_exact_mut(a_block) {
            for k in 0..sums {
                b[2 * k..2 * k + 2].copy_from_slice(&scale(&mut random));
            }
            b[2 * sums..]
                .iter_mut()
                .for_each(|q| *q = extreme(&mut random, [lowest, 0x7f]));
        }
        tile_rows_equal_the_scalar_twin(ty, n, &weights, &activations, tokens);
    }
}

/// Runs this CPU's best several-weight-rows kernel for `ty` (if it has one) over all rows of
/// `weights` against `tokens` activation rows, and compares every result with the scalar
/// twin bit for bit.
fn tile_rows_equal_the_scalar_twin(
    ty: GgmlType,
    n: usize,
    weights: &[u8],
    activations: &[u8],
    tokens: usize,
) {
    let level = SimdLevel::detect();
    let (Some(format), Some(tile_rows)) = (activation_format(ty), tile_rows_fn(ty, level)) else {
        return;
    };
    let scalar = twin_dot_fn(ty, level).expect("scalar twin");
    let len = block_scales_len(n, tokens);
    let (mut d, mut s) = (vec![0.0; len], vec![0.0; len]);
    let layout = QuantLayout::for_level(level);
    let mut quants = vec![0u8; block_quants_len(n, tokens)];
    assert!(
        block_scales(format, activations, tokens, n, &mut d, &mut s)
            && block_quants(format, activations, tokens, n, &mut quants, layout)
    );
    let mut offsets = vec![0.0f32; d.len()];
    let finite = block_offsets(&d, &mut offsets);
    // With the offsets where they were made (the pair kernel's exact products for the 4-bit
    // formats), and without.
    for offsets in [if finite { &offsets[..] } else { &[] }, &[]] {
        let scales = BlockScales {
            d: &d,
            s: &s,
            quants: &quants,
            stride: tokens,
            layout,
            offsets,
        };
        compare_tile_rows(
            ty,
            n,
            weights,
            activations,
            tokens,
            scales,
            tile_rows,
            scalar,
        );
    }
}

/// [`tile_rows_equal_the_scalar_twin`] with the tables `scales`.
#[allow(clippy::too_many_arguments)]
fn compare_tile_rows(
    ty: GgmlType,
    n: usize,
    weights: &[u8],
    activations: &[u8],
    tokens: usize,
    scales: BlockScales<'_>,
    tile_rows: crate::dot::TileRowsFn,
    scalar: crate::dot::DotFn,
) {
    let w_bytes = ty.row_bytes(n as u64).expect("whole blocks") as usize;
    let rows = weights.len() / w_bytes;
    let mut out = vec![0.0f32; rows * tokens];
    assert!(tile_rows(
        n,
        weights,
        activations,
        scales,
        TileOut::new(&mut out, rows)
    ));
    let a_bytes = activations.len() / tokens;
    for r in 0..rows {
        for t in 0..tokens {
            let expected = scalar(
                n,
                &weights[r * w_bytes..(r + 1) * w_bytes],
                &activations[t * a_bytes..(t + 1) * a_bytes],
            );
            assert_eq!(
                out[t * rows + r].to_bits(),
                expected.to_bits(),
                "{ty} n={n} weight row {r} token {t}: {} vs {expected}",
                out[t * rows + r]
            );
        }
    }
}

/// `tile_tables` (one pass per row where AVX-512 and the paired layout are there) makes the
/// activation rows and all three tables exactly as the row conversion followed by
/// `block_scales` and `block_quants` does, for every block kind: ordinary values, zeros,
/// tiny (subnormal) magnitudes whose `127 / amax` overflows, infinities and NaNs.
#[test]
fn tile_tables_equal_the_separate_conversion_and_tables() {
    let mut random = Random(0x7ab1e5);
    let special = [
        0.0,
        -0.0,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        f32::from_bits(1),
        1e-40,
        f32::MAX,
    ];
    for format in [ActivationFormat::Q8_0, ActivationFormat::Q8_1] {
        for n in [32, 96, 576, 1536] {
            for rows in [1, 2, 7, 8] {
                let x: Vec<f32> = (0..rows * n)
                    .map(|i| match (i / 32 % 5, random.next() % 8) {
                        // Whole blocks of zeros, of tiny values, and some with specials.
                        (1, _) => 0.0,
                        (2, _) => 1e-40 * random.uniform(),
                        (3, k) if k < 2 => special[(random.next() % 8) as usize],
                        _ => random.value(),
                    })
                    .collect();
                let row_bytes = activation_row_bytes(format, n);
                let len = block_scales_len(n, rows);
                for layout in [QuantLayout::Rows, QuantLayout::Pairs] {
                    let mut expected_rows = vec![0u8; rows * row_bytes];
                    for (row, out) in x.chunks(n).zip(expected_rows.chunks_mut(row_bytes)) {
                        quantize_activation(format, row, out);
                    }
                    let (mut d, mut s) = (vec![f32::NAN; len], vec![f32::NAN; len]);
                    let mut quants = vec![0xa5u8; block_quants_len(n, rows)];
                    assert!(block_scales(
                        format,
                        &expected_rows,
                        rows,
                        n,
                        &mut d,
                        &mut s
                    ));
                    assert!(block_quants(
                        format,
                        &expected_rows,
                        rows,
                        n,
                        &mut quants,
                        layout
                    ));
                    let mut got_rows = vec![0x5au8; rows * row_bytes];
                    let (mut got_d, mut got_s) = (vec![f32::NAN; len], vec![f32::NAN; len]);
                    let mut got_quants = vec![0xa5u8; block_quants_len(n, rows)];
                    assert!(tile_tables(
                        format,
                        &x,
                        rows,
                        n,
                        &mut got_rows,
                        &mut got_d,
                        &mut got_s,
                        &mut got_quants,
                        layout
                    ));
                    let what = format!("{format:?} n={n} rows={rows} {layout:?}");
                    // The first differing byte (whole rows are too long to print).
                    let first_difference = |got: &[u8], expected: &[u8]| {
                        got.iter().zip(expected).position(|(g, e)| g != e)
                    };
                    assert_eq!(
                        first_difference(&got_rows, &expected_rows),
                        None,
                        "{what}: activation rows"
                    );
                    let bits = |v: &[f32]| v.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
                    assert_eq!(bits(&got_d), bits(&d), "{what}: d table");
                    if format == ActivationFormat::Q8_1 {
                        assert_eq!(bits(&got_s), bits(&s), "{what}: s table");
                    }
                    assert_eq!(
                        first_difference(&got_quants, &quants),
                        None,
                        "{what}: quant table"
                    );
                }
            }
        }
    }
}

/// F16 rows whose leftover products (past the native f16 steps) span more than f64 holds:
/// adding them in another order would round differently, so the kernels' exact leftover
/// sum must step back to adding in order; rows where it holds take it. Both equal the
/// scalar twin bit for bit.
#[test]
fn f16_leftover_sums_equal_the_ordered_sum() {
    let halves = |values: &[f32]| -> Vec<u8> {
        values
            .iter()
            .flat_map(|&v| half::f16::from_f32(v).to_le_bytes())
            .collect()
    };
    for n in [128 + 64, 128 + 17, 256 + 127, 40] {
        for case in 0..7 {
            let w: Vec<f32> = (0..n)
                .map(|i| match case {
                    // Huge and tiny products side by side: sums that round.
                    0 => {
                        if i % 2 == 0 {
                            60000.0
                        } else {
                            6.0e-8
                        }
                    }
                    1 => {
                        if i % 3 == 0 {
                            -3.0e4
                        } else {
                            1.0e-7 * (i as f32)
                        }
                    }
                    // Ordinary values: the exact sum applies.
                    2 => ((i * 37 % 101) as f32 - 50.0) * 0.013,
                    // Zeros of both signs (every product zero: the sign of the in-order sum).
                    4 => {
                        if i % 3 == 0 {
                            0.0
                        } else {
                            -0.0
                        }
                    }
                    // An infinity and a NaN among the leftovers (and maybe the native part).
                    5 => match i % 29 {
                        7 => f32::INFINITY,
                        11 if n > 100 => f32::NAN,
                        _ => 0.5,
                    },
                    // Subnormal products only.
                    6 => 6.0e-8 * (1 + i % 5) as f32,
                    _ => {
                        if i == n - 1 {
                            65504.0
                        } else {
                            1.0e-3
                        }
                    }
                })
                .collect();
            let x: Vec<f32> = (0..n)
                .map(|i| ((i * 53 % 97) as f32 - 48.0) * 0.021)
                .collect();
            let (w, a) = (halves(&w), halves(&x));
            for level in levels() {
                let expected = twin_dot_fn(GgmlType::F16, level).expect("twin")(n, &w, &a);
                let got = dot_fn(GgmlType::F16, level).expect("kernel")(n, &w, &a);
                assert_eq!(
                    got.to_bits(),
                    expected.to_bits(),
                    "n {n} case {case} {level:?}"
                );
            }
        }
    }
}

/// The float formats' several-rows kernels ([`crate::dot::plain_tile_rows_fn`]: F16 on
/// CPUs with AVX512-FP16) equal the scalar twin for every row and token: rows with and
/// without leftovers and with no native part, row counts on both sides of a 32-dot group,
/// and values whose leftover sums round in f64 (huge against tiny, subnormals), overflow,
/// cancel to zero of either sign, or hold infinities and NaNs.
#[test]
fn plain_tile_rows_kernels_equal_the_scalar_twin() {
    use crate::dot::{plain_tile_rows_fn, TileOut};
    use half::f16;
    let Some(tile_rows) = plain_tile_rows_fn(GgmlType::F16, SimdLevel::detect()) else {
        eprintln!("no several-rows F16 kernel on this CPU; nothing to compare");
        return;
    };
    let twin = twin_dot_fn(GgmlType::F16, SimdLevel::detect()).expect("scalar twin");
    let mut random = Random(0xf16_7115);
    let special = [
        f16::INFINITY,
        f16::NEG_INFINITY,
        f16::NAN,
        f16::from_bits(1),
        f16::from_bits(0x8001),
        f16::NEG_ZERO,
        f16::MAX,
        f16::from_f32(-60000.0),
    ];
    let bytes = |v: &[f16]| -> Vec<u8> { v.iter().flat_map(|h| h.to_le_bytes()).collect() };
    for n in [64, 128, 200, 576, 1536] {
        for (rows, tokens) in [(1, 1), (3, 2), (33, 5), (40, 8), (7, 13), (70, 3)] {
            for kind in 0..4 {
                let mut value = |seed: usize| -> f16 {
                    let r = random.next();
                    match kind {
                        // Ordinary values.
                        0 => f16::from_f32(random.value() * 0.1),
                        // Sums that round: large and subnormal magnitudes mixed.
                        1 => match r % 4 {
                            0 => f16::from_f32(random.uniform() * 30000.0),
                            1 => f16::from_bits((r >> 8) as u16 & 0x83ff),
                            _ => f16::from_f32(random.uniform()),
                        },
                        // Cancellation: pairs of opposite products, zeros of both signs.
                        2 => match (seed % 3, r % 3) {
                            (0, _) => f16::from_f32(0.5),
                            (1, _) => f16::from_f32(-0.5),
                            (_, 0) => f16::NEG_ZERO,
                            _ => f16::ZERO,
                        },
                        // A few specials among ordinary values.
                        _ if r.is_multiple_of(23) => special[(r >> 8) as usize % special.len()],
                        _ => f16::from_f32(random.value()),
                    }
                };
                let weights: Vec<f16> = (0..rows * n).map(&mut value).collect();
                let activations: Vec<f16> = (0..tokens * n).map(&mut value).collect();
                let (weights, activations) = (bytes(&weights), bytes(&activations));
                let mut out = vec![f32::NAN; rows * tokens];
                tile_rows(n, &weights, &activations, TileOut::new(&mut out, rows));
                for r in 0..rows {
                    for t in 0..tokens {
                        let want = twin(
                            n,
                            &weights[r * 2 * n..(r + 1) * 2 * n],
                            &activations[t * 2 * n..(t + 1) * 2 * n],
                        );
                        let got = out[t * rows + r];
                        assert!(
                            got.to_bits() == want.to_bits(),
                            "n {n} kind {kind} row {r} of {rows} token {t} of {tokens}: \
                             {got} vs {want}"
                        );
                    }
                }
            }
        }
    }
}
