//! The AVX2 kernels against their scalar twins (bit for bit), and the code-domain kernels
//! against decoding the block.

use runit_backend::turbo::{self, TurboLayout, BLOCK};
use runit_backend::KvRole;

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

#[test]
fn simd_kernels_equal_their_scalar_twins() {
    let isa = Isa::detect(true);
    for seed in 0..50u64 {
        for bits in 1..=4 {
            let table = Table::new(bits);
            let q = values(seed);
            let codes: [u8; BLOCK] =
                std::array::from_fn(|i| ((seed as usize * 7 + i * 13) % (1 << bits)) as u8);
            let signs = turbo::signs(seed as usize, turbo::Diagonal::Sketch);
            assert_eq!(
                code_dot(isa, &q, &codes, &table).to_bits(),
                code_dot(Isa::Scalar, &q, &codes, &table).to_bits()
            );
            assert_eq!(
                sign_dot(isa, &q, signs).to_bits(),
                sign_dot(Isa::Scalar, &q, signs).to_bits()
            );
            let mut fast = values(seed + 100);
            let mut slow = fast;
            code_mad(isa, &mut fast, &codes, &table, 0.37);
            code_mad(Isa::Scalar, &mut slow, &codes, &table, 0.37);
            assert_eq!(fast.map(f32::to_bits), slow.map(f32::to_bits));
        }
    }
}

#[test]
fn code_domain_scores_equal_decoded_dot_products() {
    for (bits, role) in [(4, KvRole::Keys), (3, KvRole::Keys), (4, KvRole::Values)] {
        let layout = TurboLayout::new(bits, role);
        let mut bytes = vec![0u8; layout.block_bytes()];
        for seed in 0..20 {
            let x = values(seed);
            let query = values(seed + 1000);
            let block = seed as usize % 5;
            turbo::encode_block(layout, &x, block, &mut bytes);
            let mut decoded = [0.0f32; BLOCK];
            turbo::decode_block(layout, &bytes, block, &mut decoded);
            let want: f32 = decoded.iter().zip(&query).map(|(a, b)| a * b).sum();

            let mut rotated = query;
            turbo::rotate(&mut rotated, block);
            let mut codes = [0u8; BLOCK];
            turbo::unpack_codes(
                &bytes[layout.code_offset()..layout.sign_offset()],
                layout.code_bits,
                &mut codes,
            );
            let table = Table::new(layout.code_bits);
            let mut got = code_dot(Isa::Scalar, &rotated, &codes, &table);
            if layout.sketch {
                let mut sketched = rotated;
                turbo::sketch(&mut sketched, block);
                let at = layout.sign_offset();
                let signs = u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap());
                let residual = half::f16::from_le_bytes([bytes[2], bytes[3]]).to_f32();
                got += turbo::sketch_factor() * residual * sign_dot(Isa::Scalar, &sketched, signs);
            }
            got *= half::f16::from_le_bytes([bytes[0], bytes[1]]).to_f32();
            for (index, value) in layout.outliers(&bytes) {
                got += query[index] * value;
            }
            assert!(
                (got - want).abs() < 1e-4 * (1.0 + want.abs()),
                "{got} vs {want}"
            );
        }
    }
}

/// Attention over TurboQuant caches equals softmax attention (in f64) over the rows the
/// caches decode to, and the AVX2 backend equals the scalar one bit for bit.
#[test]
fn attention_in_the_rotated_basis_equals_attention_over_decoded_rows() {
    use runit_backend::{
        Attention, AttentionParams, Device, KvType, KvWrite, PrimitiveOps, SequenceSpan,
    };
    use runit_quant::dot::SimdLevel;

    use crate::storage::kv;
    use crate::CpuBackend;

    let (heads, kv_heads, head_dim, positions, rows) = (4, 2, 128, 40, 3);
    let kv_width = kv_heads * head_dim;
    let random = |n: usize, seed: u64| -> Vec<f32> {
        (0..n.div_ceil(BLOCK))
            .flat_map(|b| values(seed * 1000 + b as u64))
            .take(n)
            .collect()
    };
    let k_rows = random(positions * kv_width, 1);
    let v_rows = random(positions * kv_width, 2);
    let q_rows = random(rows * heads * head_dim, 3);
    let table = vec![2, 0, 1];
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
    for level in [SimdLevel::detect(), SimdLevel::Scalar] {
        let b = CpuBackend::with_simd(1, level).expect("backend");
        let mut k_cache = b
            .alloc_kv(48, kv_width, head_dim, KvType::Tq4, KvRole::Keys)
            .expect("keys");
        let mut v_cache = b
            .alloc_kv(48, kv_width, head_dim, KvType::Tq3, KvRole::Values)
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
                let bytes = cells.bytes_of_row(cell, kv_width);
                let mut row = vec![0.0f32; kv_width];
                for (block, (encoded, out)) in bytes
                    .chunks_exact(cells.layout.block_bytes())
                    .zip(row.chunks_exact_mut(BLOCK))
                    .enumerate()
                {
                    turbo::decode_block(cells.layout, encoded, block, out);
                }
                row
            };
            let cell = |p: usize| table[p / 16] as usize * 16 + p % 16;
            for r in 0..rows {
                let position = positions - rows + r;
                for h in 0..heads {
                    let kvh = h / (heads / kv_heads);
                    let query = &q_rows[(r * heads + h) * head_dim..][..head_dim];
                    let scores: Vec<f64> = (0..=position)
                        .map(|p| {
                            let key = decode(&k_cache, cell(p));
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
                        let want: f64 = (0..=position)
                            .map(|p| {
                                let value = decode(&v_cache, cell(p));
                                weights[p] * f64::from(value[kvh * head_dim + d])
                            })
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
        outputs.push(got);
    }
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&outputs[0]), bits(&outputs[1]));
}
