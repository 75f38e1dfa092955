//! ggml's one-chunk flash-attention path (`ggml_compute_forward_flash_attn_ext_f16_one_chunk`):
//! one query head at a time, keys one by one with an online softmax.

use std::sync::atomic::{AtomicUsize, Ordering};

use half::f16;
use runit_backend::SequenceSpan;

use runit_backend::hadamard;
use runit_quant::dequant::{dequantize_row_q4_0, dequantize_row_q8_0};
use runit_quant::dot::{activation_row_bytes, quantize_activation, ActivationFormat};

use super::{row_owners, CacheRow, Problem};
use crate::storage::CpuKv;
use crate::vector::{self, Isa};

mod blocks;
mod group;
use crate::{CpuBackend, SharedRows};

/// Fewest key positions (summed over rows and heads) worth handing to the thread team
/// (whose helpers spin between ops: a hand-off costs about a microsecond).
const PARALLEL_MIN_KEYS: usize = 512;
/// Chunks per thread (uneven context lengths balance out over several).
const CHUNKS_PER_THREAD: usize = 8;

/// Per-worker buffers: Q rounded to f16 or quantized to Q8_0, the f16 V accumulator and a
/// dequantized value row (one head), and the [`group`] kernel's buffers (a whole group of
/// heads).
struct Scratch {
    query: Vec<f16>,
    query_q8: Vec<u8>,
    accumulator: Vec<f16>,
    value: Vec<f32>,
    group: group::Scratch,
    blocks: blocks::Scratch,
}

impl Scratch {
    fn new(head_dim: usize) -> Scratch {
        Scratch {
            query: vec![f16::ZERO; head_dim],
            query_q8: Vec::new(),
            accumulator: vec![f16::ZERO; head_dim],
            value: vec![0.0; head_dim],
            group: group::Scratch::default(),
            blocks: blocks::Scratch::default(),
        }
    }
}

/// Computes every (row, head) of `out` (`[end_row, heads, head_dim]`) that a span owns.
/// Where the threads take whole rows, `row_done(row, values)` follows each finished row on
/// the thread that computed it; returns the number of rows so reported.
pub fn run(
    backend: &CpuBackend,
    problem: &Problem<'_>,
    spans: &[SequenceSpan],
    end_row: usize,
    out: &mut [f32],
    row_done: Option<&RowDone>,
) -> usize {
    let owner = row_owners(spans, end_row);
    let heads = problem.heads;
    let head_dim = problem.head_dim;
    let out = &mut out[..end_row * heads * head_dim];
    let isa = backend.isa;
    // One unit is a (row, head), or with the group kernel a (row, KV head) and the query
    // heads that share it, whose outputs are adjacent.
    let grouped = group::applies(isa, problem);
    let grouped_blocks = !grouped && blocks::applies(problem);
    let unit_heads = if grouped || grouped_blocks {
        problem.group
    } else {
        1
    };
    let width = unit_heads * head_dim;
    let units_per_row = heads / unit_heads;
    let new_scratch = || Scratch::new(head_dim);
    let task = |scratch: &mut Scratch, index: usize, dst: &mut [f32]| {
        let row = index / units_per_row;
        if let Some(span) = spans.get(owner[row]) {
            let position = span.start_position + (row - span.first_row);
            let first_head = index % units_per_row * unit_heads;
            if grouped {
                group::run(
                    problem,
                    span,
                    row,
                    first_head,
                    position,
                    dst,
                    &mut scratch.group,
                );
            } else if grouped_blocks {
                blocks::run(
                    isa,
                    problem,
                    span,
                    row,
                    first_head,
                    position,
                    dst,
                    &mut scratch.blocks,
                );
            } else {
                one_head(isa, problem, span, row, first_head, position, dst, scratch);
            }
        }
    };
    // Key positions visited, summed over (row, head): below PARALLEL_MIN_KEYS (a decode step
    // at a short context) the hand-off costs more than the work.
    let keys: usize = spans
        .iter()
        .map(|span| span.rows * (span.start_position + span.rows))
        .sum::<usize>()
        * heads;
    let units = end_row * units_per_row;
    if backend.threads > 1 && units > 1 && keys >= PARALLEL_MIN_KEYS {
        // Whole rows per chunk where there are rows enough for every thread: a row's KV
        // heads share its cache rows' lines, so the one thread that takes them all finds
        // the other heads' parts already fetched (the hardware prefetcher streams the
        // cells of the first). With fewer rows the heads of one row are split.
        let mut per_chunk = units.div_ceil(backend.threads * CHUNKS_PER_THREAD);
        if end_row >= 2 * backend.threads {
            per_chunk = per_chunk.next_multiple_of(units_per_row);
        }
        let whole_rows = per_chunk.is_multiple_of(units_per_row);
        let reported = AtomicUsize::new(0);
        let shared = SharedRows::new(out, width);
        backend.run_chunks(units.div_ceil(per_chunk), &|chunk| {
            let mut scratch = new_scratch();
            let units = chunk * per_chunk..((chunk + 1) * per_chunk).min(units);
            for index in units.clone() {
                // SAFETY: chunks cover disjoint unit ranges, each unit its own row of
                // `width`, so no other reference to this row is alive; `out` outlives
                // `run_chunks`, which returns after every chunk.
                task(&mut scratch, index, unsafe { shared.row(index) });
            }
            if let Some(row_done) = row_done.filter(|_| whole_rows) {
                for row in units.start / units_per_row..units.end / units_per_row {
                    // SAFETY: this chunk's own units (finished: no mutable reference to
                    // them is alive, and no other chunk writes them), which make whole
                    // rows of the output.
                    let values = unsafe { shared.rows(row * units_per_row, units_per_row) };
                    row_done(row, values);
                }
                reported.fetch_add(units.len() / units_per_row, Ordering::Relaxed);
            }
        });
        reported.into_inner()
    } else {
        let mut scratch = new_scratch();
        for (index, dst) in out.chunks_mut(width).enumerate() {
            task(&mut scratch, index, dst);
        }
        if let Some(row_done) = row_done {
            for (row, values) in out.chunks(units_per_row * width).enumerate() {
                row_done(row, values);
            }
            return end_row;
        }
        0
    }
}

