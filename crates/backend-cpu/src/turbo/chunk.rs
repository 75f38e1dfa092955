//! The kernels of one chunk of keys for up to [`MAX_HEADS`] query heads of one KV head:
//! the scores from the key codes, the softmax's weights, and the weighted sum of the value
//! codes. Each key's codes are unpacked once for all the heads.
//!
//! The portable twins below fix the order of every float operation; the AVX-512 kernels
//! (`super::x86`, where `wide` is set) repeat it, so both give the same bits:
//!
//! - score of a key for head `g`: sixteen lanes, lane `l` accumulating, block by block,
//!   `R q[i] * (c[code_i] * |k|)` for `i = l, l + 16, l + 32, l + 48` and then the sketch's
//!   `S R q[i] * (+-alpha)` (`alpha = (sqrt(pi/2)/64 * |r|) * |k|`, negative where the sign
//!   bit is set), all fused multiply-adds; the lanes summed by `super::reduce`; then each
//!   block's outliers `q[index] * value` added by fused multiply-adds; then times the scale;
//! - weights: `super::exp(score - max)`, summed in sixteen lanes (key `k` in lane `k % 16`,
//!   in key order) and reduced;
//! - values: `acc[i] += (c[code_i] * |v|) * weight` (rotated basis), the outliers
//!   `out[index] += value * weight` (unrotated), fused, keys in order.

use runit_backend::turbo::{self, TurboLayout, BLOCK};

use super::{exp, reduce, Table, LANES};

/// Query heads one kernel call takes (their accumulators stay in sixteen registers).
pub const MAX_HEADS: usize = 4;

/// The queries of up to [`MAX_HEADS`] heads sharing one KV head, each `[head_dim]`.
pub struct Queries {
    pub heads: usize,
    pub head_dim: usize,
    /// `R q`, block by block (`[heads, head_dim]`).
    pub rotated: Vec<f32>,
    /// `S R q`, block by block (`[heads, head_dim]`).
    pub sketched: Vec<f32>,
    /// `q` itself, for the outliers (`[heads, head_dim]`).
    pub plain: Vec<f32>,
}

impl Queries {
    /// The queries `query(g)` for `g < heads`, of the KV head whose first block sits at
    /// row position `first_block`.
    pub fn new<'q>(
        heads: usize,
        head_dim: usize,
        first_block: usize,
        query: impl Fn(usize) -> &'q [f32],
    ) -> Queries {
        let mut plain = Vec::with_capacity(heads * head_dim);
        for g in 0..heads {
            plain.extend_from_slice(query(g));
        }
        let mut rotated = plain.clone();
        let mut sketched = plain.clone();
        for (b, (r, s)) in rotated
            .chunks_exact_mut(BLOCK)
            .zip(sketched.chunks_exact_mut(BLOCK))
            .enumerate()
        {
            let block = first_block + b % (head_dim / BLOCK);
            let r: &mut [f32; BLOCK] = r.try_into().expect("a block");
            turbo::rotate(r, block);
            s.copy_from_slice(r);
            turbo::sketch(s.try_into().expect("a block"), block);
        }
        Queries {
            heads,
            head_dim,
            rotated,
            sketched,
            plain,
        }
    }
}

/// One side (keys or values) of a KV head in a TurboQuant cache.
pub struct Side<'a> {
    /// The whole cache.
    pub bytes: &'a [u8],
    pub layout: TurboLayout,
    pub table: Table,
    /// Row position of the KV head's first block.
    pub first_block: usize,
    /// Bytes of one cache row (all KV heads' blocks, then their outliers' indices).
    row_bytes: usize,
    /// Offset of the KV head's first block in a row.
    offset: usize,
    /// Bytes of the KV head's blocks.
    len: usize,
    /// Offset of the outliers' indices in a row, and their bytes.
    indices: (usize, usize),
}

impl Side<'_> {
    /// The `blocks` blocks from row position `first_block` of a cache of `layout` whose
    /// rows have `row_blocks` blocks.
    pub fn new(
        bytes: &[u8],
        layout: TurboLayout,
        row_blocks: usize,
        first_block: usize,
        blocks: usize,
    ) -> Side<'_> {
        let block_bytes = layout.block_bytes();
        Side {
            bytes,
            layout,
            table: Table::new(layout.code_bits),
            first_block,
            row_bytes: layout.row_bytes(row_blocks),
            offset: first_block * block_bytes,
            len: blocks * block_bytes,
            indices: (row_blocks * block_bytes, layout.index_bytes(row_blocks)),
        }
    }

    /// The KV head's blocks in cache row `cell`.
    pub fn row(&self, cell: usize) -> &[u8] {
        let at = cell * self.row_bytes + self.offset;
        &self.bytes[at..at + self.len]
    }

    /// The outliers' index bytes of cache row `cell` (every KV head's blocks).
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    pub fn index_bytes(&self, cell: usize) -> &[u8] {
        let at = cell * self.row_bytes + self.indices.0;
        &self.bytes[at..at + self.indices.1]
    }

    /// The outliers `(index, value)` of block `b` of the KV head in cache row `cell`, whose
    /// bytes are `block`.
    pub fn outliers<'b>(
        &'b self,
        cell: usize,
        b: usize,
        block: &'b [u8],
    ) -> impl Iterator<Item = (usize, f32)> + 'b {
        let at = cell * self.row_bytes + self.indices.0;
        let indices = &self.bytes[at..at + self.indices.1];
        self.layout.outliers(block, indices, self.first_block + b)
    }
}

