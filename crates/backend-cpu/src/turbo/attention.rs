//! Attention over TurboQuant caches, in the rotated basis: each query head is rotated once
//! per block (`R q`, and for the keys' sketch `S R q`), every score is computed from the
//! codes (`|k| (<R q, c> + sqrt(pi/2)/BLOCK |r| <S R q, signs>)` per block, plus the
//! outliers against `q`), values are accumulated as `weight |v| c` in the rotated basis, and
//! the sum is rotated back once at the end. No f16 or f32 copy of a cache row is made.
//!
//! The visible keys of a query are cut into chunks of [`KEY_CHUNK`] positions from the
//! first visible one; each chunk gets its own softmax (its maximum, the weights' sum and
//! the weighted values: a *partial*), computed by `super::chunk` for all the query heads of
//! a KV head at once, and the partials are merged in chunk order. Where there are few
//! (row, KV head) pairs (a decode step) the threads take chunks, else whole pairs; the
//! chunks and the merge do not depend on which, so neither the thread count nor the batch
//! changes a row's numbers.

use runit_backend::turbo::BLOCK;
use runit_backend::SequenceSpan;

use super::chunk::{self, Queries, Side, MAX_HEADS};
use super::exp;
use crate::ops::attention::{row_owners, Problem};
use crate::storage::{CpuKv, TurboCells};
use crate::vector::Isa;
use crate::{CpuBackend, SharedRows};

/// Key positions of one chunk.
pub const KEY_CHUNK: usize = 512;
/// Fewest key positions (summed over rows and heads) worth handing to the thread team.
const PARALLEL_MIN_KEYS: usize = 512;
/// Work units per thread below which the threads split a (row, KV head) pair's chunks.
const UNITS_PER_THREAD: usize = 4;

/// What every unit of work reads.
struct Context<'a> {
    problem: &'a Problem<'a>,
    spans: &'a [SequenceSpan],
    owner: Vec<usize>,
    keys: &'a TurboCells,
    values: &'a TurboCells,
    kv_heads: usize,
    /// Whether the AVX-512 kernels run.
    wide: bool,
    /// Whether the scalar twins may be compiled with AVX2 and FMA (`Isa::Avx2`).
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    fma: bool,
}

/// Values of one chunk's partial for a (row, KV head) pair: per query head of the group,
/// the maximum, the weights' sum, the rotated accumulator and the outliers'
/// (`[2 + 2 * head_dim]`).
fn partial_len(problem: &Problem<'_>) -> usize {
    problem.group * (2 + 2 * problem.head_dim)
}

