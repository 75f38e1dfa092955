//! TurboQuant KV blocks on the CPU (`runit_backend::turbo` holds the layout, codebooks and
//! rotations, and writes the rows): the attention that runs on the codes (`attention` cuts the
//! work, `chunk` holds the kernels of one chunk of keys).
//!
//! Each kernel has a portable twin (`chunk`'s scalar functions) doing the very same float
//! operations in the same order (sixteen lanes, lane `l` taking coordinates `l, l + 16, ...`
//! with fused multiply-adds, summed by [`reduce`]), so the AVX-512 kernels (`x86`) equal it
//! bit for bit.

pub mod attention;
mod chunk;
#[cfg(test)]
mod tests;
#[cfg(target_arch = "x86_64")]
mod x86;

use runit_backend::turbo;

/// Lanes of the kernels' partial sums (one AVX-512 register of f32).
const LANES: usize = 16;

/// A codebook's centroids repeated to fill 16 entries (entry `c` is centroid
/// `c mod 2^bits`), so that a lookup may ignore every bit of an index above the code's:
/// the AVX-512 kernels look codes up with a lane permute of one register, which reads the
/// low four bits of each index.
#[derive(Clone, Copy)]
pub struct Table(pub [f32; LANES]);

impl Table {
    /// The centroids of the `bits`-bit codebook.
    pub fn new(bits: usize) -> Table {
        let centroids = &turbo::codebook(bits).centroids;
        Table(std::array::from_fn(|c| centroids[c % centroids.len()]))
    }
}

/// The twins' horizontal sum of sixteen lanes: `l[i] + l[i + 8]`, then `+ [i + 4]`,
/// `+ [i + 2]`, `+ [i + 1]` (a tree of halves).
fn reduce(lanes: &[f32; LANES]) -> f32 {
    let s8: [f32; 8] = std::array::from_fn(|i| lanes[i] + lanes[i + 8]);
    let s4: [f32; 4] = std::array::from_fn(|i| s8[i] + s8[i + 4]);
    let s2: [f32; 2] = std::array::from_fn(|i| s4[i] + s4[i + 2]);
    s2[0] + s2[1]
}

/// `exp(x)` for `x <= 0` (the softmax's `score - max`), the same bits in the twins: `0`
/// below -87 (where `2^n` leaves the normal range), else `2^n e^r` with `n` the nearest
/// integer to `x / ln 2`, `r = x - n ln 2` in two steps, and Cephes' degree-5 polynomial
/// of `expf` (within about one ulp).
fn exp(x: f32) -> f32 {
    if x.is_nan() || x < EXP_MIN {
        return 0.0;
    }
    let n = (x * std::f32::consts::LOG2_E).round_ties_even();
    let r = n.mul_add(-LN2_HIGH, x);
    let r = n.mul_add(-LN2_LOW, r);
    let p = EXP_POLYNOMIAL[1..]
        .iter()
        .fold(EXP_POLYNOMIAL[0], |p, &c| p.mul_add(r, c));
    let y = p.mul_add(r * r, r) + 1.0;
    y * f32::from_bits(((n as i32 + 127) as u32) << 23)
}

/// Below this [`exp`] returns 0 (`n` stays at -126 or above).
const EXP_MIN: f32 = -87.0;
/// `ln 2` split so that `n * LN2_HIGH` is exact for the `n` in range.
const LN2_HIGH: f32 = 0.693_359_4;
const LN2_LOW: f32 = -2.121_944_4e-4;
/// Cephes `expf`'s coefficients, highest degree first: `e^r ~ 1 + r + r^2 p(r)`.
const EXP_POLYNOMIAL: [f32; 6] = [
    1.987_569_1e-4,
    1.398_2e-3,
    8.333_452e-3,
    4.166_579_6e-2,
    1.666_666_5e-1,
    0.5,
];
