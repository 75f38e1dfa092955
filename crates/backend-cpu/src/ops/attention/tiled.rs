//! ggml's tiled flash-attention path (`ggml_compute_forward_flash_attn_ext_tiled`), taken for
//! batches of 64 query rows or more: per (head, tile of up to 64 query rows), keys in tiles of
//! 64 positions. Everything is f32: K and V are widened from the cache, each score is one
//! fused multiply-add chain over the head dimension, the softmax is online per key tile
//! (the tile's exponentials by ggml's `ggml_vec_soft_max_f32`: its polynomial `exp`, f32 sums of 16 added in f64), and V is accumulated with fused multiply-adds.

use runit_backend::SequenceSpan;

use super::{CacheRow, Problem};
use crate::vector::{self, Isa};
use crate::CpuBackend;

/// Query rows per tile and keys per tile (ggml's `ggml_fa_tile_config`).
const Q_TILE: usize = 64;
const KV_TILE: usize = 64;

/// One unit of work: query rows `first .. first + rows` of a span, one head.
struct Task<'s> {
    span: &'s SequenceSpan,
    head: usize,
    first: usize,
    rows: usize,
}

/// Computes every (row, head) of `out` that a span owns.
pub fn run(backend: &CpuBackend, problem: &Problem<'_>, spans: &[SequenceSpan], out: &mut [f32]) {
    let mut tasks = Vec::new();
    for span in spans {
        for head in 0..problem.heads {
            for first in (0..span.rows).step_by(Q_TILE) {
                tasks.push(Task {
                    span,
                    head,
                    first,
                    rows: Q_TILE.min(span.rows - first),
                });
            }
        }
    }
    let isa = backend.isa;
    let results: Vec<Vec<f32>> = if backend.threads > 1 && tasks.len() > 1 {
        let slots: Vec<std::sync::Mutex<Vec<f32>>> =
            tasks.iter().map(|_| Default::default()).collect();
        backend.run_chunks(tasks.len(), &|index| {
            let result = tile(isa, problem, &tasks[index]);
            *slots[index].lock().expect("each slot is filled once") = result;
        });
        slots
            .into_iter()
            .map(|slot| slot.into_inner().expect("no chunk panicked"))
            .collect()
    } else {
        tasks.iter().map(|task| tile(isa, problem, task)).collect()
    };
    let head_dim = problem.head_dim;
    for (task, result) in tasks.iter().zip(results) {
        for (r, values) in result.chunks_exact(head_dim).enumerate() {
            let row = task.span.first_row + task.first + r;
            let at = (row * problem.heads + task.head) * head_dim;
            out[at..at + head_dim].copy_from_slice(values);
        }
    }
}

/// Attention of one query tile; returns `[task.rows, head_dim]`.
fn tile(isa: Isa, problem: &Problem<'_>, task: &Task<'_>) -> Vec<f32> {
    let d = problem.head_dim;
    let rows = task.rows;
    let span = task.span;
    let positions: Vec<usize> = (0..rows)
        .map(|r| span.start_position + task.first + r)
        .collect();
    let lows: Vec<usize> = positions
        .iter()
        .map(|p| problem.first_visible(*p))
        .collect();
    let mut max = vec![f32::NEG_INFINITY; rows];
    let mut sum = vec![0.0f32; rows];
    let mut accumulator = vec![0.0f32; rows * d];
    let mut keys = vec![0.0f32; d * KV_TILE]; // [d, KV_TILE]: transposed, keys contiguous
    let mut values = vec![0.0f32; KV_TILE * d]; // [KV_TILE, d]
    let mut scores = vec![0.0f32; rows * KV_TILE];
    let lowest = lows.iter().copied().min().unwrap_or(0);
    let highest = positions.last().copied().unwrap_or(0);

    let mut start = lowest / KV_TILE * KV_TILE;
    while start <= highest {
        let count = KV_TILE.min(highest + 1 - start);
        let visible = |tq: usize, tk: usize| {
            let p = start + tk;
            tk < count && p >= lows[tq] && p <= positions[tq]
        };
        if !(0..rows).any(|tq| (0..count).any(|tk| visible(tq, tk))) {
            start += KV_TILE;
            continue;
        }
        keys.fill(0.0);
        for tk in 0..count {
            let cell = span.cell(start + tk);
            match problem.key(cell, task.head) {
                CacheRow::F16(key) => {
                    for (dk, k) in key.iter().enumerate() {
                        keys[dk * KV_TILE + tk] = k.to_f32();
                    }
                }
                CacheRow::F32(key) => {
                    for (dk, k) in key.iter().enumerate() {
                        keys[dk * KV_TILE + tk] = *k;
                    }
                }
                _ => unreachable!("the tiled path is taken by f16 and f32 caches only"),
            }
            let value = &mut values[tk * d..(tk + 1) * d];
            match problem.value(cell, task.head) {
                CacheRow::F16(v) => vector::to_f32(v, value),
                CacheRow::F32(v) => value.copy_from_slice(v),
                _ => unreachable!("the tiled path is taken by f16 and f32 caches only"),
            }
        }
        scores.fill(0.0);
        for (tq, score_row) in scores.chunks_exact_mut(KV_TILE).enumerate() {
            let query = problem.query(span.first_row + task.first + tq, task.head);
            // score[tk] += q[dk] * key[dk][tk], dk in order (one FMA chain per score).
            vector::mad_rows_f32(isa, score_row, &keys[..d * KV_TILE], query, false);
        }
        vector::scale_f32(&mut scores, problem.scale);
        for (tq, score_row) in scores.chunks_exact_mut(KV_TILE).enumerate() {
            for (tk, score) in score_row.iter_mut().enumerate() {
                if !visible(tq, tk) {
                    *score = f32::NEG_INFINITY;
                }
            }
            let tile_max = score_row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            if tile_max == f32::NEG_INFINITY {
                score_row.fill(0.0);
                continue;
            }
            let new_max = max[tq].max(tile_max);
            let acc = &mut accumulator[tq * d..(tq + 1) * d];
            if new_max > max[tq] {
                let rescale = (max[tq] - new_max).exp();
                vector::scale_f32(acc, rescale);
                sum[tq] *= rescale;
            }
            max[tq] = new_max;
            // ggml_vec_soft_max_f32 over the whole tile (masked and padded keys are -inf).
            let tile_sum = vector::soft_max_f32(isa, score_row, new_max);
            sum[tq] = (f64::from(sum[tq]) + tile_sum) as f32;
            // acc += weight[tk] * value[tk], tk in order, zero weights skipped.
            vector::mad_rows_f32(isa, acc, &values[..count * d], &score_row[..count], true);
        }
        start += KV_TILE;
    }
    for (acc, s) in accumulator.chunks_exact_mut(d).zip(&sum) {
        vector::scale_f32(acc, if *s == 0.0 { 0.0 } else { 1.0 / s });
    }
    accumulator
}