impl Context<'_> {
    /// The span owning `row`, if any.
    fn span(&self, row: usize) -> Option<&SequenceSpan> {
        self.spans.get(self.owner[row])
    }

    /// The query position of `row` and its visible key positions.
    fn keys_of(&self, row: usize) -> Option<(usize, std::ops::RangeInclusive<usize>)> {
        let span = self.span(row)?;
        let position = span.start_position + (row - span.first_row);
        Some((position, self.problem.first_visible(position)..=position))
    }

    /// Chunks of `row`'s visible keys (0 for a row no span owns).
    fn chunks(&self, row: usize) -> usize {
        self.keys_of(row)
            .map_or(0, |(_, keys)| keys.count().div_ceil(KEY_CHUNK))
    }

    fn side<'c>(&self, cells: &'c TurboCells, kv_head: usize) -> Side<'c> {
        let blocks = self.problem.head_dim / BLOCK;
        Side::new(
            &cells.bytes,
            cells.layout,
            cells.blocks,
            kv_head * blocks,
            blocks,
        )
    }

    /// The partial of chunk `chunk` of (`row`, `kv_head`) into `out` ([`partial_len`]).
    fn partial(&self, row: usize, kv_head: usize, chunk: usize, out: &mut [f32]) {
        #[cfg(target_arch = "x86_64")]
        if self.fma {
            // SAFETY: `fma` is set only for `Isa::Avx2`, which `Isa::detect` makes after
            // detecting AVX2 and FMA.
            return unsafe { self.partial_fma(row, kv_head, chunk, out) };
        }
        self.partial_body(row, kv_head, chunk, out)
    }

    /// [`Context::partial_body`] compiled for AVX2 and FMA: the scalar twins' multiply-adds
    /// become instructions instead of calls to `fmaf` (the same correctly rounded results).
    ///
    /// # Safety
    /// The CPU must have AVX2 and FMA.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn partial_fma(&self, row: usize, kv_head: usize, chunk: usize, out: &mut [f32]) {
        self.partial_body(row, kv_head, chunk, out)
    }

    #[inline(always)]
    fn partial_body(&self, row: usize, kv_head: usize, chunk: usize, out: &mut [f32]) {
        let problem = self.problem;
        let (group, head_dim) = (problem.group, problem.head_dim);
        let (_, visible) = self.keys_of(row).expect("a chunk of an owned row");
        let span = self.span(row).expect("owned");
        let start = visible.start() + chunk * KEY_CHUNK;
        let end = (start + KEY_CHUNK).min(visible.end() + 1);
        let cells: Vec<usize> = (start..end).map(|p| span.cell(p)).collect();
        let keys = self.side(self.keys, kv_head);
        let values = self.side(self.values, kv_head);
        let stride = cells.len().next_multiple_of(super::LANES);
        let mut scores = vec![0.0f32; MAX_HEADS * stride];
        let first_head = kv_head * group;
        let per_head = 2 + 2 * head_dim;
        for first in (0..group).step_by(MAX_HEADS) {
            let heads = MAX_HEADS.min(group - first);
            let queries = Queries::new(heads, head_dim, kv_head * head_dim / BLOCK, |g| {
                problem.query(row, first_head + first + g)
            });
            chunk::scores(
                self.wide,
                &queries,
                &keys,
                &cells,
                problem.scale,
                &mut scores,
                stride,
            );
            let mut accumulator = vec![0.0f32; heads * head_dim];
            let mut outliers = vec![0.0f32; heads * head_dim];
            let mut steps = [(0.0f32, 0.0f32); MAX_HEADS];
            for (g, step) in steps.iter_mut().take(heads).enumerate() {
                *step = chunk::softmax(self.wide, &mut scores[g * stride..][..cells.len()]);
            }
            chunk::values(
                self.wide,
                &values,
                &cells,
                heads,
                &scores,
                stride,
                &mut accumulator,
                &mut outliers,
            );
            for g in 0..heads {
                let dst = &mut out[(first + g) * per_head..][..per_head];
                (dst[0], dst[1]) = steps[g];
                dst[2..2 + head_dim].copy_from_slice(&accumulator[g * head_dim..][..head_dim]);
                dst[2 + head_dim..].copy_from_slice(&outliers[g * head_dim..][..head_dim]);
            }
        }
    }

    /// Merges a (row, KV head) pair's partials (`[chunks, partial_len]`) in chunk order
    /// and writes its heads' outputs into `dst` (`[group, head_dim]`).
    fn merge(&self, kv_head: usize, partials: &[f32], dst: &mut [f32]) {
        let head_dim = self.problem.head_dim;
        let per_head = 2 + 2 * head_dim;
        let len = partial_len(self.problem);
        for (g, dst) in dst.chunks_exact_mut(head_dim).enumerate() {
            let max = partials
                .chunks_exact(len)
                .map(|p| p[g * per_head])
                .fold(f32::NEG_INFINITY, f32::max);
            let mut sum = 0.0f32;
            let mut merged = vec![0.0f32; 2 * head_dim];
            for partial in partials.chunks_exact(len) {
                let partial = &partial[g * per_head..][..per_head];
                let factor = exp(partial[0] - max);
                sum = partial[1].mul_add(factor, sum);
                for (m, &p) in merged.iter_mut().zip(&partial[2..]) {
                    *m = p.mul_add(factor, *m);
                }
            }
            let (accumulator, outliers) = merged.split_at_mut(head_dim);
            let inverse = if sum == 0.0 { 0.0 } else { 1.0 / sum };
            let first_block = kv_head * head_dim / BLOCK;
            for (b, block) in accumulator.chunks_exact_mut(BLOCK).enumerate() {
                let block: &mut [f32; BLOCK] = block.try_into().expect("a block");
                runit_backend::turbo::rotate_back(block, first_block + b);
            }
            for (d, (v, o)) in dst.iter_mut().zip(accumulator.iter().zip(outliers.iter())) {
                *d = (v + o) * inverse;
            }
        }
    }

    /// The outputs of (`row`, `kv_head`) computed whole into `dst`.
    fn pair(&self, row: usize, kv_head: usize, dst: &mut [f32]) {
        let len = partial_len(self.problem);
        let chunks = self.chunks(row);
        if chunks == 0 {
            return;
        }
        let mut partials = vec![0.0f32; chunks * len];
        for (chunk, out) in partials.chunks_exact_mut(len).enumerate() {
            self.partial(row, kv_head, chunk, out);
        }
        self.merge(kv_head, &partials, dst);
    }
}

