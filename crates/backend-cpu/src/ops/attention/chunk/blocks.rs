//! ggml's one-chunk flash attention over Q8_0 / Q4_0 caches for all the query heads that
//! share one KV head: per head exactly the operations of [`super::one_head`] (the query
//! quantized to Q8_0 and dotted with each key's blocks by the K type's `vec_dot`, each value
//! row dequantized as ggml's `v_to_float` and accumulated with f32 multiply-adds, the online
//! softmax key after key), so the same bits, arranged so that each key row is read and each
//! value row dequantized once for the group instead of once per head, and the Q·K dots of
//! all visible keys run before the softmax (they do not depend on one another).

use runit_backend::{hadamard, SequenceSpan};
use runit_quant::dot::{activation_row_bytes, ActivationFormat};

use super::super::{CacheRow, Problem};
use crate::storage::CpuKv;
use crate::vector::{self, Isa};

/// Largest group of query heads per KV head this kernel takes.
const MAX_GROUP: usize = 16;

/// Per-worker buffers.
#[derive(Default)]
pub(in crate::ops::attention) struct Scratch {
    /// The group's queries (rotated as the keys were) quantized to Q8_0, a row each.
    queries: Vec<u8>,
    /// One query rotated, or one value row dequantized (`head_dim`).
    row: Vec<f32>,
    /// Scaled Q·K of every visible key and head (`[keys, group]`).
    scores: Vec<f32>,
}

/// True when [`run`] computes this problem: Q8_0 or Q4_0 keys and values, at most
/// [`MAX_GROUP`] query heads per KV head and more than one.
pub(in crate::ops::attention) fn applies(problem: &Problem<'_>) -> bool {
    let blocks = |cache: &CpuKv| matches!(cache, CpuKv::Q8_0(_) | CpuKv::Q4_0(_));
    problem.key_dot.is_some()
        && blocks(problem.keys)
        && blocks(problem.values)
        && (2..=MAX_GROUP).contains(&problem.group)
}

/// Attention of the queries at `row`, heads `first_head .. first_head + group` (one KV
/// head's), over positions `first_visible ..= position`, into `dst` (`[group, head_dim]`).
/// Only called where [`applies`] holds.
#[allow(clippy::too_many_arguments)]
pub(in crate::ops::attention) fn run(
    isa: Isa,
    problem: &Problem<'_>,
    span: &SequenceSpan,
    row: usize,
    first_head: usize,
    position: usize,
    dst: &mut [f32],
    scratch: &mut Scratch,
) {
    let group = problem.group;
    let head_dim = problem.head_dim;
    let dot = problem.key_dot.expect("`applies` checked the key cache");
    let query_bytes = activation_row_bytes(ActivationFormat::Q8_0, head_dim);
    scratch.queries.resize(group * query_bytes, 0);
    for (g, quantized) in scratch.queries.chunks_exact_mut(query_bytes).enumerate() {
        let query = problem.query(row, first_head + g);
        super::quantize_query(problem, query, &mut scratch.row, quantized);
    }
    let first = problem.first_visible(position);
    let keys = position + 1 - first;
    scratch.scores.resize(keys * group, 0.0);
    for (key_position, scores) in (first..=position).zip(scratch.scores.chunks_exact_mut(group)) {
        let key: &[u8] = match problem.key(span.cell(key_position), first_head) {
            CacheRow::Q8_0(key) => bytemuck::cast_slice(key),
            CacheRow::Q4_0(key) => bytemuck::cast_slice(key),
            _ => unreachable!("`applies` checked the key cache"),
        };
        for (score, query) in scores
            .iter_mut()
            .zip(scratch.queries.chunks_exact(query_bytes))
        {
            *score = dot(head_dim, key, query) * problem.scale;
        }
    }
    let dst = &mut dst[..group * head_dim];
    dst.fill(0.0);
    let mut max = [f32::NEG_INFINITY; MAX_GROUP];
    let mut sum = [0.0f32; MAX_GROUP];
    scratch.row.resize(head_dim, 0.0);
    for (key_position, scores) in (first..=position).zip(scratch.scores.chunks_exact(group)) {
        // ggml's `v_to_float` (its values bit for bit), once for the group.
        match problem.value(span.cell(key_position), first_head) {
            CacheRow::Q8_0(value) => vector::dequant_q8_0(isa, value, &mut scratch.row),
            CacheRow::Q4_0(value) => vector::dequant_q4_0(isa, value, &mut scratch.row),
            _ => unreachable!("`applies` checked the value cache"),
        }
        for (g, (&score, out)) in scores
            .iter()
            .zip(dst.chunks_exact_mut(head_dim))
            .enumerate()
        {
            // As one_head: `rescale` shrinks what was accumulated when the maximum grows;
            // `weight` is exp(score - max) of this key.
            let mut rescale = 1.0f32;
            let mut weight = 1.0f32;
            if score > max[g] {
                rescale = (max[g] - score).exp();
                max[g] = score;
                vector::scale_f32(out, rescale);
            } else {
                weight = (score - max[g]).exp();
            }
            vector::mad_f32(isa, out, &scratch.row, weight);
            sum[g] = sum[g].mul_add(rescale, weight);
        }
    }
    for (g, out) in dst.chunks_exact_mut(head_dim).enumerate() {
        let inverse = if sum[g] == 0.0 { 0.0 } else { 1.0 / sum[g] };
        vector::scale_f32(out, inverse);
        if let Some(n) = problem.value_rotation {
            hadamard::rotate_chunks(out, n);
        }
    }
}

