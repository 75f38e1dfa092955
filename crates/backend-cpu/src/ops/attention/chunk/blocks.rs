//! ggml's one-chunk flash attention over Q8_0 / Q4_0 caches for all the query heads that
//! share one KV head: per head exactly the operations of [`super::one_head`] (the query
//! quantized to Q8_0 and dotted with each key's blocks by the K type's `vec_dot`, each value
//! row dequantized as ggml's `v_to_float` and accumulated with f32 multiply-adds, the online
//! softmax key after key), so the same bits, arranged in three passes over each chunk of
//! [`CHUNK_KEYS`] keys in turn:
//!
//! 1. the Q·K dots of the chunk's keys (they do not depend on one another), each key's
//!    blocks unpacked once for the group, [`PREFETCH_KEYS`] keys a call
//!    (`runit_quant::dot::GatherDotFn`: with AVX-512 VNNI two keys at a time), the key
//!    and value rows of the next call's keys prefetched (a decode step's rows come from
//!    the last-level cache or memory);
//! 2. the online softmax, key after key: each head's running maximum and sum as before
//!    (carried from chunk to chunk), and per key and head the weight exp(score - max) and,
//!    where the maximum grew, the factor that shrinks what was accumulated;
//! 3. the values ([`vector::accumulate_values`]), while the chunk's value rows are still
//!    in the L1 cache: each value block dequantized once for the group, the accumulators
//!    scaled and multiply-added in the same order as (2) decided.

use runit_backend::{hadamard, SequenceSpan};
use runit_quant::blocks::{BlockQ4_0, BlockQ8_0};
use runit_quant::dot::{activation_row_bytes, ActivationFormat};

use super::super::Problem;
use crate::storage::CpuKv;
use crate::vector::{self, Isa, ValueBlocks, ValueSteps};

/// Largest group of query heads per KV head this kernel takes (a bit each in
/// [`ValueSteps::rescaled`]).
const MAX_GROUP: usize = 16;

/// Values of a Q8_0 / Q4_0 block.
const BLOCK: usize = 32;

/// Per-worker buffers.
#[derive(Default)]
pub(in crate::ops::attention) struct Scratch {
    /// The group's queries (rotated as the keys were) quantized to Q8_0, a row each.
    queries: Vec<u8>,
    /// One query rotated.
    row: Vec<f32>,
    /// First cache block of the head's row in each visible key's cell (keys and values
    /// share the layout).
    rows: Vec<usize>,
    /// Scaled Q·K of a chunk's keys and the heads, then their softmax weights
    /// (`[CHUNK_KEYS, group]`).
    weights: Vec<f32>,
    /// The factor shrinking the accumulator where a key raised a head's maximum
    /// (`[CHUNK_KEYS, group]`).
    rescales: Vec<f32>,
    /// Per key, a bit per head whose maximum it raised.
    rescaled: Vec<u16>,
}

/// True when [`run`] computes this problem: Q8_0 or Q4_0 keys and values, at most
/// [`MAX_GROUP`] query heads per KV head and more than one.
pub(in crate::ops::attention) fn applies(problem: &Problem<'_>) -> bool {
    let blocks = |cache: &CpuKv| matches!(cache, CpuKv::Q8_0(_) | CpuKv::Q4_0(_));
    problem.key_gather_dot.is_some()
        && blocks(problem.keys)
        && blocks(problem.values)
        && (2..=MAX_GROUP).contains(&problem.group)
}

/// Keys whose three passes run before the next keys' (their value rows, fetched with their
/// keys by the scores pass, are still in the L1 cache when the value pass reads them).
const CHUNK_KEYS: usize = 128;

/// How many keys ahead the scores pass prefetches a key's row and its value's: a decode
/// step reads each cache row once, from the last-level cache or memory, at strided
/// addresses (one head of each cell) that outrun the hardware prefetcher.
const PREFETCH_KEYS: usize = 16;

/// Prefetches every cache line of `bytes` into L1.
#[inline(always)]
fn prefetch_lines(bytes: &[u8]) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        const LINE: usize = 64;
        let start = bytes.as_ptr();
        let lines = (start as usize % LINE + bytes.len()).div_ceil(LINE);
        for line in 0..lines {
            // SAFETY: a prefetch is a hint: it reads no memory architecturally and never
            // faults, whatever the address (here within a line of `bytes`).
            unsafe { _mm_prefetch::<_MM_HINT_T0>(start.wrapping_add(line * LINE).cast()) };
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = bytes;
}

