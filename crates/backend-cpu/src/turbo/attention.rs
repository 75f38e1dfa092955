//! Attention over TurboQuant caches, in the rotated basis: each query head is rotated once
//! per block (`R q`, and for the keys' sketch `S R q`), every score is computed from the
//! codes (`|k| (<R q, c> + sqrt(pi/2)/BLOCK |r| <S R q, signs>)` per block), values are
//! accumulated as `weight |v| c` in the rotated basis, and the sum is rotated back once at
//! the end. No f16 or f32 copy of a cache row is made. The softmax is online in f32 (as the
//! one-chunk path of the float caches).

use runit_backend::turbo::{self, TurboLayout, BLOCK};
use runit_backend::SequenceSpan;

use super::{code_dot, code_mad, sign_dot, Table};
use crate::ops::attention::{row_owners, CacheRow, Problem};
use crate::storage::CpuKv;
use crate::vector::{self, Isa};
use crate::CpuBackend;

/// The two caches' layouts and codebooks.
struct Books {
    keys: TurboLayout,
    values: TurboLayout,
    key_table: Table,
    value_table: Table,
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
    let books = Books {
        keys: keys.layout,
        values: values.layout,
        key_table: Table::new(keys.layout.code_bits),
        value_table: Table::new(values.layout.code_bits),
    };
    let owner = row_owners(spans, end_row);
    let heads = problem.heads;
    let head_dim = problem.head_dim;
    let isa = backend.isa;
    backend.for_rows(
        &mut out[..end_row * heads * head_dim],
        head_dim,
        end_row * heads,
        |index, dst| {
            let row = index / heads;
            if let Some(span) = spans.get(owner[row]) {
                let position = span.start_position + (row - span.first_row);
                let head = index % heads;
                match isa {
                    // SAFETY: `Isa::Avx2` is made only by `Isa::detect`, after detecting
                    // AVX2 and FMA.
                    #[cfg(target_arch = "x86_64")]
                    Isa::Avx2 => unsafe {
                        one_head_fma(isa, problem, &books, span, row, head, position, dst)
                    },
                    _ => one_head(isa, problem, &books, span, row, head, position, dst),
                }
            }
        },
    );
}

/// The f16 stored at `bytes[at..at + 2]`.
fn f16_at(bytes: &[u8], at: usize) -> f32 {
    half::f16::from_le_bytes([bytes[at], bytes[at + 1]]).to_f32()
}

/// [`one_head`] compiled for AVX2 and FMA: its scalar multiply-adds become instructions
/// instead of calls to `fmaf` (the same correctly rounded results).
///
/// # Safety
/// The CPU must have AVX2 and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::too_many_arguments)]
unsafe fn one_head_fma(
    isa: Isa,
    problem: &Problem<'_>,
    books: &Books,
    span: &SequenceSpan,
    row: usize,
    head: usize,
    position: usize,
    dst: &mut [f32],
) {
    one_head(isa, problem, books, span, row, head, position, dst)
}

/// Attention of the query at (`row`, `head`) over positions `first_visible ..= position`.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn one_head(
    isa: Isa,
    problem: &Problem<'_>,
    books: &Books,
    span: &SequenceSpan,
    row: usize,
    head: usize,
    position: usize,
    dst: &mut [f32],
) {
    let blocks = problem.head_dim / BLOCK;
    // Row position of this head's first block in the cache (its KV head's).
    let first_block = head / problem.group * blocks;
    let query = problem.query(row, head);
    let mut rotated = vec![[0.0f32; BLOCK]; blocks];
    let mut sketched = vec![[0.0f32; BLOCK]; blocks];
    for (b, (r, s)) in rotated.iter_mut().zip(sketched.iter_mut()).enumerate() {
        r.copy_from_slice(&query[b * BLOCK..(b + 1) * BLOCK]);
        turbo::rotate(r, first_block + b);
        *s = *r;
        turbo::sketch(s, first_block + b);
    }
    let mut accumulator = vec![[0.0f32; BLOCK]; blocks];
    // The values' outliers, accumulated in the unrotated basis.
    let mut outliers = vec![[0.0f32; BLOCK]; blocks];
    let mut codes = [0u8; BLOCK];
    let (keys, values) = (books.keys, books.values);
    let sketch_factor = turbo::sketch_factor();
    let mut max = f32::NEG_INFINITY;
    let mut sum = 0.0f32;
    for key_position in problem.first_visible(position)..=position {
        let cell = span.cell(key_position);
        let (CacheRow::Turbo(key), CacheRow::Turbo(value)) =
            (problem.key(cell, head), problem.value(cell, head))
        else {
            unreachable!("TurboQuant caches give TurboQuant rows");
        };
        let mut dot = 0.0f32;
        for (b, bytes) in key.chunks_exact(keys.block_bytes()).enumerate() {
            turbo::unpack_codes(
                &bytes[keys.code_offset()..keys.sign_offset()],
                keys.code_bits,
                &mut codes,
            );
            let mut block_dot = code_dot(isa, &rotated[b], &codes, &books.key_table);
            if keys.sketch {
                let at = keys.sign_offset();
                let signs = u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"));
                let residual = sketch_factor * f16_at(bytes, 2);
                block_dot = residual.mul_add(sign_dot(isa, &sketched[b], signs), block_dot);
            }
            dot = f16_at(bytes, 0).mul_add(block_dot, dot);
            for (index, value) in keys.outliers(bytes) {
                dot = query[b * BLOCK + index].mul_add(value, dot);
            }
        }
        let score = dot * problem.scale;
        let mut rescale = 1.0f32;
        let mut weight = 1.0f32;
        if score > max {
            rescale = (max - score).exp();
            max = score;
            for block in accumulator.iter_mut().chain(outliers.iter_mut()) {
                vector::scale_f32(block, rescale);
            }
        } else {
            weight = (score - max).exp();
        }
        for (b, bytes) in value.chunks_exact(values.block_bytes()).enumerate() {
            turbo::unpack_codes(
                &bytes[values.code_offset()..values.sign_offset()],
                values.code_bits,
                &mut codes,
            );
            let scaled = weight * f16_at(bytes, 0);
            code_mad(isa, &mut accumulator[b], &codes, &books.value_table, scaled);
            for (index, value) in values.outliers(bytes) {
                outliers[b][index] = value.mul_add(weight, outliers[b][index]);
            }
        }
        sum = sum.mul_add(rescale, weight);
    }
    let inverse = if sum == 0.0 { 0.0 } else { 1.0 / sum };
    for (b, block) in accumulator.iter_mut().enumerate() {
        turbo::rotate_back(block, first_block + b);
        let rows = block.iter().zip(&outliers[b]);
        for (d, (v, o)) in dst[b * BLOCK..(b + 1) * BLOCK].iter_mut().zip(rows) {
            *d = (v + o) * inverse;
        }
    }
}
