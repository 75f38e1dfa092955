//! TurboQuant KV layout (Zandieh et al., 2025, "TurboQuant: Online Vector Quantization with
//! Near-optimal Distortion Rate"), shared by every backend so that their caches agree byte
//! for byte.
//!
//! A cache row is cut into blocks of [`BLOCK`] values (a head of 64 is one block, of 128
//! two). First the block's [`OUTLIERS`] coordinates of largest magnitude are kept apart
//! (f16 value in the block, 6-bit index in the row's index bytes) and zeroed: LLM keys have a few channels far larger than the rest,
//! and the rotation would spread their quantization error over every coordinate. The rest
//! `x` is stored as its norm and the codes of the unit vector
//! `y = R x / |x|`, where `R = H D / sqrt(BLOCK)` is a randomized Hadamard transform (`D` a
//! diagonal of seeded random signs, one seed per block position in the row, so each head
//! has its own rotation). After the rotation every coordinate of `y` follows the same
//! known distribution (for a uniformly rotated unit vector in dimension d: density
//! proportional to `(1 - t^2)^((d - 3) / 2)`, close to N(0, 1/d)); each coordinate is
//! quantized on its own with the Lloyd-Max codebook of that distribution ([`codebook`]).
//!
//! Values (`b` bits): `b`-bit codes. Keys (`b` bits) spend `b + 1` bits a coordinate. tq4
//! keys: 4-bit codes plus the paper's 1-bit quantized Johnson-Lindenstrauss sketch of the
//! residual `r = y - c(codes)`: the signs of `S r` (`S = H D'`, a second seeded randomized
//! Hadamard) and `|r|`, so that `<q, k>` is estimated without bias as
//! `|x| (<R q, c> + sqrt(pi/2) / BLOCK |r| <S R q, signs>)`. tq3 keys: 4-bit codes and no
//! sketch (two bytes a block fewer than 3-bit codes and the sketch, no residual norm).
//!
//! The paper's inner-product quantizer spends `b - 1` bits on the codes and one on the
//! sketch; on SmolLM2 (`-c 128`) that cost +19% perplexity at 4 bits, against +5.8% for
//! `b`-bit codes plus the sketch (and +9.9% for `b`-bit codes alone): the softmax magnifies
//! the sketch's variance more than the codes' bias (figures before the outliers). With the
//! outliers and the keys centered (the model's mean key subtracted, which moves all scores
//! of a query together: `Device::center_keys`) the same holds one bit further: tq3 keys as
//! 4-bit codes cost +1.4% where 3-bit codes and the sketch cost +7.7% (`docs/kv-cache.md`).
//!
//! A row of `n` blocks is the `n` blocks, then the outliers' indices of them all, 6 bits
//! each (`(n * OUTLIERS * 6).div_ceil(8)` bytes, [`TurboLayout::row_bytes`]): two indices
//! packed in 12 bits instead of two bytes save half a byte a block. Rows are padded to 4
//! bytes (none for heads of 128: 8 blocks of 4 KV heads leave 12 index bytes).
//!
//! Bytes per block of 64 (with its 1.5 bytes of indices): tq4 keys 49.5 (6.19 bits a value),
//! tq3 keys 39.5 (4.94), tq4 values 39.5 (4.94), tq3 values 31.5 (3.94); the outliers are
//! 5.5 of them (0.69 bits a value).

use crate::KvRole;

/// Values per rotation block (a power of two; head dimensions must be multiples).
pub const BLOCK: usize = 64;

/// Coordinates of largest magnitude each block keeps apart, in f16 with a 6-bit index
/// (keys and values): two of 64 cost 0.69 bits a value and remove the heads' outlier channels from what the
/// rotation spreads over every coordinate (on SmolLM2 `-c 128` tq3/tq3 goes from +21% to
/// +7.7% and tq4/tq4 from +5.8% to +4.1%, `docs/kv-cache.md`).
pub const OUTLIERS: usize = 2;

/// Bits of the widest codebook ([`codebook`]).
pub const MAX_CODE_BITS: usize = 4;

/// Bits of an outlier's index (a coordinate of the block).
pub const INDEX_BITS: usize = BLOCK.trailing_zeros() as usize;

