//! TurboQuant KV blocks on the CPU (`runit_backend::turbo` holds the layout, codebooks and
//! rotations): writing rows, and the per-block kernels the attention runs on the codes.
//!
//! Each kernel has a portable twin (`Isa::Scalar`) doing the very same float operations in
//! the same order (eight lanes, lane `l` taking coordinates `l, l + 8, ...` with fused
//! multiply-adds, then `(l0 + l4) + (l2 + l6)` and `(l1 + l5) + (l3 + l7)` added), so the
//! AVX2 kernels equal it bit for bit.

pub mod attention;
#[cfg(test)]
mod tests;
#[cfg(target_arch = "x86_64")]
mod x86;

use runit_backend::turbo::{self, TurboLayout, BLOCK};

use crate::vector::Isa;

/// Lanes of the kernels' partial sums.
const LANES: usize = 8;

/// Encodes the row `row` (a whole number of blocks) into `dst` (`row.len() / BLOCK`
/// blocks of `layout`), block `b` with the rotation of row position `b`.
pub fn encode_row(layout: TurboLayout, row: &[f32], dst: &mut [u8]) {
    for (block, (x, out)) in row
        .chunks_exact(BLOCK)
        .zip(dst.chunks_exact_mut(layout.block_bytes()))
        .enumerate()
    {
        turbo::encode_block(layout, x, block, out);
    }
}

/// A codebook's centroids padded to 16 entries (the AVX2 lookup reads two registers).
#[derive(Clone, Copy)]
pub struct Table(pub [f32; 16]);

impl Table {
    /// The centroids of the `bits`-bit codebook.
    pub fn new(bits: usize) -> Table {
        let mut table = [0.0; 16];
        for (t, c) in table.iter_mut().zip(&turbo::codebook(bits).centroids) {
            *t = *c;
        }
        Table(table)
    }
}

/// The twins' horizontal sum of eight lanes.
fn reduce(lanes: [f32; LANES]) -> f32 {
    let s: [f32; 4] = std::array::from_fn(|k| lanes[k] + lanes[k + 4]);
    (s[0] + s[2]) + (s[1] + s[3])
}

/// `sum_i q[i] * table[codes[i]]`.
pub fn code_dot(isa: Isa, q: &[f32; BLOCK], codes: &[u8; BLOCK], table: &Table) -> f32 {
    match isa {
        // SAFETY: `Isa::Avx2` is made only by `Isa::detect`, after detecting AVX2 and FMA.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { x86::code_dot(q, codes, table) },
        Isa::Scalar => {
            let mut lanes = [0.0f32; LANES];
            for (q, codes) in q.chunks_exact(LANES).zip(codes.chunks_exact(LANES)) {
                for l in 0..LANES {
                    lanes[l] = q[l].mul_add(table.0[usize::from(codes[l])], lanes[l]);
                }
            }
            reduce(lanes)
        }
    }
}

/// `sum_i q[i] * s[i]` where `s[i]` is -1 where bit `i` of `signs` is set, else +1.
pub fn sign_dot(isa: Isa, q: &[f32; BLOCK], signs: u64) -> f32 {
    match isa {
        // SAFETY: `Isa::Avx2` is made only by `Isa::detect`, after detecting AVX2 and FMA.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { x86::sign_dot(q, signs) },
        Isa::Scalar => {
            let mut lanes = [0.0f32; LANES];
            for (chunk, q) in q.chunks_exact(LANES).enumerate() {
                for l in 0..LANES {
                    let sign = if signs >> (chunk * LANES + l) & 1 == 1 {
                        -1.0f32
                    } else {
                        1.0
                    };
                    lanes[l] = q[l].mul_add(sign, lanes[l]);
                }
            }
            reduce(lanes)
        }
    }
}

/// `acc[i] += table[codes[i]] * weight` (one fused multiply-add each).
pub fn code_mad(isa: Isa, acc: &mut [f32; BLOCK], codes: &[u8; BLOCK], table: &Table, weight: f32) {
    match isa {
        // SAFETY: `Isa::Avx2` is made only by `Isa::detect`, after detecting AVX2 and FMA.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { x86::code_mad(acc, codes, table, weight) },
        Isa::Scalar => {
            for (a, &code) in acc.iter_mut().zip(codes) {
                *a = table.0[usize::from(code)].mul_add(weight, *a);
            }
        }
    }
}