/// Calls `visit` with the cell of each position `first ..= last` in order (a block-table
/// lookup per block, not a division per position).
fn for_each_cell(span: &SequenceSpan, first: usize, last: usize, mut visit: impl FnMut(usize)) {
    let size = span.block_size;
    for block in first / size..=last / size {
        let start = block * size;
        let base = span.block_table[block] as usize * size;
        for position in first.max(start)..=last.min(start + size - 1) {
            visit(base + position - start);
        }
    }
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
    let dot = problem
        .key_gather_dot
        .expect("`applies` checked the key cache");
    let query_bytes = activation_row_bytes(ActivationFormat::Q8_0, head_dim);
    scratch.queries.resize(group * query_bytes, 0);
    scratch.weights.resize(CHUNK_KEYS * group, 0.0);
    scratch.rescales.resize(CHUNK_KEYS * group, 0.0);
    scratch.rescaled.resize(CHUNK_KEYS, 0);
    for (g, quantized) in scratch.queries.chunks_exact_mut(query_bytes).enumerate() {
        let query = problem.query(row, first_head + g);
        super::quantize_query(problem, query, &mut scratch.row, quantized);
    }

    // A head's row starts a whole number of blocks into its cell's row.
    let head_offset = first_head / group * head_dim;
    let first = problem.first_visible(position);
    scratch.rows.clear();
    for_each_cell(span, first, position, |cell| {
        scratch
            .rows
            .push((cell * problem.kv_width + head_offset) / BLOCK);
    });
    let (keys, key_block): (&[u8], usize) = match problem.keys {
        CpuKv::Q8_0(cells) => (bytemuck::cast_slice(cells), size_of::<BlockQ8_0>()),
        CpuKv::Q4_0(cells) => (bytemuck::cast_slice(cells), size_of::<BlockQ4_0>()),
        _ => unreachable!("`applies` checked the key cache"),
    };
    let (values, value_block, value_blocks): (&[u8], usize, ValueBlocks<'_>) = match problem.values
    {
        CpuKv::Q8_0(cells) => (
            bytemuck::cast_slice(cells),
            size_of::<BlockQ8_0>(),
            ValueBlocks::Q8_0(cells),
        ),
        CpuKv::Q4_0(cells) => (
            bytemuck::cast_slice(cells),
            size_of::<BlockQ4_0>(),
            ValueBlocks::Q4_0(cells),
        ),
        _ => unreachable!("`applies` checked the value cache"),
    };
    let (key_bytes, value_bytes) = (head_dim / BLOCK * key_block, head_dim / BLOCK * value_block);
    let prefetch = |first_block: usize| {
        prefetch_lines(&keys[first_block * key_block..][..key_bytes]);
        prefetch_lines(&values[first_block * value_block..][..value_bytes]);
    };
    scratch
        .rows
        .iter()
        .take(PREFETCH_KEYS)
        .for_each(|&row| prefetch(row));
    let mut max = [f32::NEG_INFINITY; MAX_GROUP];
    let mut sum = [0.0f32; MAX_GROUP];
    let dst = &mut dst[..group * head_dim];
    dst.fill(0.0);
    let visible = scratch.rows.len();
    for chunk in (0..visible).step_by(CHUNK_KEYS) {
        let chunk = chunk..(chunk + CHUNK_KEYS).min(visible);
        let (weights, rescales, rescaled) = (
            &mut scratch.weights[..chunk.len() * group],
            &mut scratch.rescales[..chunk.len() * group],
            &mut scratch.rescaled[..chunk.len()],
        );

        // (1) Scores, a slice of keys at a time while the rows a slice ahead are fetched.
        for (slice, scores) in (chunk.start..chunk.end)
            .step_by(PREFETCH_KEYS)
            .zip(weights.chunks_mut(PREFETCH_KEYS * group))
        {
            let slice = slice..(slice + PREFETCH_KEYS).min(chunk.end);
            let ahead = slice.end..(slice.end + PREFETCH_KEYS).min(visible);
            scratch.rows[ahead].iter().for_each(|&row| prefetch(row));
            dot(
                head_dim,
                keys,
                &scratch.rows[slice],
                &scratch.queries,
                scores,
            );
            for score in scores {
                *score *= problem.scale;
            }
        }

        // (2) The online softmax, as one_head (the maxima and sums carried from chunk to
        // chunk).
        vector::softmax_steps(
            isa,
            weights,
            rescales,
            rescaled,
            &mut max[..group],
            &mut sum[..group],
        );

        // (3) The values: ggml's `v_to_float` (its values bit for bit) and the f32 `mad`.
        let steps = ValueSteps {
            rows: &scratch.rows[chunk],
            weights,
            rescales,
            rescaled,
        };
        vector::accumulate_values(isa, value_blocks, &steps, dst);
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
    use runit_quant::dot::{dot_fn, gather_dot_fn, SimdLevel};
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

    /// A cache of 8 blocks of 16 cells and random queries at positions 70-72; see
    /// [`compare_long`].
    #[allow(clippy::too_many_arguments)]
    fn compare_with_one_head(
        isa: Isa,
        heads: usize,
        kv_heads: usize,
        d: usize,
        window: Option<usize>,
        k_ty: KvType,
        v_ty: KvType,
        rng: &mut Rng,
    ) -> usize {
        let block_table = vec![5, 2, 7, 0, 1, 6, 3, 4];
        let shape = (heads, kv_heads, d, window, k_ty, v_ty);
        compare_long(isa, shape, block_table, 70, rng)
    }

    /// A cache of the cells of `block_table`'s blocks (16 cells each) and random queries
    /// at positions `start_position` on; runs the group kernel of every (row, KV head)
    /// under `isa` and compares each head with `one_head` (scalar) bit for bit. Returns the
    /// heads compared.
    fn compare_long(
        isa: Isa,
        (heads, kv_heads, d, window, k_ty, v_ty): (
            usize,
            usize,
            usize,
            Option<usize>,
            KvType,
            KvType,
        ),
        block_table: Vec<u32>,
        start_position: usize,
        rng: &mut Rng,
    ) -> usize {
        let kv_width = kv_heads * d;
        let (block_size, blocks) = (16, block_table.len());
        let n_cells = block_size * blocks;
        let keys = cache(k_ty, n_cells, kv_width, rng);
        let values = cache(v_ty, n_cells, kv_width, rng);
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
            key_gather_dot: gather_dot_fn(key_type, SimdLevel::detect()),
            key_rotation: hadamard::llama_rotation(k_ty, KvRole::Keys, d),
            value_rotation: hadamard::llama_rotation(v_ty, KvRole::Values, d),
        };
        assert!(super::applies(&problem));
        let span = SequenceSpan {
            first_row: 0,
            rows,
            start_position,
            block_table,
            block_size,
        };
        assert!(start_position + rows <= n_cells);
        let mut scratch = super::super::Scratch::new(d);
        let group = problem.group;
        let mut compared = 0;
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
                        "{isa:?} {k_ty:?}/{v_ty:?} h{heads}/{kv_heads} d{d} window {window:?} \
                         row {row} head {head}"
                    );
                    compared += 1;
                }
            }
        }
        compared
    }

    /// The group kernel equals `one_head` (scalar) of every head bit for bit: Q8_0 and Q4_0
    /// keys and values in every pairing, llama.cpp's rotations, windows and block tables.
    #[test]
    fn block_group_kernel_equals_one_head() {
        let mut rng = Rng::new(0xb10c);
        let mut compared = 0;
        for isa in [Isa::Scalar, Isa::detect(true)] {
            for (heads, kv_heads, d, window, k_ty, v_ty) in [
                (9, 3, 64, None, KvType::Q8_0, KvType::Q8_0),
                (14, 2, 64, Some(30), KvType::Q4_0, KvType::Q4_0),
                (8, 2, 128, None, KvType::Q8_0, KvType::Q4_0),
                (4, 2, 32, None, KvType::Q4_0, KvType::Q8_0),
                (16, 1, 64, Some(5), KvType::Q8_0, KvType::Q8_0),
            ] {
                compared +=
                    compare_with_one_head(isa, heads, kv_heads, d, window, k_ty, v_ty, &mut rng);
            }
        }
        assert!(compared > 200);
    }

    /// Every group size the kernel takes (2 to 16: the AVX2 path's whole-block tiles and
    /// its half-block chunks of heads) at head_dim 32, 64 and 128, both cache types, with
    /// and without a window, under each `Isa` this machine has.
    #[test]
    fn every_group_size_equals_one_head() {
        let mut rng = Rng::new(0x9a0f);
        let mut compared = 0;
        for isa in [Isa::Scalar, Isa::detect(true)] {
            for d in [32, 64, 128] {
                for group in 2..=16 {
                    let kv_heads = 1 + group % 2;
                    let window = (group % 3 == 0).then_some(7 + group);
                    let (k_ty, v_ty) = match group % 4 {
                        0 => (KvType::Q8_0, KvType::Q8_0),
                        1 => (KvType::Q4_0, KvType::Q4_0),
                        2 => (KvType::Q8_0, KvType::Q4_0),
                        _ => (KvType::Q4_0, KvType::Q8_0),
                    };
                    let heads = group * kv_heads;
                    compared += compare_with_one_head(
                        isa, heads, kv_heads, d, window, k_ty, v_ty, &mut rng,
                    );
                }
            }
        }
        assert!(compared > 1000);
    }

    /// Spans of several chunks of keys (the passes run [`super::CHUNK_KEYS`] keys at a
    /// time, the maxima and sums carried over): the group kernel still equals `one_head`
    /// bit for bit, with and without a window that starts inside a chunk.
    #[test]
    fn spans_of_several_chunks_equal_one_head() {
        let mut rng = Rng::new(0x10c5);
        let blocks = 3 * super::CHUNK_KEYS / 16 + 2;
        let mut compared = 0;
        for isa in [Isa::Scalar, Isa::detect(true)] {
            for (shape, start_position) in [
                (
                    (9, 3, 64, None, KvType::Q8_0, KvType::Q8_0),
                    16 * blocks - 3,
                ),
                (
                    (8, 2, 128, Some(300), KvType::Q4_0, KvType::Q8_0),
                    16 * blocks - 5,
                ),
                (
                    (6, 1, 96, None, KvType::Q8_0, KvType::Q4_0),
                    2 * super::CHUNK_KEYS - 1,
                ),
            ] {
                // The blocks in a scrambled order (7 is prime to their count).
                let table = (0..blocks).map(|b| (b * 7 % blocks) as u32).collect();
                compared += compare_long(isa, shape, table, start_position, &mut rng);
            }
        }
        assert_eq!(compared, 2 * 3 * (9 + 8 + 6));
    }
}