/// The byte layout of one block, and of a row of blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TurboLayout {
    /// Bits of each coordinate's code.
    pub code_bits: usize,
    /// Whether the block carries the residual's sign sketch and norm (keys).
    pub sketch: bool,
    /// Coordinates of largest magnitude kept apart, each as its f16 value (in the block)
    /// and index (in the row's index bytes).
    pub outliers: usize,
}

impl TurboLayout {
    /// The layout of a `bits`-bit TurboQuant cache of `role`.
    pub const fn new(bits: usize, role: KvRole) -> TurboLayout {
        // Keys spend `bits + 1` bits a coordinate: as `bits + 1`-bit codes where the
        // codebooks reach (tq3), else `bits`-bit codes and the 1-bit sketch (tq4).
        let (code_bits, sketch) = match role {
            KvRole::Values => (bits, false),
            KvRole::Keys if bits < MAX_CODE_BITS => (bits + 1, false),
            KvRole::Keys => (bits, true),
        };
        TurboLayout {
            code_bits,
            sketch,
            outliers: OUTLIERS,
        }
    }

    /// Bytes of the outliers' values in a block: an f16 each.
    pub const fn outlier_bytes(self) -> usize {
        2 * self.outliers
    }

    /// Bytes of the outliers' indices of a row of `blocks` blocks ([`INDEX_BITS`] each, index
    /// `k` of block `b` at bit `(b * outliers + k) * INDEX_BITS`, little-endian).
    pub const fn index_bytes(self, blocks: usize) -> usize {
        (blocks * self.outliers * INDEX_BITS).div_ceil(8)
    }

    /// Bytes of a row of `blocks` blocks: the blocks, then their outliers' indices, padded to
    /// 4 bytes (the CUDA decode copies rows in 4-byte words).
    pub const fn row_bytes(self, blocks: usize) -> usize {
        (blocks * self.block_bytes() + self.index_bytes(blocks)).next_multiple_of(4)
    }

    /// Offset of the packed codes (after the header and the outliers).
    pub const fn code_offset(self) -> usize {
        self.header_bytes() + self.outlier_bytes()
    }

    /// Offset of the sign sketch (after the codes).
    pub const fn sign_offset(self) -> usize {
        self.code_offset() + self.code_bytes()
    }

    /// The outliers of the block at row position `block`: `(index, value)` pairs, from
    /// the block's bytes and the row's index bytes.
    pub fn outliers<'a>(
        self,
        bytes: &'a [u8],
        indices: &'a [u8],
        block: usize,
    ) -> impl Iterator<Item = (usize, f32)> + 'a {
        let at = self.header_bytes();
        (0..self.outliers).map(move |k| {
            let o = at + 2 * k;
            let value = half::f16::from_le_bytes([bytes[o], bytes[o + 1]]).to_f32();
            (read_index(indices, block * self.outliers + k), value)
        })
    }

    /// Bytes of the packed codes.
    pub const fn code_bytes(self) -> usize {
        BLOCK * self.code_bits / 8
    }

    /// Bytes of the sign sketch (0 without one).
    pub const fn sign_bytes(self) -> usize {
        if self.sketch {
            BLOCK / 8
        } else {
            0
        }
    }

    /// Bytes of the header: the f16 norm, and with a sketch the f16 residual norm.
    pub const fn header_bytes(self) -> usize {
        if self.sketch {
            4
        } else {
            2
        }
    }

    /// Bytes of one block (its outliers' indices are in the row's index bytes).
    pub const fn block_bytes(self) -> usize {
        self.header_bytes() + self.outlier_bytes() + self.code_bytes() + self.sign_bytes()
    }
}

/// A Lloyd-Max scalar codebook for one coordinate of a uniformly rotated unit vector in
/// dimension [`BLOCK`].
#[derive(Debug, Clone, PartialEq)]
pub struct Codebook {
    /// The `2^bits` reconstruction points, ascending.
    pub centroids: Vec<f32>,
    /// The `2^bits - 1` decision thresholds, ascending (midpoints of the centroids).
    pub thresholds: Vec<f32>,
    /// Expected squared error of a whole unit vector quantized with it (`BLOCK` times the
    /// error per coordinate): the paper's `D_mse`.
    pub distortion: f64,
}

