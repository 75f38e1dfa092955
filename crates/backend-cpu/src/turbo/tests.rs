//! The AVX-512 kernels against their scalar twins (bit for bit), the code-domain scores
//! against decoding the block, and the whole attention against softmax attention over the
//! decoded rows.

use runit_backend::turbo::{self, TurboLayout, BLOCK};
use runit_backend::KvRole;

use super::chunk::{self, Queries, Side};
use super::*;
use crate::storage::CpuKv;

fn values(seed: u64) -> [f32; BLOCK] {
    let mut state = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    std::array::from_fn(|_| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    })
}

/// `rows` cache rows of `blocks` blocks of `layout` encoded from random values (a few
/// large channels among them, as LLM keys have).
fn cache(layout: TurboLayout, rows: usize, blocks: usize, seed: u64) -> Vec<u8> {
    let mut bytes = vec![0u8; rows * layout.row_bytes(blocks)];
    for (r, row) in bytes.chunks_exact_mut(layout.row_bytes(blocks)).enumerate() {
        let x: Vec<f32> = (0..blocks)
            .flat_map(|b| {
                let mut v = values(seed * 10_000 + (r * blocks + b) as u64);
                v[(r + 3 * b) % BLOCK] *= 9.0;
                v
            })
            .collect();
        turbo::encode_row(layout, &x, row);
    }
    bytes
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

#[cfg(target_arch = "x86_64")]
#[test]
fn avx512_kernels_equal_their_scalar_twins() {
    if !x86::available() {
        eprintln!("skipped: this CPU lacks AVX-512 F, BW and VBMI");
        return;
    }
    let rows = 45;
    for (key_bits, value_bits) in [(4, 4), (3, 3), (4, 3), (3, 4), (2, 1)] {
        for blocks in [1, 2] {
            let head_dim = blocks * BLOCK;
            let key_layout = TurboLayout::new(key_bits, KvRole::Keys);
            let value_layout = TurboLayout::new(value_bits, KvRole::Values);
            // Two KV heads a row; the kernels read the second.
            let key_bytes = cache(key_layout, rows, 2 * blocks, key_bits as u64);
            let value_bytes = cache(value_layout, rows, 2 * blocks, 7 + value_bits as u64);
            let side = |bytes, layout| Side::new(bytes, layout, 2 * blocks, blocks, blocks);
            let keys = side(&key_bytes, key_layout);
            let values_side = side(&value_bytes, value_layout);
            // Out of order, as a block table makes them.
            let cells: Vec<usize> = (0..rows).map(|k| (k * 7) % rows).collect();
            for heads in 1..=chunk::MAX_HEADS {
                let query: Vec<f32> = (0..heads * blocks)
                    .flat_map(|b| values(500 + b as u64))
                    .collect();
                let queries = Queries::new(heads, head_dim, blocks, |g| {
                    &query[g * head_dim..(g + 1) * head_dim]
                });
                let stride = rows.next_multiple_of(LANES);
                let mut outputs = Vec::new();
                for wide in [true, false] {
                    let mut scores = vec![0.0f32; heads * stride];
                    chunk::scores(wide, &queries, &keys, &cells, 0.125, &mut scores, stride);
                    let score_bits: Vec<u32> = (0..heads)
                        .flat_map(|g| bits(&scores[g * stride..][..rows]))
                        .collect();
                    let mut steps = Vec::new();
                    for g in 0..heads {
                        // Spread the scores so that some weights underflow to 0.
                        let head = &mut scores[g * stride..][..rows];
                        head.iter_mut().for_each(|s| *s *= 40.0);
                        let (max, sum) = chunk::softmax(wide, head);
                        steps.push((max.to_bits(), sum.to_bits()));
                    }
                    let mut accumulator = vec![0.5f32; heads * head_dim];
                    let mut outliers = vec![0.25f32; heads * head_dim];
                    chunk::values(
                        wide,
                        &values_side,
                        &cells,
                        heads,
                        &scores,
                        stride,
                        &mut accumulator,
                        &mut outliers,
                    );
                    outputs.push((
                        score_bits,
                        steps,
                        bits(&scores),
                        bits(&accumulator),
                        bits(&outliers),
                    ));
                }
                assert!(
                    outputs[0] == outputs[1],
                    "keys {key_bits} bits, values {value_bits}, {blocks} blocks, {heads} heads"
                );
            }
        }
    }
}

#[test]
fn exp_is_within_two_ulps() {
    let mut x = -90.0f32;
    while x <= 0.0 {
        let want = f64::from(x).exp();
        let got = f64::from(exp(x));
        if x < -87.0 {
            assert_eq!(got, 0.0);
        } else {
            assert!(
                (got - want).abs() <= 2.5e-7 * want,
                "exp({x}) = {got}, not {want}"
            );
        }
        x += 0.0137;
    }
    assert_eq!(exp(0.0), 1.0);
    assert_eq!(exp(f32::NEG_INFINITY), 0.0);
}

#[test]
fn code_domain_scores_equal_decoded_dot_products() {
    for (bits, role) in [(4, KvRole::Keys), (3, KvRole::Keys), (4, KvRole::Values)] {
        let layout = TurboLayout::new(bits, role);
        for seed in 0..20 {
            // Row position `block` of the block: the first of a row of `block + 1`.
            let block = seed as usize % 5;
            let bytes = cache(layout, 1, block + 1, seed);
            let encoded = &bytes[block * layout.block_bytes()..][..layout.block_bytes()];
            let indices = &bytes[(block + 1) * layout.block_bytes()..];
            let mut decoded = [0.0f32; BLOCK];
            turbo::decode_block(layout, encoded, indices, block, &mut decoded);
            let query = values(seed + 1000);
            let want: f32 = decoded.iter().zip(&query).map(|(a, b)| a * b).sum();
            let side = Side::new(&bytes, layout, block + 1, block, 1);
            let queries = Queries::new(1, BLOCK, block, |_| &query);
            let mut got = [0.0f32; LANES];
            chunk::scores(false, &queries, &side, &[0], 1.0, &mut got, LANES);
            if layout.sketch {
                assert!(
                    (got[0] - want).abs() < 1e-4 * (1.0 + want.abs()),
                    "{} vs {want}",
                    got[0]
                );
            } else {
                // Values and tq3 keys (4-bit codes) carry no sketch: their score is the
                // codebook vector's.
                let book = turbo::codebook(layout.code_bits);
                let mut codes = [0u8; BLOCK];
                turbo::unpack_codes(
                    &encoded[layout.code_offset()..layout.sign_offset()],
                    layout.code_bits,
                    &mut codes,
                );
                let mut y: [f32; BLOCK] =
                    std::array::from_fn(|i| book.centroids[usize::from(codes[i])]);
                turbo::rotate_back(&mut y, block);
                let norm = half::f16::from_le_bytes([encoded[0], encoded[1]]).to_f32();
                let mut want: f32 = y.iter().zip(&query).map(|(a, b)| a * b * norm).sum();
                for (index, value) in layout.outliers(encoded, indices, block) {
                    want += query[index] * value;
                }
                assert!((got[0] - want).abs() < 1e-4 * (1.0 + want.abs()));
            }
        }
    }
}

/// One attention case: query heads, KV heads, head dimension, cached positions, query
/// rows (the last positions), key and value types, threads, and whether the key cache
/// subtracts a mean (`Device::center_keys`).
struct Case {
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    positions: usize,
    rows: usize,
    types: (runit_backend::KvType, runit_backend::KvType),
    threads: usize,
    centered: bool,
}

/// Attention over TurboQuant caches equals softmax attention (in f64) over the rows the
/// caches decode to; the AVX-512 kernels equal the scalar twins bit for bit, and one
/// thread equals several (which split the keys of a decode step).
#[test]
fn attention_in_the_rotated_basis_equals_attention_over_decoded_rows() {
    use runit_backend::KvType::{Tq3, Tq4};
    let cases = [
        Case {
            heads: 4,
            kv_heads: 2,
            head_dim: 128,
            positions: 40,
            rows: 3,
            types: (Tq4, Tq3),
            threads: 1,
            centered: false,
        },
        // Groups of 5 (kernel calls of 4 and 1 heads), two chunks of keys, split among
        // two threads.
        Case {
            heads: 10,
            kv_heads: 2,
            head_dim: 64,
            positions: 2 * attention::KEY_CHUNK - 30,
            rows: 2,
            types: (Tq3, Tq4),
            threads: 2,
            centered: false,
        },
        // Many (row, KV head) pairs: the threads take whole pairs.
        Case {
            heads: 9,
            kv_heads: 3,
            head_dim: 64,
            positions: attention::KEY_CHUNK + 20,
            rows: 12,
            types: (Tq4, Tq4),
            threads: 2,
            centered: false,
        },
        // Keys stored minus a mean: the scores move together, the softmax does not.
        Case {
            heads: 6,
            kv_heads: 2,
            head_dim: 128,
            positions: 70,
            rows: 3,
            types: (Tq3, Tq3),
            threads: 2,
            centered: true,
        },
    ];
    for case in &cases {
        check_attention(case);
    }
}

fn check_attention(case: &Case) {
    use runit_backend::{Attention, AttentionParams, Device, KvWrite, PrimitiveOps, SequenceSpan};
    use runit_quant::dot::SimdLevel;

    use crate::storage::kv;
    use crate::CpuBackend;

    let &Case {
        heads,
        kv_heads,
        head_dim,
        positions,
        rows,
        types,
        threads,
        centered,
    } = case;
    let kv_width = kv_heads * head_dim;
    let random = |n: usize, seed: u64| -> Vec<f32> {
        (0..n.div_ceil(BLOCK))
            .flat_map(|b| values(seed * 100_000 + b as u64))
            .take(n)
            .collect()
    };
    let k_rows = random(positions * kv_width, 1);
    let v_rows = random(positions * kv_width, 2);
    let q_rows = random(rows * heads * head_dim, 3);
    // Large in a few channels, as LLM keys' means are.
    let mean: Vec<f32> = (0..kv_width)
        .map(|c| if c % 13 == 5 { 8.0 } else { 0.25 } * if c % 2 == 0 { 1.0 } else { -1.0 })
        .collect();
    // Blocks of 16 cells, visited out of order.
    let blocks = positions.div_ceil(16);
    let table: Vec<u32> = (0..blocks as u32).rev().collect();
    let span = |first_row, rows, start_position| SequenceSpan {
        first_row,
        rows,
        start_position,
        block_table: table.clone(),
        block_size: 16,
    };
    let params = AttentionParams {
        heads,
        kv_heads,
        head_dim,
        scale: 1.0 / (head_dim as f32).sqrt(),
        sliding_window: None,
    };
    let mut outputs = Vec::new();
    for (level, threads) in [
        (SimdLevel::detect(), threads),
        (SimdLevel::Scalar, threads),
        (SimdLevel::detect(), 1),
    ] {
        let b = CpuBackend::with_simd(threads, level).expect("backend");
        let n_cells = blocks * 16;
        let mut k_cache = b
            .alloc_kv(n_cells, kv_width, head_dim, types.0, KvRole::Keys)
            .expect("keys");
        if centered {
            b.center_keys(&mut k_cache, &mean)
                .expect("TurboQuant keys take a mean");
        }
        let mut v_cache = b
            .alloc_kv(n_cells, kv_width, head_dim, types.1, KvRole::Values)
            .expect("values");
        let mut k = b.alloc(k_rows.len()).expect("k");
        let mut v = b.alloc(v_rows.len()).expect("v");
        b.upload(&mut k, &k_rows).expect("upload");
        b.upload(&mut v, &v_rows).expect("upload");
        b.kv_write(KvWrite {
            k: &k,
            v: &v,
            k_cache: &mut k_cache,
            v_cache: &mut v_cache,
            spans: &[span(0, positions, 0)],
        })
        .expect("write");
        let mut q = b.alloc(q_rows.len()).expect("q");
        b.upload(&mut q, &q_rows).expect("upload");
        let mut out = b.alloc(q_rows.len()).expect("out");
        let spans = [span(0, rows, positions - rows)];
        b.attention(
            &Attention {
                q: &q,
                k_cache: &k_cache,
                v_cache: &v_cache,
                spans: &spans,
                params: &params,
            },
            &mut out,
        )
        .expect("attention");
        let mut got = vec![0.0; q_rows.len()];
        b.download(&out, &mut got).expect("download");
        if outputs.is_empty() {
            // The reference: every cached row decoded, then plain attention.
            let decode = |cache: &runit_backend::KvCache, cell: usize| -> Vec<f32> {
                let CpuKv::Turbo(cells) = kv(cache, "test", "cache").expect("cpu cache") else {
                    panic!("a TurboQuant cache");
                };
                let mut row = vec![0.0f32; kv_width];
                turbo::decode_row(cells.layout, cells.bytes_of_row(cell), &mut row);
                row
            };
            let cell = |p: usize| table[p / 16] as usize * 16 + p % 16;
            // The stored keys (the mean added back or not, the softmax is the same).
            let keys: Vec<Vec<f32>> = (0..positions)
                .map(|p| {
                    let mut key = decode(&k_cache, cell(p));
                    if centered {
                        key.iter_mut().zip(&mean).for_each(|(k, m)| *k += m);
                    }
                    key
                })
                .collect();
            let values: Vec<Vec<f32>> = (0..positions).map(|p| decode(&v_cache, cell(p))).collect();
            for r in 0..rows {
                let position = positions - rows + r;
                for h in 0..heads {
                    let kvh = h / (heads / kv_heads);
                    let query = &q_rows[(r * heads + h) * head_dim..][..head_dim];
                    let scores: Vec<f64> = keys[..=position]
                        .iter()
                        .map(|key| {
                            let key = &key[kvh * head_dim..][..head_dim];
                            let dot: f64 =
                                query.iter().zip(key).map(|(a, b)| f64::from(a * b)).sum();
                            dot * f64::from(params.scale)
                        })
                        .collect();
                    let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                    let weights: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
                    let total: f64 = weights.iter().sum();
                    for d in 0..head_dim {
                        let want: f64 = values[..=position]
                            .iter()
                            .zip(&weights)
                            .map(|(value, w)| w * f64::from(value[kvh * head_dim + d]))
                            .sum::<f64>()
                            / total;
                        let found = f64::from(got[(r * heads + h) * head_dim + d]);
                        assert!(
                            (found - want).abs() < 1e-4 * (1.0 + want.abs()),
                            "row {r} head {h} dim {d}: {found} vs {want}"
                        );
                    }
                }
            }
        }
        outputs.push(bits(&got));
    }
    assert!(outputs[0] == outputs[1], "SIMD and scalar differ");
    assert!(outputs[0] == outputs[2], "{threads} threads and one differ");
}