#[cfg(test)]
mod tests {
    use half::f16;
    use runit_backend::testing::Rng;
    use runit_backend::{hadamard, KvRole, KvType, SequenceSpan};
    use runit_quant::blocks::{BlockQ4_0, BlockQ8_0};
    use runit_quant::dot::{dot_fn, SimdLevel};
    use runit_quant::GgmlType;

    use super::super::super::Problem;
    use crate::cells::Cells;
    use crate::storage::CpuKv;
    use crate::vector::Isa;

    /// A cache of random blocks (codes and scales) of `cells * width` values.
    fn cache(ty: KvType, cells: usize, width: usize, rng: &mut Rng) -> CpuKv {
        let blocks = cells * width / 32;
        let scales = rng.values(blocks, 0.001, 0.05);
        let codes = rng.values(blocks * 32, -127.0, 127.0);
        match ty {
            KvType::Q8_0 => {
                let data: Vec<BlockQ8_0> = (0..blocks)
                    .map(|b| BlockQ8_0 {
                        d: f16::from_f32(scales[b]),
                        qs: std::array::from_fn(|i| codes[b * 32 + i] as i8),
                    })
                    .collect();
                CpuKv::Q8_0(Cells::from(&data[..]))
            }
            _ => {
                let data: Vec<BlockQ4_0> = (0..blocks)
                    .map(|b| BlockQ4_0 {
                        d: f16::from_f32(scales[b] * 10.0),
                        qs: std::array::from_fn(|i| (codes[b * 32 + i] as i32 & 0xff) as u8),
                    })
                    .collect();
                CpuKv::Q4_0(Cells::from(&data[..]))
            }
        }
    }

    /// The group kernel equals `one_head` (scalar) of every head bit for bit: Q8_0 and Q4_0
    /// keys and values in every pairing, llama.cpp's rotations, windows and block tables.
    #[test]
    fn block_group_kernel_equals_one_head() {
        let mut rng = Rng::new(0xb10c);
        let isa = Isa::detect(true);
        let mut compared = 0;
        for (heads, kv_heads, d, window, k_ty, v_ty) in [
            (9, 3, 64, None, KvType::Q8_0, KvType::Q8_0),
            (14, 2, 64, Some(30), KvType::Q4_0, KvType::Q4_0),
            (8, 2, 128, None, KvType::Q8_0, KvType::Q4_0),
            (4, 2, 32, None, KvType::Q4_0, KvType::Q8_0),
            (16, 1, 64, Some(5), KvType::Q8_0, KvType::Q8_0),
        ] {
            let kv_width = kv_heads * d;
            let (block_size, blocks) = (16, 8);
            let n_cells = block_size * blocks;
            let keys = cache(k_ty, n_cells, kv_width, &mut rng);
            let values = cache(v_ty, n_cells, kv_width, &mut rng);
            let rows = 3;
            let q = rng.values(rows * heads * d, -2.0, 2.0);
            let key_type = if k_ty == KvType::Q8_0 {
                GgmlType::Q8_0
            } else {
                GgmlType::Q4_0
            };
            let problem = Problem {
                q: &q,
                keys: &keys,
                values: &values,
                kv_width,
                heads,
                group: heads / kv_heads,
                head_dim: d,
                scale: 1.0 / (d as f32).sqrt(),
                window,
                key_dot: dot_fn(key_type, SimdLevel::detect()),
                key_rotation: hadamard::llama_rotation(k_ty, KvRole::Keys, d),
                value_rotation: hadamard::llama_rotation(v_ty, KvRole::Values, d),
            };
            assert!(super::applies(&problem));
            let span = SequenceSpan {
                first_row: 0,
                rows,
                start_position: 70,
                block_table: vec![5, 2, 7, 0, 1, 6, 3, 4],
                block_size,
            };
            let mut scratch = super::super::Scratch::new(d);
            let group = problem.group;
            for row in 0..rows {
                let position = span.start_position + row;
                for kv_head in 0..kv_heads {
                    let mut out = vec![0.0f32; group * d];
                    super::run(
                        isa,
                        &problem,
                        &span,
                        row,
                        kv_head * group,
                        position,
                        &mut out,
                        &mut scratch.blocks,
                    );
                    for g in 0..group {
                        let head = kv_head * group + g;
                        let mut twin = vec![0.0f32; d];
                        super::super::one_head(
                            Isa::Scalar,
                            &problem,
                            &span,
                            row,
                            head,
                            position,
                            &mut twin,
                            &mut scratch,
                        );
                        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                        assert_eq!(
                            bits(&out[g * d..(g + 1) * d]),
                            bits(&twin),
                            "{k_ty:?}/{v_ty:?} h{heads}/{kv_heads} d{d} window {window:?} row {row} head {head}"
                        );
                        compared += 1;
                    }
                }
            }
        }
        assert!(compared > 100);
    }
}