/// The f16 stored at `bytes[at..at + 2]`.
fn f16_at(bytes: &[u8], at: usize) -> f32 {
    half::f16::from_le_bytes([bytes[at], bytes[at + 1]]).to_f32()
}

/// The sign sketch of a key block.
fn sign_bits(layout: TurboLayout, block: &[u8]) -> u64 {
    let at = layout.sign_offset();
    u64::from_le_bytes(block[at..at + 8].try_into().expect("8 sign bytes"))
}

/// The codes of a block.
fn codes(layout: TurboLayout, block: &[u8]) -> [u8; BLOCK] {
    let mut codes = [0u8; BLOCK];
    turbo::unpack_codes(
        &block[layout.code_offset()..layout.sign_offset()],
        layout.code_bits,
        &mut codes,
    );
    codes
}

/// `scores[g * stride + k]`: the scaled score of the key in cache row `cells[k]` for head
/// `g` of `queries`.
#[inline(always)]
pub fn scores(
    wide: bool,
    queries: &Queries,
    keys: &Side<'_>,
    cells: &[usize],
    scale: f32,
    scores: &mut [f32],
    stride: usize,
) {
    #[cfg(target_arch = "x86_64")]
    if wide {
        // SAFETY: `wide` is set only where `x86::available` holds.
        unsafe { super::x86::scores(queries, keys, cells, scale, scores, stride) };
        return;
    }
    let _ = wide;
    let head_dim = queries.head_dim;
    let layout = keys.layout;
    let block_bytes = layout.block_bytes();
    for (k, &cell) in cells.iter().enumerate() {
        let row = keys.row(cell);
        for g in 0..queries.heads {
            let mut lanes = [0.0f32; LANES];
            for (b, block) in row.chunks_exact(block_bytes).enumerate() {
                let at = g * head_dim + b * BLOCK;
                let norm = f16_at(block, 0);
                let codes = codes(layout, block);
                let rotated = &queries.rotated[at..at + BLOCK];
                for (i, (&q, &code)) in rotated.iter().zip(&codes).enumerate() {
                    let c = keys.table.0[usize::from(code)] * norm;
                    lanes[i % LANES] = q.mul_add(c, lanes[i % LANES]);
                }
                if layout.sketch {
                    let alpha = turbo::sketch_factor() * f16_at(block, 2) * norm;
                    let signs = sign_bits(layout, block);
                    let sketched = &queries.sketched[at..at + BLOCK];
                    for (i, &q) in sketched.iter().enumerate() {
                        let s = if signs >> i & 1 == 1 { -alpha } else { alpha };
                        lanes[i % LANES] = q.mul_add(s, lanes[i % LANES]);
                    }
                }
            }
            let mut dot = reduce(&lanes);
            for (b, block) in row.chunks_exact(block_bytes).enumerate() {
                let plain = &queries.plain[g * head_dim + b * BLOCK..];
                for (index, value) in keys.outliers(cell, b, block) {
                    dot = plain[index].mul_add(value, dot);
                }
            }
            scores[g * stride + k] = dot * scale;
        }
    }
}

/// Turns one head's scores into softmax weights `exp(score - max)`, in place; returns
/// the maximum and the weights' sum.
#[inline(always)]
pub fn softmax(wide: bool, scores: &mut [f32]) -> (f32, f32) {
    #[cfg(target_arch = "x86_64")]
    if wide {
        // SAFETY: `wide` is set only where `x86::available` holds.
        return unsafe { super::x86::softmax(scores) };
    }
    let _ = wide;
    let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut lanes = [0.0f32; LANES];
    for (k, score) in scores.iter_mut().enumerate() {
        *score = exp(*score - max);
        lanes[k % LANES] += *score;
    }
    (max, reduce(&lanes))
}

/// Adds the values in cache rows `cells`, key `k` weighted by `weights[g * stride + k]`
/// for head `g`, to `accumulator` (rotated basis) and their outliers to `outliers`
/// (`[heads, head_dim]` each).
#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub fn values(
    wide: bool,
    values: &Side<'_>,
    cells: &[usize],
    heads: usize,
    weights: &[f32],
    stride: usize,
    accumulator: &mut [f32],
    outliers: &mut [f32],
) {
    let head_dim = accumulator.len() / heads;
    #[cfg(target_arch = "x86_64")]
    if wide {
        // SAFETY: `wide` is set only where `x86::available` holds.
        unsafe { super::x86::values(values, cells, heads, weights, stride, accumulator, outliers) };
        return;
    }
    let _ = wide;
    let layout = values.layout;
    for (k, &cell) in cells.iter().enumerate() {
        let row = values.row(cell);
        for (b, block) in row.chunks_exact(layout.block_bytes()).enumerate() {
            let norm = f16_at(block, 0);
            let codes = codes(layout, block);
            for g in 0..heads {
                let weight = weights[g * stride + k];
                let at = g * head_dim + b * BLOCK;
                for (a, &code) in accumulator[at..at + BLOCK].iter_mut().zip(&codes) {
                    *a = (values.table.0[usize::from(code)] * norm).mul_add(weight, *a);
                }
                for (index, value) in values.outliers(cell, b, block) {
                    let o = &mut outliers[at + index];
                    *o = value.mul_add(weight, *o);
                }
            }
        }
    }
}