impl Codebook {
    /// The index of the region of `value` (the number of thresholds below it).
    pub fn encode(&self, value: f32) -> u8 {
        self.thresholds.iter().filter(|&&t| value > t).count() as u8
    }
}

/// Points of the grid the codebooks are fitted on, over `[-1, 1]`.
const GRID: usize = 1 << 16;
/// Lloyd iterations (the centroids move by less than 1e-9 well before).
const LLOYD_ITERATIONS: usize = 400;

/// The codebook of `bits` (1..=4) bits, computed once: Lloyd's algorithm (thresholds at the
/// midpoints, centroids at the conditional means) on the density
/// `(1 - t^2)^((BLOCK - 3) / 2)` of one coordinate of a uniformly rotated unit vector,
/// integrated on a grid of [`GRID`] points in f64. For `BLOCK = 64` the per-vector
/// distortions come out as 0.3584, 0.1145, 0.03339 and 0.00913 for 1 to 4 bits; the paper
/// (and Max's 1960 table for a Gaussian, its large-dimension limit) gives 0.36, 0.117,
/// 0.03 and 0.009.
///
/// # Panics
/// For `bits` outside 1..=4.
pub fn codebook(bits: usize) -> &'static Codebook {
    static BOOKS: [std::sync::OnceLock<Codebook>; 4] = [const { std::sync::OnceLock::new() }; 4];
    assert!(
        (1..=4).contains(&bits),
        "TurboQuant codebooks have 1 to 4 bits, not {bits}"
    );
    BOOKS[bits - 1].get_or_init(|| lloyd_max(bits))
}

fn lloyd_max(bits: usize) -> Codebook {
    let levels = 1usize << bits;
    let exponent = (BLOCK as f64 - 3.0) / 2.0;
    let step = 2.0 / GRID as f64;
    // Midpoint rule: points and their (unnormalized) probability masses.
    let points: Vec<f64> = (0..GRID).map(|i| -1.0 + (i as f64 + 0.5) * step).collect();
    let masses: Vec<f64> = points
        .iter()
        .map(|t| (1.0 - t * t).powf(exponent))
        .collect();
    let total: f64 = masses.iter().sum();
    let sigma = 1.0 / (BLOCK as f64).sqrt();
    // Start evenly spread over +-3 sigma.
    let mut centroids: Vec<f64> = (0..levels)
        .map(|k| sigma * 3.0 * ((2 * k + 1) as f64 / levels as f64 - 1.0))
        .collect();
    let mut thresholds = vec![0.0f64; levels - 1];
    for _ in 0..LLOYD_ITERATIONS {
        for (k, threshold) in thresholds.iter_mut().enumerate() {
            *threshold = (centroids[k] + centroids[k + 1]) / 2.0;
        }
        let mut sums = vec![0.0f64; levels];
        let mut weights = vec![0.0f64; levels];
        for (t, m) in points.iter().zip(&masses) {
            let k = thresholds.iter().filter(|&&b| *t > b).count();
            sums[k] += t * m;
            weights[k] += m;
        }
        for k in 0..levels {
            if weights[k] > 0.0 {
                centroids[k] = sums[k] / weights[k];
            }
        }
    }
    for (k, threshold) in thresholds.iter_mut().enumerate() {
        *threshold = (centroids[k] + centroids[k + 1]) / 2.0;
    }
    let error: f64 = points
        .iter()
        .zip(&masses)
        .map(|(t, m)| {
            let k = thresholds.iter().filter(|&&b| *t > b).count();
            (t - centroids[k]).powi(2) * m
        })
        .sum();
    Codebook {
        centroids: centroids.iter().map(|&c| c as f32).collect(),
        thresholds: thresholds.iter().map(|&t| t as f32).collect(),
        distortion: error / total * BLOCK as f64,
    }
}

/// Which of a block's two seeded sign diagonals.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Diagonal {
    /// `D` of the rotation `R = H D / sqrt(BLOCK)`.
    Rotation,
    /// `D'` of the sketch `S = H D'`.
    Sketch,
}

