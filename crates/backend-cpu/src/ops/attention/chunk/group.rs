//! ggml's one-chunk flash attention for all the query heads that share one KV head, for f16
//! keys and values below 128 dimensions (where ggml's f16 vector code is all f32 products
//! and f64 sums; no native f16 part): per head exactly the operations of
//! [`super::one_head`], bit for bit, arranged for speed. Each key and value row is widened
//! once for the group; the Q·K dots of all visible keys run first (they do not depend on
//! one another, so they pipeline instead of waiting on the softmax); then one pass over the
//! keys runs every head's online softmax and V accumulation, the accumulators kept as f32
//! values rounded to f16 after every step (as ggml's f16 accumulator rounds them).
//!
//! With AVX-512, where the group's accumulators fit sixteen registers (SmolLM2's three
//! heads of 64: twelve), the dots take 512-bit f64 registers, every head's softmax steps
//! (the `exp` calls) run before the V pass, and the V pass keeps the accumulators in
//! registers; the same operations in the same order, so the same bits as the AVX2 kernels.

use runit_backend::SequenceSpan;

use super::super::Problem;
use crate::storage::CpuKv;
use crate::vector::Isa;

/// Largest group of query heads per KV head this kernel takes (the accumulator arrays).
const MAX_GROUP: usize = 16;

/// Per-worker buffers.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
#[derive(Default)]
pub(in crate::ops::attention) struct Scratch {
    /// The group's queries rounded to f16, widened to f64 (`[group, head_dim]`).
    query: Vec<f64>,
    /// The group's V accumulators (`[group, head_dim]`), f16 values held as f32.
    accumulator: Vec<f32>,
    /// Scaled Q·K of every head and visible key (`[group, keys]`).
    scores: Vec<f32>,
    /// Offset of each visible key's row (and value's) in its cache.
    rows: Vec<usize>,
    /// Per visible key and head (`[keys, group]`), the online softmax's step: what the
    /// accumulator is scaled by (1 where the maximum held) and the key's weight.
    steps: Vec<[f32; 2]>,
    /// Keeps to the AVX2 kernels where the AVX-512 ones apply (for the tests that compare
    /// the two).
    pub(in crate::ops::attention) narrow: bool,
}

/// True when [`run`] computes this problem: AVX2 kernels, f16 caches, head_dim a multiple
/// of 8 below 128, at most [`MAX_GROUP`] query heads per KV head.
pub(in crate::ops::attention) fn applies(isa: Isa, problem: &Problem<'_>) -> bool {
    let caches = matches!(
        (problem.keys, problem.values),
        (CpuKv::F16(_), CpuKv::F16(_))
    );
    let d = problem.head_dim;
    cfg!(target_arch = "x86_64")
        && isa != Isa::Scalar
        && caches
        && d.is_multiple_of(8)
        && runit_quant::dot::half_arith::body_len(d) == 0
        && problem.group <= MAX_GROUP
}