/// `query` as a quantized key cache's `vec_dot` takes it: rotated as the keys were
/// (llama.cpp's Hadamard rotation, in `rotated`, `head_dim` values) and quantized to Q8_0
/// into `out` (one row).
fn quantize_query(problem: &Problem<'_>, query: &[f32], rotated: &mut Vec<f32>, out: &mut [u8]) {
    let query = match problem.key_rotation {
        Some(n) => {
            rotated.clear();
            rotated.extend_from_slice(query);
            hadamard::rotate_chunks(rotated, n);
            &rotated[..]
        }
        None => query,
    };
    quantize_activation(ActivationFormat::Q8_0, query, out);
}

/// What the attention calls with each row it finished: the row's index and values.
pub type RowDone<'a> = dyn Fn(usize, &[f32]) + Sync + 'a;

/// Attention of the query at (`row`, `head`) over positions `first_visible ..= position`.
#[allow(clippy::too_many_arguments)]
fn one_head(
    isa: Isa,
    problem: &Problem<'_>,
    span: &SequenceSpan,
    row: usize,
    head: usize,
    position: usize,
    dst: &mut [f32],
    scratch: &mut Scratch,
) {
    let query = problem.query(row, head);
    let f16_keys = matches!(problem.keys, CpuKv::F16(_));
    let f16_values = matches!(problem.values, CpuKv::F16(_));
    if f16_keys {
        vector::to_f16(query, &mut scratch.query);
    }
    if problem.key_dot.is_some() {
        scratch
            .query_q8
            .resize(activation_row_bytes(ActivationFormat::Q8_0, query.len()), 0);
        quantize_query(problem, query, &mut scratch.value, &mut scratch.query_q8);
    }
    let accumulator = &mut scratch.accumulator;
    if f16_values {
        accumulator.fill(f16::ZERO);
    } else {
        dst.fill(0.0);
    }
    let key_dot = |key: &[u8]| {
        let dot = problem.key_dot.expect("set for a Q8_0 or Q4_0 key cache");
        dot(problem.head_dim, key, &scratch.query_q8)
    };
    let mut max = f32::NEG_INFINITY;
    let mut sum = 0.0f32;
    for key_position in problem.first_visible(position)..=position {
        let cell = span.cell(key_position);
        let dot = match problem.key(cell, head) {
            CacheRow::F16(key) => vector::dot_f16(isa, &scratch.query, key),
            CacheRow::F32(key) => vector::dot_f32(isa, query, key),
            CacheRow::Q8_0(key) => key_dot(bytemuck::cast_slice(key)),
            CacheRow::Q4_0(key) => key_dot(bytemuck::cast_slice(key)),
        };
        let score = dot * problem.scale;
        // `rescale` shrinks what was accumulated when the maximum grows; `weight` is
        // exp(score - max) of this key.
        let raised = score > max;
        let (rescale, weight) = vector::online_step(score, &mut max);
        if raised {
            if f16_values {
                vector::scale_f16(isa, accumulator, rescale);
            } else {
                vector::scale_f32(dst, rescale);
            }
        }
        match problem.value(cell, head) {
            CacheRow::F16(value) => vector::mad_f16(isa, accumulator, value, weight),
            CacheRow::F32(value) => vector::mad_f32(isa, dst, value, weight),
            // ggml's `v_to_float` (the reference dequantization), then an f32 `mad`.
            CacheRow::Q8_0(value) => {
                dequantize_row_q8_0(value, &mut scratch.value);
                vector::mad_f32(isa, dst, &scratch.value, weight)
            }
            CacheRow::Q4_0(value) => {
                dequantize_row_q4_0(value, &mut scratch.value);
                vector::mad_f32(isa, dst, &scratch.value, weight)
            }
        }
        // ggml's `S = S*ms + vs`, which gcc compiles to a fused multiply-add.
        sum = sum.mul_add(rescale, weight);
    }
    if f16_values {
        vector::to_f32(accumulator, dst);
    }
    let inverse = if sum == 0.0 { 0.0 } else { 1.0 / sum };
    vector::scale_f32(dst, inverse);
    if let Some(n) = problem.value_rotation {
        hadamard::rotate_chunks(dst, n);
    }
}