/// The seeded random signs of the diagonal `which` of the block at position `block` of a
/// cache row (`block = head * head_dim / BLOCK + block within the head`): bit `i` set
/// means `-1` at coordinate `i`. SplitMix64 of the position and the diagonal.
pub fn signs(block: usize, which: Diagonal) -> u64 {
    let salt = match which {
        Diagonal::Rotation => 0x5275_6e49_5454_5130u64,
        Diagonal::Sketch => 0x534b_4554_4348_3031u64,
    };
    let mut z = (block as u64)
        .wrapping_add(salt)
        .wrapping_mul(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// In-place unnormalized Walsh-Hadamard transform of `BLOCK` values (`H H = BLOCK I`).
pub fn hadamard(x: &mut [f32; BLOCK]) {
    crate::hadamard::walsh_hadamard(x);
}

/// Multiplies `x` by the signs of `signs` (bit `i` set: negate coordinate `i`).
pub fn apply_signs(x: &mut [f32; BLOCK], signs: u64) {
    for (i, value) in x.iter_mut().enumerate() {
        if signs >> i & 1 == 1 {
            *value = -*value;
        }
    }
}

/// `R x = H D x / sqrt(BLOCK)` for the block at `block`.
pub fn rotate(x: &mut [f32; BLOCK], block: usize) {
    apply_signs(x, signs(block, Diagonal::Rotation));
    hadamard(x);
    scale_by_inverse_sqrt_block(x);
}

/// `R^T y = D H y / sqrt(BLOCK)` for the block at `block`.
pub fn rotate_back(y: &mut [f32; BLOCK], block: usize) {
    hadamard(y);
    scale_by_inverse_sqrt_block(y);
    apply_signs(y, signs(block, Diagonal::Rotation));
}

/// `S y = H D' y` for the block at `block`.
pub fn sketch(y: &mut [f32; BLOCK], block: usize) {
    apply_signs(y, signs(block, Diagonal::Sketch));
    hadamard(y);
}

fn scale_by_inverse_sqrt_block(x: &mut [f32; BLOCK]) {
    // 1/8 for BLOCK = 64: a power of two, so the scaling is exact.
    let inverse = 1.0 / (BLOCK as f32).sqrt();
    x.iter_mut().for_each(|v| *v *= inverse);
}

/// `sqrt(pi / 2) / BLOCK`: the factor of the sketch's inner-product estimate.
pub fn sketch_factor() -> f32 {
    (std::f32::consts::FRAC_PI_2).sqrt() / BLOCK as f32
}

/// Packs `codes` (each below `2^bits`) into `out` (`BLOCK * bits / 8` bytes), code `i` at
/// bits `i * bits ..` of the little-endian stream (so 8 codes fill `bits` bytes).
pub fn pack_codes(codes: &[u8; BLOCK], bits: usize, out: &mut [u8]) {
    for (group, bytes) in codes.chunks_exact(8).zip(out.chunks_exact_mut(bits)) {
        let word = group.iter().enumerate().fold(0u32, |word, (k, &code)| {
            word | u32::from(code) << (k * bits)
        });
        bytes.copy_from_slice(&word.to_le_bytes()[..bits]);
    }
}

/// Unpacks what [`pack_codes`] packed (the attention's inner loop: one call per key and
/// value block, so each width gets its own straight-line body).
pub fn unpack_codes(packed: &[u8], bits: usize, codes: &mut [u8; BLOCK]) {
    match bits {
        1 => unpack_width::<1>(packed, codes),
        2 => unpack_width::<2>(packed, codes),
        3 => unpack_width::<3>(packed, codes),
        4 => unpack_width::<4>(packed, codes),
        _ => unreachable!("codebooks have 1 to 4 bits, so packed words hold at most 32"),
    }
}

/// [`unpack_codes`] for `BITS`-bit codes: each group of 8 codes is one little-endian word
/// of `BITS` bytes.
#[inline(always)]
fn unpack_width<const BITS: usize>(packed: &[u8], codes: &mut [u8; BLOCK]) {
    let mask = (1u32 << BITS) - 1;
    for (group, bytes) in codes.chunks_exact_mut(8).zip(packed.chunks_exact(BITS)) {
        let mut word = 0u32;
        for (i, &byte) in bytes.iter().enumerate() {
            word |= u32::from(byte) << (8 * i);
        }
        for (k, code) in group.iter_mut().enumerate() {
            *code = (word >> (k * BITS) & mask) as u8;
        }
    }
}

/// Index number `slot` of a row's index bytes.
pub fn read_index(indices: &[u8], slot: usize) -> usize {
    let bit = slot * INDEX_BITS;
    let next = indices.get(bit / 8 + 1).copied().unwrap_or(0);
    let word = u16::from_le_bytes([indices[bit / 8], next]);
    usize::from(word >> (bit % 8)) & (BLOCK - 1)
}

/// Sets index number `slot` of a row's index bytes to `index` (below [`BLOCK`]).
pub fn write_index(indices: &mut [u8], slot: usize, index: usize) {
    let bit = slot * INDEX_BITS;
    for i in 0..INDEX_BITS {
        let (byte, shift) = ((bit + i) / 8, (bit + i) % 8);
        indices[byte] = indices[byte] & !(1 << shift) | ((index >> i & 1) as u8) << shift;
    }
}

/// Encodes the row `row` (a whole number of blocks) into `dst` (`layout.row_bytes(blocks)`),
/// block `b` with the rotation of row position `b`.
pub fn encode_row(layout: TurboLayout, row: &[f32], dst: &mut [u8]) {
    let blocks = row.len() / BLOCK;
    let (bodies, indices) = dst.split_at_mut(blocks * layout.block_bytes());
    for (b, (x, out)) in row
        .chunks_exact(BLOCK)
        .zip(bodies.chunks_exact_mut(layout.block_bytes()))
        .enumerate()
    {
        let kept = encode_block(layout, x, b, out);
        for (k, &index) in kept.iter().take(layout.outliers).enumerate() {
            write_index(indices, b * layout.outliers + k, index);
        }
    }
}

/// Decodes a row that [`encode_row`] wrote (`out.len() / BLOCK` blocks).
pub fn decode_row(layout: TurboLayout, bytes: &[u8], out: &mut [f32]) {
    let blocks = out.len() / BLOCK;
    let (bodies, indices) = bytes.split_at(blocks * layout.block_bytes());
    for (b, (encoded, out)) in bodies
        .chunks_exact(layout.block_bytes())
        .zip(out.chunks_exact_mut(BLOCK))
        .enumerate()
    {
        decode_block(layout, encoded, indices, b, out);
    }
}

/// Encodes one block `x` at row position `block` into `out` (`layout.block_bytes()`);
/// returns the indices of its outliers (the first `layout.outliers` entries), which belong
/// in the row's index bytes.
pub fn encode_block(
    layout: TurboLayout,
    x: &[f32],
    block: usize,
    out: &mut [u8],
) -> [usize; OUTLIERS] {
    let mut y: [f32; BLOCK] = x.try_into().expect("a block of BLOCK values");
    let header = layout.header_bytes();
    let mut kept = [0; OUTLIERS];
    for (k, kept) in kept.iter_mut().enumerate().take(layout.outliers) {
        // Largest magnitude left (the first on ties), kept as f16; its rounding error stays.
        let (index, _) = y.iter().enumerate().fold((0, -1.0f32), |best, (i, v)| {
            if v.abs() > best.1 {
                (i, v.abs())
            } else {
                best
            }
        });
        let value = half::f16::from_f32(y[index]);
        y[index] -= value.to_f32();
        let o = header + 2 * k;
        out[o..o + 2].copy_from_slice(&value.to_le_bytes());
        *kept = index;
    }
    let norm = y.iter().map(|v| v * v).sum::<f32>().sqrt();
    rotate(&mut y, block);
    let inverse = if norm > 0.0 { 1.0 / norm } else { 0.0 };
    y.iter_mut().for_each(|v| *v *= inverse);
    let book = codebook(layout.code_bits);
    let codes: [u8; BLOCK] = std::array::from_fn(|i| book.encode(y[i]));
    out[..2].copy_from_slice(&half::f16::from_f32(norm).to_le_bytes());
    pack_codes(
        &codes,
        layout.code_bits,
        &mut out[layout.code_offset()..layout.sign_offset()],
    );
    if layout.sketch {
        let mut residual: [f32; BLOCK] =
            std::array::from_fn(|i| y[i] - book.centroids[usize::from(codes[i])]);
        let residual_norm = residual.iter().map(|v| v * v).sum::<f32>().sqrt();
        out[2..4].copy_from_slice(&half::f16::from_f32(residual_norm).to_le_bytes());
        sketch(&mut residual, block);
        let bits = residual
            .iter()
            .enumerate()
            .fold(0u64, |bits, (i, &v)| bits | u64::from(v < 0.0) << i);
        out[layout.sign_offset()..].copy_from_slice(&bits.to_le_bytes());
    }
    kept
}

/// Decodes the block at row position `block` (the reference the attention kernels are
/// tested against) from its bytes and the row's index bytes: the codebook vector, plus
/// for keys the sketch's estimate of the residual, rotated back and scaled by the norm,
/// plus the outliers.
pub fn decode_block(
    layout: TurboLayout,
    bytes: &[u8],
    indices: &[u8],
    block: usize,
    out: &mut [f32],
) {
    let norm = half::f16::from_le_bytes([bytes[0], bytes[1]]).to_f32();
    let mut codes = [0u8; BLOCK];
    unpack_codes(
        &bytes[layout.code_offset()..layout.sign_offset()],
        layout.code_bits,
        &mut codes,
    );
    let book = codebook(layout.code_bits);
    let mut y: [f32; BLOCK] = std::array::from_fn(|i| book.centroids[usize::from(codes[i])]);
    if layout.sketch {
        let residual_norm = half::f16::from_le_bytes([bytes[2], bytes[3]]).to_f32();
        let sign_bits = u64::from_le_bytes(
            bytes[layout.sign_offset()..layout.sign_offset() + 8]
                .try_into()
                .expect("8 sign bytes"),
        );
        // S^T s = D' H s.
        let mut estimate: [f32; BLOCK] =
            std::array::from_fn(|i| if sign_bits >> i & 1 == 1 { -1.0 } else { 1.0 });
        hadamard(&mut estimate);
        apply_signs(&mut estimate, signs(block, Diagonal::Sketch));
        let factor = sketch_factor() * residual_norm;
        for (value, e) in y.iter_mut().zip(&estimate) {
            *value += factor * e;
        }
    }
    rotate_back(&mut y, block);
    for (o, v) in out.iter_mut().zip(&y) {
        *o = v * norm;
    }
    for (index, value) in layout.outliers(bytes, indices, block) {
        out[index] += value;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The paper's `D_mse` for 1..=4 bits (Zandieh et al. 2025, Theorem 1 and its
    /// numerical values).
    const PAPER_DISTORTION: [f64; 4] = [0.36, 0.117, 0.03, 0.009];
    /// Max (1960), the Lloyd-Max quantizer of a unit Gaussian: the large-dimension limit.
    const GAUSSIAN_DISTORTION: [f64; 4] = [0.3634, 0.1175, 0.03454, 0.009497];

    #[test]
    fn codebooks_reach_the_papers_distortion() {
        for bits in 1..=4 {
            let book = codebook(bits);
            let d = book.distortion;
            println!(
                "{bits} bits: distortion {d:.5}, centroids {:?}",
                book.centroids
            );
            // In dimension 64 the coordinates' tails are lighter than a Gaussian's, so the
            // distortion is a little below the Gaussian's and rounds to the paper's figure.
            let gaussian = GAUSSIAN_DISTORTION[bits - 1];
            assert!(d < gaussian && d > 0.95 * gaussian, "{bits} bits: {d}");
            let paper = PAPER_DISTORTION[bits - 1];
            assert!(
                (d - paper).abs() / paper < 0.14,
                "{bits} bits: {d} vs {paper}"
            );
            assert_eq!(book.centroids.len(), 1 << bits);
            for (c, m) in book.centroids.iter().zip(book.centroids.iter().rev()) {
                assert!((c + m).abs() < 1e-6, "symmetric");
            }
        }
    }

    fn random_block(seed: u64) -> [f32; BLOCK] {
        let mut state = seed;
        std::array::from_fn(|i| {
            state = signs(i, Diagonal::Rotation) ^ state.rotate_left(17);
            ((state >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * if i % 7 == 0 { 8.0 } else { 1.0 }
        })
    }

    #[test]
    fn rotations_are_orthogonal_and_codes_round_trip() {
        let x = random_block(3);
        let mut y = x;
        rotate(&mut y, 5);
        let norm = |v: &[f32]| v.iter().map(|a| a * a).sum::<f32>().sqrt();
        assert!((norm(&x) - norm(&y)).abs() < 1e-4 * norm(&x));
        rotate_back(&mut y, 5);
        for (a, b) in x.iter().zip(&y) {
            assert!((a - b).abs() < 1e-5);
        }
        for bits in 1..=4 {
            let codes: [u8; BLOCK] = std::array::from_fn(|i| (i * 5 % (1 << bits)) as u8);
            let mut packed = vec![0u8; BLOCK * bits / 8];
            pack_codes(&codes, bits, &mut packed);
            let mut back = [0u8; BLOCK];
            unpack_codes(&packed, bits, &mut back);
            assert_eq!(codes, back);
        }
    }

    #[test]
    fn decoded_blocks_have_the_codebooks_distortion_and_keys_are_unbiased() {
        let mut biases = Vec::new();
        for (bits, role) in [(4, KvRole::Values), (3, KvRole::Values), (4, KvRole::Keys)] {
            // Without outliers, so that the whole block goes through the codebook.
            let layout = TurboLayout {
                outliers: 0,
                ..TurboLayout::new(bits, role)
            };
            let mut bytes = vec![0u8; layout.block_bytes()];
            let mut error = 0.0f64;
            let mut bias = 0.0f64;
            let trials = 400;
            for trial in 0..trials {
                let x = random_block(trial);
                let query = random_block(trial + 10_000);
                encode_block(layout, &x, trial as usize % 7, &mut bytes);
                let mut decoded = [0.0f32; BLOCK];
                decode_block(layout, &bytes, &[], trial as usize % 7, &mut decoded);
                let norm2: f32 = x.iter().map(|v| v * v).sum();
                let e: f32 = x.iter().zip(&decoded).map(|(a, b)| (a - b) * (a - b)).sum();
                error += f64::from(e / norm2);
                let dot = |a: &[f32], b: &[f32]| a.iter().zip(b).map(|(p, q)| p * q).sum::<f32>();
                bias += f64::from(dot(&query, &decoded) - dot(&query, &x));
            }
            let error = error / trials as f64;
            biases.push(bias / trials as f64);
            let book = codebook(layout.code_bits).distortion;
            println!("{bits} bits {role:?}: error {error:.5} (codebook {book:.5}), bias {bias:.4}");
            if role == KvRole::Values {
                assert!((error - book).abs() < 0.25 * book, "{error} vs {book}");
            } else {
                // The paper's prod distortion for a b-bit key: the (b-1)-bit MSE error is
                // replaced by an unbiased estimate of the residual.
                assert!(error < 2.0 * book, "{error} vs {book}");
            }
        }
        // Codebook vectors shrink inner products (the 3-bit values' mean bias is about
        // -1 here); the keys' sketch removes it.
        assert!(biases[2].abs() < 0.05 && biases[1] < -0.5, "{biases:?}");
    }

    #[test]
    fn outliers_are_kept_apart_and_cut_the_error() {
        let layout = TurboLayout::new(3, KvRole::Values);
        let plain = TurboLayout {
            outliers: 0,
            ..layout
        };
        let (mut with, mut without) = (0.0f32, 0.0f32);
        for trial in 0..50 {
            let mut x = random_block(trial);
            x[9] = 40.0;
            x[50] = -25.0;
            let mut bytes = vec![0u8; layout.block_bytes()];
            // The block at row position 1: its indices are slots 2 and 3 of the row's.
            let mut indices = vec![0xa5u8; layout.index_bytes(2)];
            for (k, index) in encode_block(layout, &x, 1, &mut bytes)
                .into_iter()
                .enumerate()
            {
                write_index(&mut indices, 2 + k, index);
            }
            let kept: Vec<(usize, f32)> = layout.outliers(&bytes, &indices, 1).collect();
            assert_eq!(kept, [(9, 40.0), (50, -25.0)]);
            let mut decoded = [0.0f32; BLOCK];
            decode_block(layout, &bytes, &indices, 1, &mut decoded);
            with += x
                .iter()
                .zip(&decoded)
                .map(|(a, b)| (a - b) * (a - b))
                .sum::<f32>();
            let mut bytes = vec![0u8; plain.block_bytes()];
            encode_block(plain, &x, 1, &mut bytes);
            decode_block(plain, &bytes, &[], 1, &mut decoded);
            without += x
                .iter()
                .zip(&decoded)
                .map(|(a, b)| (a - b) * (a - b))
                .sum::<f32>();
        }
        assert!(with < 0.2 * without, "{with} vs {without}");
    }

    #[test]
    fn outlier_indices_pack_in_six_bits() {
        let mut indices = vec![0u8; TurboLayout::new(3, KvRole::Keys).index_bytes(8)];
        assert_eq!(indices.len(), 12);
        let want: Vec<usize> = (0..16).map(|slot| (slot * 37 + 5) % BLOCK).collect();
        for (slot, &index) in want.iter().enumerate() {
            write_index(&mut indices, slot, index);
        }
        // Rewriting one slot leaves its neighbours alone.
        write_index(&mut indices, 7, 63);
        write_index(&mut indices, 7, want[7]);
        let got: Vec<usize> = (0..16).map(|slot| read_index(&indices, slot)).collect();
        assert_eq!(got, want);
    }

    #[test]
    fn rows_of_the_7b_shape_take_568_bytes_a_token_and_layer() {
        // 4 KV heads of 128: rows of 8 blocks, keys and values tq3 (keys: 4-bit codes, no
        // sketch).
        let layout = TurboLayout::new(3, KvRole::Keys);
        assert_eq!((layout.code_bits, layout.sketch), (4, false));
        let keys = layout.row_bytes(8);
        let values = TurboLayout::new(3, KvRole::Values).row_bytes(8);
        assert_eq!((keys, values), (8 * 38 + 12, 8 * 30 + 12));
        // f16 takes 2 * 512 * 2 bytes: 3.606 times as much.
        assert!(2048.0 / (keys + values) as f64 > 3.6);
        let tq4 = TurboLayout::new(4, KvRole::Keys);
        assert_eq!(
            (tq4.code_bits, tq4.sketch, tq4.row_bytes(8)),
            (4, true, 8 * 48 + 12)
        );
        let x: Vec<f32> = (0..8 * BLOCK)
            .map(|i| ((i * 7919 % 101) as f32 - 50.0) * if i % 61 == 0 { 9.0 } else { 0.1 })
            .collect();
        for layout in [
            TurboLayout::new(3, KvRole::Keys),
            TurboLayout::new(4, KvRole::Keys),
            TurboLayout::new(4, KvRole::Values),
        ] {
            let mut row = vec![0u8; layout.row_bytes(8)];
            encode_row(layout, &x, &mut row);
            let mut decoded = vec![0.0f32; x.len()];
            decode_row(layout, &row, &mut decoded);
            let mut one = vec![0.0f32; BLOCK];
            for (b, (block, want)) in x
                .chunks_exact(BLOCK)
                .zip(decoded.chunks_exact(BLOCK))
                .enumerate()
            {
                // Each block alone, its indices written where the row keeps them.
                let mut bytes = vec![0u8; layout.block_bytes()];
                let mut indices = vec![0u8; layout.index_bytes(8)];
                for (k, index) in encode_block(layout, block, b, &mut bytes)
                    .into_iter()
                    .enumerate()
                {
                    write_index(&mut indices, b * layout.outliers + k, index);
                }
                assert_eq!(
                    bytes,
                    row[b * layout.block_bytes()..][..layout.block_bytes()]
                );
                decode_block(layout, &bytes, &indices, b, &mut one);
                assert_eq!(one, want);
            }
        }
    }
}