/// Attention of the queries at `row`, heads `first_head .. first_head + group` (one KV
/// head's), over positions `first_visible ..= position`, into `dst` (`[group, head_dim]`).
/// Only called where [`applies`] holds.
#[cfg_attr(not(target_arch = "x86_64"), allow(unused_variables))]
pub(in crate::ops::attention) fn run(
    problem: &Problem<'_>,
    span: &SequenceSpan,
    row: usize,
    first_head: usize,
    position: usize,
    dst: &mut [f32],
    scratch: &mut Scratch,
) {
    let (CpuKv::F16(keys), CpuKv::F16(values)) = (problem.keys, problem.values) else {
        unreachable!("`applies` checked the cache types");
    };
    let (group, d) = (problem.group, problem.head_dim);
    let first = problem.first_visible(position);
    let visible = position + 1 - first;
    scratch.query.resize(group * d, 0.0);
    scratch.accumulator.clear();
    scratch.accumulator.resize(group * d, 0.0);
    scratch.scores.resize(group * visible, 0.0);
    let kv_offset = first_head / group * d;
    scratch.rows.clear();
    // Block by block (`span.cell` divides per position).
    let block_size = span.block_size.max(1);
    let mut p = first;
    while p <= position {
        let block = span.block_table[p / block_size] as usize * block_size;
        let end = (p / block_size + 1) * block_size;
        for p in p..end.min(position + 1) {
            let cell = block + p % block_size;
            scratch.rows.push(cell * problem.kv_width + kv_offset);
        }
        p = end;
    }
    #[cfg(target_arch = "x86_64")]
    // SAFETY: the caller runs this only where `applies` holds: `isa` is not scalar, and
    // `Isa::Avx2` is made only by `Isa::detect` after detecting AVX2, FMA and F16C; `d` is
    // a multiple of 8 and the group at most `MAX_GROUP`. The AVX-512 kernels run only where
    // `x86::wide` detected AVX-512 F and VL. Every row read lies inside its cache (the
    // attention op checked every cell of the span; the kernels slice each row, so a bad one
    // panics), and the scratch buffers have the sizes set above.
    unsafe {
        for g in 0..group {
            x86::round_to_f16(
                problem.query(row, first_head + g),
                &mut scratch.query[g * d..(g + 1) * d],
            );
        }
        let wide = !scratch.narrow && x86::wide(group, d);
        if wide {
            x86::scores_wide(
                &scratch.query,
                keys,
                values,
                &scratch.rows,
                d,
                problem.scale,
                &mut scratch.scores,
            );
        } else {
            x86::scores(
                &scratch.query,
                keys,
                values,
                &scratch.rows,
                d,
                problem.scale,
                &mut scratch.scores,
            );
        }
        let sum = if wide {
            // The softmax's exponentials first (calls, which would spill registers held
            // across them), then the V sums with the accumulators in registers.
            let sum = x86::softmax_steps(&scratch.scores, group, &mut scratch.steps);
            x86::attend_wide(
                &scratch.steps,
                &scratch.rows,
                values,
                d,
                &mut scratch.accumulator,
            );
            sum
        } else {
            x86::attend(
                &scratch.scores,
                &scratch.rows,
                values,
                d,
                &mut scratch.accumulator,
            )
        };
        for g in 0..group {
            let inverse = if sum[g] == 0.0 { 0.0 } else { 1.0 / sum[g] };
            for (out, &value) in dst[g * d..(g + 1) * d]
                .iter_mut()
                .zip(&scratch.accumulator[g * d..(g + 1) * d])
            {
                *out = value * inverse;
            }
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (keys, values, dst);
        unreachable!("`applies` is false off x86-64");
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    // The kernels index several per-head arrays (accumulators, scores) by the same `g`.
    #![allow(clippy::needless_range_loop)]

    use std::arch::x86_64::*;

    use half::f16;
    use runit_quant::cpu::{self, Feature};

    use super::MAX_GROUP;

    /// `$function::<G>(args)` for the group size `$group` known at run time (1 to
    /// `MAX_GROUP`).
    macro_rules! with_group {
        ($group:expr, $function:ident $args:tt) => {
            with_group!(@ $group, $function $args; 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16)
        };
        (@ $group:expr, $function:ident $args:tt; $($g:literal)*) => {
            match $group {
                $($g => $function::<$g> $args,)*
                group => unreachable!("groups of {group} heads"),
            }
        };
    }

    /// Eight f16 at `p` widened.
    #[inline(always)]
    unsafe fn widen(p: *const f16) -> __m256 {
        _mm256_cvtph_ps(_mm_loadu_si128(p.cast()))
    }

    /// Rounds eight f32 lanes to f16 and back (nearest even), as storing them in an f16
    /// accumulator does.
    #[inline(always)]
    unsafe fn round_f16(v: __m256) -> __m256 {
        _mm256_cvtph_ps(_mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(v))
    }

    /// `dst = f16(src)` widened to f64 (`vector::to_f16` of the query); lengths are equal
    /// multiples of 8.
    ///
    /// # Safety
    /// AVX2, FMA and F16C are available.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn round_to_f16(src: &[f32], dst: &mut [f64]) {
        for (src, dst) in src.chunks_exact(8).zip(dst.chunks_exact_mut(8)) {
            let rounded = round_f16(_mm256_loadu_ps(src.as_ptr()));
            _mm256_storeu_pd(
                dst.as_mut_ptr(),
                _mm256_cvtps_pd(_mm256_castps256_ps128(rounded)),
            );
            _mm256_storeu_pd(
                dst.as_mut_ptr().add(4),
                _mm256_cvtps_pd(_mm256_extractf128_ps::<1>(rounded)),
            );
        }
    }

    /// How many keys ahead the loops prefetch cache rows (16 took the least attention time of
    /// 3, 8 and 16 in a SmolLM2 decode batch of 8): a decode step reads each
    /// sequence's rows once, mostly from memory, and their strided addresses (one head of
    /// each cell) outrun the hardware prefetcher.
    pub(super) const PREFETCH_KEYS: usize = 16;

    /// Prefetches the key row at `keys[at..]` and the value row at `values[at..]` (`d` each):
    /// the V pass reads the value after the softmax, so fetched with its key it is there.
    #[inline(always)]
    fn prefetch_key_and_value(keys: &[f16], values: &[f16], at: usize, d: usize) {
        prefetch_row(keys, at, d);
        prefetch_row(values, at, d);
    }

    /// Prefetches the `d` f16 values at `cache[at..]`.
    #[inline(always)]
    pub(super) fn prefetch_row(cache: &[f16], at: usize, d: usize) {
        let row = &cache[at..at + d];
        for line in (0..d).step_by(32) {
            // SAFETY: a prefetch hint of an address inside `row` (`line < d`): it reads no
            // memory architecturally and never faults.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(row[line..].as_ptr().cast()) };
        }
    }

    /// The sum of eight f64 partial sums (lanes 0-3 in `low`, 4-7 in `high`) in
    /// `vector::reduce`'s order: `((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7))`.
    #[inline(always)]
    unsafe fn reduce(low: __m256d, high: __m256d) -> f64 {
        let pairs = _mm256_add_pd(low, high);
        let folded = _mm_add_pd(
            _mm256_castpd256_pd128(pairs),
            _mm256_extractf128_pd::<1>(pairs),
        );
        _mm_cvtsd_f64(folded) + _mm_cvtsd_f64(_mm_unpackhi_pd(folded, folded))
    }

    /// `scores[g * visible + j] = dot(query g, key at rows[j]) * scale` for the `G` heads,
    /// each dot as `vector::dot_f16`'s AVX2 twin computes it: lane `c % 8` of eight f64
    /// partial sums takes the product of element `c` (exact in f32, so an f64 FMA of the
    /// widened operands adds the same value), folded in `vector::reduce`'s order, rounded
    /// to f32. `query` holds the group's f16-rounded queries widened to f64; each key chunk
    /// is widened once for all heads.
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn scores_of<const G: usize>(
        query: &[f64],
        keys: &[f16],
        values: &[f16],
        rows: &[usize],
        d: usize,
        scale: f32,
        scores: &mut [f32],
    ) {
        let visible = rows.len();
        let q = query[..G * d].as_ptr();
        // The first rows' misses at once (the loop prefetches the rest ahead of use).
        rows.iter()
            .take(PREFETCH_KEYS)
            .for_each(|&at| prefetch_key_and_value(keys, values, at, d));
        for (j, &at) in rows.iter().enumerate() {
            if let Some(&ahead) = rows.get(j + PREFETCH_KEYS) {
                prefetch_key_and_value(keys, values, ahead, d);
            }
            let key = keys[at..at + d].as_ptr();
            let mut low = [_mm256_setzero_pd(); G];
            let mut high = [_mm256_setzero_pd(); G];
            for c in (0..d).step_by(8) {
                let k = widen(key.add(c));
                let k_low = _mm256_cvtps_pd(_mm256_castps256_ps128(k));
                let k_high = _mm256_cvtps_pd(_mm256_extractf128_ps::<1>(k));
                for g in 0..G {
                    let qg = q.add(g * d + c);
                    low[g] = _mm256_fmadd_pd(_mm256_loadu_pd(qg), k_low, low[g]);
                    high[g] = _mm256_fmadd_pd(_mm256_loadu_pd(qg.add(4)), k_high, high[g]);
                }
            }
            for g in 0..G {
                scores[g * visible + j] = reduce(low[g], high[g]) as f32 * scale;
            }
        }
    }

    /// [`scores_of`] for a group of `query.len() / d` heads (at most `MAX_GROUP`).
    ///
    /// # Safety
    /// AVX2, FMA and F16C are available; every `rows[j] + d` lies inside `keys` and
    /// `values`; `scores` holds `group * rows.len()` values.
    pub(super) unsafe fn scores(
        query: &[f64],
        keys: &[f16],
        values: &[f16],
        rows: &[usize],
        d: usize,
        scale: f32,
        scores: &mut [f32],
    ) {
        with_group!(
            query.len() / d,
            scores_of(query, keys, values, rows, d, scale, scores)
        )
    }

    /// The key loop of `one_head` for the `G` heads: per key, each head's online softmax
    /// step (`rescale`/`weight` from `exp`, `sum = fma(sum, rescale, weight)`), then its V
    /// accumulation ([`accumulate`]); returns the heads' sums.
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn attend_of<const G: usize>(
        scores: &[f32],
        rows: &[usize],
        values: &[f16],
        d: usize,
        accumulator: &mut [f32],
    ) -> [f32; MAX_GROUP] {
        let visible = rows.len();
        let mut max = [f32::NEG_INFINITY; G];
        let mut sum = [0.0f32; MAX_GROUP];
        let mut rescales = [1.0f32; G];
        let mut weights = [1.0f32; G];
        for (j, &at) in rows.iter().enumerate() {
            if let Some(&ahead) = rows.get(j + PREFETCH_KEYS) {
                prefetch_row(values, ahead, d);
            }
            for g in 0..G {
                let (rescale, weight) =
                    crate::vector::online_step(scores[g * visible + j], &mut max[g]);
                sum[g] = sum[g].mul_add(rescale, weight);
                rescales[g] = rescale;
                weights[g] = weight;
            }
            accumulate(accumulator, &values[at..at + d], &rescales, &weights);
        }
        sum
    }

    /// [`attend_of`] for a group of `accumulator.len() / d` heads (at most `MAX_GROUP`).
    ///
    /// # Safety
    /// AVX2, FMA and F16C are available; every `rows[j] + d` lies inside `values`;
    /// `scores` holds `group * rows.len()` values.
    pub(super) unsafe fn attend(
        scores: &[f32],
        rows: &[usize],
        values: &[f16],
        d: usize,
        accumulator: &mut [f32],
    ) -> [f32; MAX_GROUP] {
        with_group!(
            accumulator.len() / d,
            attend_of(scores, rows, values, d, accumulator)
        )
    }

    /// The online softmax of `group` heads over their `scores` (`[group, keys]`), key by key
    /// as `one_head` runs it: each step's `[rescale, weight]` into `steps` (`[keys, group]`);
    /// returns the heads' sums.
    ///
    /// # Safety
    /// FMA is available.
    #[target_feature(enable = "fma")]
    pub(super) unsafe fn softmax_steps(
        scores: &[f32],
        group: usize,
        steps: &mut Vec<[f32; 2]>,
    ) -> [f32; MAX_GROUP] {
        let visible = scores.len() / group.max(1);
        steps.clear();
        steps.resize(visible * group, [1.0, 1.0]);
        let mut sum = [0.0f32; MAX_GROUP];
        for g in 0..group {
            let mut max = f32::NEG_INFINITY;
            for (j, &score) in scores[g * visible..(g + 1) * visible].iter().enumerate() {
                let (rescale, weight) = crate::vector::online_step(score, &mut max);
                sum[g] = sum[g].mul_add(rescale, weight);
                steps[j * group + g] = [rescale, weight];
            }
        }
        sum
    }

    /// True when this CPU runs the AVX-512 kernels ([`scores_wide`], [`attend_wide`]: AVX2,
    /// FMA, F16C, AVX-512 F and VL, as [`cpu`] allows them) and they take `group` heads of
    /// `d` dimensions: the accumulators of all the heads (`d / 16` registers each) fit in
    /// sixteen registers.
    pub(super) fn wide(group: usize, d: usize) -> bool {
        matches!(d, 32 | 64)
            && group * d / 16 <= 16
            && cpu::may_use_all(&cpu::AVX2)
            && cpu::may_use_all(&[Feature::Avx512F, Feature::Avx512Vl])
    }

    /// [`scores_of`] with each head's eight f64 partial sums in one 512-bit register (lane
    /// `c % 8` takes element `c`, as there), folded in the same order.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl")]
    unsafe fn scores_wide_of<const G: usize>(
        query: &[f64],
        keys: &[f16],
        values: &[f16],
        rows: &[usize],
        d: usize,
        scale: f32,
        scores: &mut [f32],
    ) {
        let visible = rows.len();
        let q = query[..G * d].as_ptr();
        // The first rows' misses at once (the loop prefetches the rest ahead of use).
        rows.iter()
            .take(PREFETCH_KEYS)
            .for_each(|&at| prefetch_key_and_value(keys, values, at, d));
        for (j, &at) in rows.iter().enumerate() {
            if let Some(&ahead) = rows.get(j + PREFETCH_KEYS) {
                prefetch_key_and_value(keys, values, ahead, d);
            }
            let key = keys[at..at + d].as_ptr();
            let mut acc = [_mm512_setzero_pd(); G];
            for c in (0..d).step_by(8) {
                let k = _mm512_cvtps_pd(widen(key.add(c)));
                for g in 0..G {
                    acc[g] = _mm512_fmadd_pd(_mm512_loadu_pd(q.add(g * d + c)), k, acc[g]);
                }
            }
            for g in 0..G {
                let (low, high) = (
                    _mm512_castpd512_pd256(acc[g]),
                    _mm512_extractf64x4_pd::<1>(acc[g]),
                );
                scores[g * visible + j] = reduce(low, high) as f32 * scale;
            }
        }
    }

    /// [`scores`] through [`scores_wide_of`].
    ///
    /// # Safety
    /// As [`scores`], and [`wide`] holds.
    pub(super) unsafe fn scores_wide(
        query: &[f64],
        keys: &[f16],
        values: &[f16],
        rows: &[usize],
        d: usize,
        scale: f32,
        scores: &mut [f32],
    ) {
        with_group!(
            query.len() / d,
            scores_wide_of(query, keys, values, rows, d, scale, scores)
        )
    }

    /// Sixteen f32 lanes rounded to f16 and back (nearest even).
    #[inline(always)]
    unsafe fn round_f16_wide(v: __m512) -> __m512 {
        _mm512_cvtph_ps(_mm512_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(v))
    }

    /// [`attend_of`]'s V sums for `G` heads of `16 * C` dimensions, with the softmax's
    /// steps given (`steps[j * G + g]`, from `softmax_steps`) and the accumulators held in
    /// registers: per key, where the head's maximum moved `acc = f16(acc * rescale)`, then
    /// `acc = f16(fma(value, weight, acc))`, lane for lane as [`accumulate`] computes them.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl")]
    unsafe fn attend_wide_of<const G: usize, const C: usize>(
        steps: &[[f32; 2]],
        rows: &[usize],
        values: &[f16],
        accumulator: &mut [f32],
    ) {
        let d = 16 * C;
        assert!(steps.len() >= rows.len() * G && accumulator.len() >= G * d);
        let mut acc = [[_mm512_setzero_ps(); C]; G];
        for (j, &at) in rows.iter().enumerate() {
            if let Some(&ahead) = rows.get(j + PREFETCH_KEYS) {
                prefetch_row(values, ahead, d);
            }
            let v = values[at..at + d].as_ptr();
            let value: [__m512; C] =
                std::array::from_fn(|c| _mm512_cvtph_ps(_mm256_loadu_si256(v.add(16 * c).cast())));
            for g in 0..G {
                let [rescale, weight] = *steps.get_unchecked(j * G + g);
                if rescale != 1.0 {
                    let rescale = _mm512_set1_ps(rescale);
                    for c in 0..C {
                        acc[g][c] = round_f16_wide(_mm512_mul_ps(acc[g][c], rescale));
                    }
                }
                let weight = _mm512_set1_ps(weight);
                for c in 0..C {
                    acc[g][c] = round_f16_wide(_mm512_fmadd_ps(value[c], weight, acc[g][c]));
                }
            }
        }
        for g in 0..G {
            for c in 0..C {
                _mm512_storeu_ps(accumulator.as_mut_ptr().add(g * d + 16 * c), acc[g][c]);
            }
        }
    }

    /// [`attend_wide_of`] for the group of `accumulator.len() / d` heads.
    ///
    /// # Safety
    /// As [`attend`], `steps` holds `group * rows.len()` steps, and [`wide`] holds.
    pub(super) unsafe fn attend_wide(
        steps: &[[f32; 2]],
        rows: &[usize],
        values: &[f16],
        d: usize,
        accumulator: &mut [f32],
    ) {
        macro_rules! dispatch {
            ($($g:literal $c:literal),*) => {
                match (accumulator.len() / d, d / 16) {
                    $(($g, $c) => attend_wide_of::<$g, $c>(steps, rows, values, accumulator),)*
                    (group, chunks) => unreachable!("`wide` refuses {group} heads of {chunks} x 16"),
                }
            };
        }
        dispatch!(1 2, 2 2, 3 2, 4 2, 5 2, 6 2, 7 2, 8 2, 1 4, 2 4, 3 4, 4 4)
    }

    /// For every head `g` of the accumulators (`[group, d]`, f16 values held as f32): where the maximum moved
    /// (`rescales[g] != 1`), `acc = f16(acc * rescale)` (`vector::scale_f16`); then
    /// `acc = f16(fma(value, weights[g], acc))` (`vector::mad_f16`).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn accumulate(
        accumulator: &mut [f32],
        value: &[f16],
        rescales: &[f32],
        weights: &[f32],
    ) {
        let d = value.len();
        let v = value.as_ptr();
        for (g, (&rescale, &weight)) in rescales.iter().zip(weights).enumerate() {
            let acc = accumulator[g * d..(g + 1) * d].as_mut_ptr();
            let weight = _mm256_set1_ps(weight);
            let rescale = (rescale != 1.0).then(|| _mm256_set1_ps(rescale));
            for c in (0..d).step_by(8) {
                let mut a = _mm256_loadu_ps(acc.add(c));
                if let Some(rescale) = rescale {
                    a = round_f16(_mm256_mul_ps(a, rescale));
                }
                a = round_f16(_mm256_fmadd_ps(widen(v.add(c)), weight, a));
                _mm256_storeu_ps(acc.add(c), a);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use half::f16;
    use runit_backend::testing::Rng;
    use runit_backend::SequenceSpan;

    use super::super::super::Problem;
    use crate::cells::Cells;
    use crate::storage::CpuKv;
    use crate::vector::Isa;

    /// The group kernel equals the scalar `one_head` of every head bit for bit, over
    /// group sizes, head dims, windows, block tables and value ranges that overflow f16
    /// accumulators.
    #[test]
    fn group_kernel_equals_the_scalar_one_head() {
        let isa = Isa::detect(true);
        if isa == Isa::Scalar {
            return;
        }
        let mut rng = Rng::new(0x9a0c);
        let mut compared = 0;
        for (heads, kv_heads, d, window, magnitude) in [
            (9, 3, 64, None, 1.0),
            (14, 2, 64, None, 4.0),
            (4, 4, 32, Some(5), 1.0),
            (8, 1, 120, None, 2.0),
            (6, 3, 8, Some(40), 30.0),
            (16, 2, 32, None, 8.0),
            (8, 2, 64, Some(60), 1.0),
        ] {
            let kv_width = kv_heads * d;
            let (block_size, blocks) = (16, 8);
            let n_cells = block_size * blocks;
            let half = |n: usize, rng: &mut Rng| -> Vec<f16> {
                rng.values(n, -magnitude, magnitude)
                    .into_iter()
                    .map(f16::from_f32)
                    .collect()
            };
            let keys = CpuKv::F16(Cells::from(&half(n_cells * kv_width, &mut rng)[..]));
            let values = CpuKv::F16(Cells::from(&half(n_cells * kv_width, &mut rng)[..]));
            let rows = 3;
            let q = rng.values(rows * heads * d, -magnitude, magnitude);
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
                key_dot: None,
                key_gather_dot: None,
                key_rotation: None,
                value_rotation: None,
            };
            assert!(super::applies(isa, &problem));
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
                    // The AVX-512 kernels where this CPU has them and the shape takes
                    // them, and the AVX2 ones.
                    let [mut fast, mut narrow] = [0, 1].map(|_| vec![0.0f32; group * d]);
                    for (out, narrow) in [(&mut fast, false), (&mut narrow, true)] {
                        scratch.group.narrow = narrow;
                        super::run(
                            &problem,
                            &span,
                            row,
                            kv_head * group,
                            position,
                            out,
                            &mut scratch.group,
                        );
                    }
                    for g in 0..group {
                        let mut twin = vec![0.0f32; d];
                        let head = kv_head * group + g;
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
                        for (fast, kernels) in [(&fast, "best"), (&narrow, "AVX2")] {
                            assert_eq!(
                                bits(&fast[g * d..(g + 1) * d]),
                                bits(&twin),
                                "{kernels} kernels, h{heads}/{kv_heads} d{d} window {window:?} row {row} head {head}"
                            );
                        }
                        compared += 1;
                    }
                }
            }
        }
        assert!(compared > 100, "{compared} heads compared");
    }
}