/// Computes every (row, head) of `out` (`[end_row, heads, head_dim]`) that a span owns.
///
/// # Panics
/// Unless both caches of `problem` are TurboQuant caches (checked by the caller).
pub fn run(
    backend: &CpuBackend,
    problem: &Problem<'_>,
    spans: &[SequenceSpan],
    end_row: usize,
    out: &mut [f32],
) {
    let (CpuKv::Turbo(keys), CpuKv::Turbo(values)) = (problem.keys, problem.values) else {
        unreachable!("called for TurboQuant caches only");
    };
    let context = Context {
        problem,
        spans,
        owner: row_owners(spans, end_row),
        keys,
        values,
        kv_heads: problem.heads / problem.group,
        wide: wide(backend.isa),
        fma: backend.isa != Isa::Scalar && !wide(backend.isa),
    };
    // One output row per (row, KV head): the group's heads are adjacent.
    let width = problem.group * problem.head_dim;
    let pairs = end_row * context.kv_heads;
    let out = &mut out[..pairs * width];
    let visited: usize = (0..end_row)
        .filter_map(|row| context.keys_of(row))
        .map(|(_, keys)| keys.count())
        .sum::<usize>()
        * problem.heads;
    let threads = backend.threads();
    if threads == 1 || pairs == 0 || visited < PARALLEL_MIN_KEYS {
        for (pair, dst) in out.chunks_exact_mut(width).enumerate() {
            context.pair(pair / context.kv_heads, pair % context.kv_heads, dst);
        }
        return;
    }
    let shared = SharedRows::new(out, width);
    if pairs >= UNITS_PER_THREAD * threads {
        backend.run_chunks(pairs, &|pair| {
            // SAFETY: each pair is its own row of `width`, computed by this chunk only;
            // `out` outlives `run_chunks`, which returns after every chunk.
            let dst = unsafe { shared.row(pair) };
            context.pair(pair / context.kv_heads, pair % context.kv_heads, dst);
        });
        return;
    }
    // Few pairs: one unit per chunk, then the merges.
    let mut units = Vec::new();
    let mut first_unit = Vec::with_capacity(pairs + 1);
    for pair in 0..pairs {
        first_unit.push(units.len());
        for chunk in 0..context.chunks(pair / context.kv_heads) {
            units.push((pair, chunk));
        }
    }
    first_unit.push(units.len());
    let len = partial_len(problem);
    let mut partials = vec![0.0f32; units.len() * len];
    let shared_partials = SharedRows::new(&mut partials, len);
    backend.run_chunks(units.len(), &|unit| {
        let (pair, chunk) = units[unit];
        // SAFETY: each unit is its own row of `len`, computed by this chunk only;
        // `partials` outlives `run_chunks`, which returns after every chunk.
        let dst = unsafe { shared_partials.row(unit) };
        context.partial(pair / context.kv_heads, pair % context.kv_heads, chunk, dst);
    });
    for pair in 0..pairs {
        let units = first_unit[pair]..first_unit[pair + 1];
        if !units.is_empty() {
            // SAFETY: the parallel work is over; this is the only reference to the row.
            let dst = unsafe { shared.row(pair) };
            let partials = &partials[units.start * len..units.end * len];
            context.merge(pair % context.kv_heads, partials, dst);
        }
    }
}

/// Whether the AVX-512 kernels run (never for `Isa::Scalar`, the twins' level).
fn wide(isa: Isa) -> bool {
    #[cfg(target_arch = "x86_64")]
    if isa != Isa::Scalar {
        return super::x86::available();
    }
    let _ = isa;
    false
}
