//! The AVX-512 sixteen-row scheme (`x86_b32_wide`) on 256-bit registers, for the AVX2
//! levels: eight weight rows per pass, one 32-bit lane per row, so a block's eight integer
//! sums come out already in their lanes, with no horizontal sum (the older eight-row
//! kernels of `x86_b32` reduce eight registers per block and activation row).
//!
//! Per block the eight rows' 16-byte nibble runs are loaded two to a register and
//! transposed: register `g` holds bytes `4g..4g + 4` of every row (low nibbles: elements
//! `4g..`, high nibbles: `16 + 4g..`), against one activation dword broadcast to all lanes.
//! The weights enter as unsigned bytes (Q4_0's raw nibble, IQ4_NL's `kvalues + 128`) and
//! the offset times the activation block's sum comes from a per-call table, so each lane
//! ends at the exact i32 sum of `value * a`, folded in with one FMA by `d_w * d_a`: the
//! scalar twins' arithmetic lane by lane.
//!
//! With VNNI the products go through `vpdpbusd`. Without it, Q4_0's products go through
//! `vpmaddubsw` (pair sums of at most 2 * 15 * 128 = 3840 in magnitude) and the eight
//! registers' pair sums are added in i16 (at most 30720: exact) before one `vpmaddwd`
//! against ones; IQ4_NL's unsigned values would saturate `vpmaddubsw`, so on plain AVX2 it
//! takes its signed values and ggml's sign trick (which, as there, wraps an activation
//! quant of -128, one ggml's quantizers never make), one `vpmaddwd` per register.

use std::arch::x86_64::*;

use super::x86::f16x8;
use super::x86_b32::IQ4NL_UNSIGNED;
use super::x86_b32_wide::{block_sums, run_with_tables, TableKernel, SUMS_CAPACITY};
use crate::blocks::KVALUES_IQ4NL;
use crate::dot::x86::Avx2;

/// Bytes of a Q4_0 / IQ4_NL block: an f16 scale, then 16 bytes of packed nibbles.
const WEIGHT_BYTES: usize = 18;
/// Bytes of a Q8_0 activation block.
const Q8_0_BYTES: usize = 34;
/// Weight rows per pass.
pub(super) const ROWS: usize = 8;

/// True when the kernels take rows of `n` elements (a block sums table row fits).
pub(super) fn fits(n: usize) -> bool {
    n / 32 <= SUMS_CAPACITY
}

/// Block `b`'s nibbles of eight rows, transposed: lane `r` of register `g` holds bytes
/// `4g..4g + 4` of row `r`'s 16 packed bytes.
///
/// # Safety
/// AVX2 is available; 16 bytes at `block + r * row_bytes + 2` are readable for `r < 8`.
#[inline(always)]
unsafe fn transposed_nibbles(block: *const u8, row_bytes: usize) -> [__m256i; 4] {
    let q = |r: usize| _mm_loadu_si128(block.add(r * row_bytes + 2).cast());
    // Lane j of z[k] holds row k + 4 j.
    let mut z = [_mm256_setzero_si256(); 4];
    for (k, z) in z.iter_mut().enumerate() {
        *z = _mm256_inserti128_si256::<1>(_mm256_castsi128_si256(q(k)), q(k + 4));
    }
    let t0 = _mm256_unpacklo_epi32(z[0], z[1]);
    let t1 = _mm256_unpackhi_epi32(z[0], z[1]);
    let t2 = _mm256_unpacklo_epi32(z[2], z[3]);
    let t3 = _mm256_unpackhi_epi32(z[2], z[3]);
    [
        _mm256_unpacklo_epi64(t0, t2),
        _mm256_unpackhi_epi64(t0, t2),
        _mm256_unpacklo_epi64(t1, t3),
        _mm256_unpackhi_epi64(t1, t3),
    ]
}

/// How a block's eight registers of weights meet the broadcast activation dwords.
trait Products {
    /// True when the weights enter signed (IQ4_NL's `kvalues`), else unsigned.
    const SIGNED: bool = false;
    /// `start` plus, per lane, the sum over `g` of the four products of `w[g]`'s bytes with
    /// the activation dword `a[g]`.
    unsafe fn block(start: __m256i, w: &[__m256i; 8], a: &[__m256i; 8]) -> __m256i;
}

/// `vpmaddubsw` pair sums added in i16, one `vpmaddwd` (Q4_0 only: see the module notes).
struct PairSums;
/// VEX `vpdpbusd`.
struct AvxVnni;
/// Signed weights: `vpmaddubsw` of their magnitudes against the activations given their
/// signs (ggml's sign trick), one `vpmaddwd` per register (the pair sums reach 32258).
struct SignedPairs;

impl Products for SignedPairs {
    const SIGNED: bool = true;
    #[inline(always)]
    unsafe fn block(start: __m256i, w: &[__m256i; 8], a: &[__m256i; 8]) -> __m256i {
        let ones = _mm256_set1_epi16(1);
        let mut sum = start;
        for g in 0..8 {
            let pairs =
                _mm256_maddubs_epi16(_mm256_sign_epi8(w[g], w[g]), _mm256_sign_epi8(a[g], w[g]));
            sum = _mm256_add_epi32(sum, _mm256_madd_epi16(pairs, ones));
        }
        sum
    }
}

impl Products for PairSums {
    #[inline(always)]
    unsafe fn block(start: __m256i, w: &[__m256i; 8], a: &[__m256i; 8]) -> __m256i {
        let mut pairs = _mm256_maddubs_epi16(w[0], a[0]);
        for g in 1..8 {
            pairs = _mm256_add_epi16(pairs, _mm256_maddubs_epi16(w[g], a[g]));
        }
        _mm256_add_epi32(start, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)))
    }
}

impl Products for AvxVnni {
    #[inline(always)]
    unsafe fn block(start: __m256i, w: &[__m256i; 8], a: &[__m256i; 8]) -> __m256i {
        let mut sum = start;
        for g in 0..8 {
            sum = _mm256_dpbusd_avx_epi32(sum, w[g], a[g]);
        }
        sum
    }
}

/// Eight weight rows (`row_bytes` apart) against `T` activation rows (`activation_bytes`
/// apart) whose block sums times `-offset` are `sums[t * blocks + b]` (unread for signed
/// values) and whose block
/// scales, widened, are `scales[t * blocks + b]`; writes `out[t * out_stride + r]`. `IQ4`
/// maps the nibbles through `kvalues + 128`.
///
/// # Safety
/// AVX2, FMA and F16C (and what `P` uses) are available; the rows hold `n / 32` whole
/// blocks, the activation rows `n / 32` Q8_0 blocks, the tables `T * n / 32` entries, and
/// `out[t * out_stride + r]` is writable for `t < T`, `r < 8`.
#[inline(always)]
#[allow(clippy::too_many_arguments, clippy::needless_range_loop)]
unsafe fn group<P: Products, const T: usize, const IQ4: bool>(
    n: usize,
    rows: *const u8,
    row_bytes: usize,
    activations: *const u8,
    activation_bytes: usize,
    (sums, scales): (*const i32, *const f32),
    out: *mut f32,
    out_stride: usize,
) {
    let blocks = n / 32;
    let m4 = _mm256_set1_epi8(0x0f);
    let values = if P::SIGNED {
        KVALUES_IQ4NL.as_ptr().cast()
    } else {
        IQ4NL_UNSIGNED.as_ptr()
    };
    let table = _mm256_broadcastsi128_si256(_mm_loadu_si128(values.cast()));
    let mut acc = [_mm256_setzero_ps(); T];
    for b in 0..blocks {
        let block = rows.add(b * WEIGHT_BYTES);
        // The same block of the next eight rows (prefetches do not fault, past the end
        // included).
        for r in 0..ROWS {
            let ahead = block.wrapping_add((ROWS + r) * row_bytes);
            _mm_prefetch::<_MM_HINT_T0>(ahead.cast());
        }
        let packed = transposed_nibbles(block, row_bytes);
        // Registers 0..4: the low nibbles of dwords 0..4; 4..8: the high nibbles.
        let mut w = [_mm256_setzero_si256(); 8];
        for g in 0..4 {
            w[g] = _mm256_and_si256(packed[g], m4);
            w[4 + g] = _mm256_and_si256(_mm256_srli_epi16::<4>(packed[g]), m4);
            if IQ4 {
                w[g] = _mm256_shuffle_epi8(table, w[g]);
                w[4 + g] = _mm256_shuffle_epi8(table, w[4 + g]);
            }
        }
        let d_w = f16x8(block, row_bytes, 0);
        for t in 0..T {
            let quants = activations
                .add(t * activation_bytes + b * Q8_0_BYTES + 2)
                .cast::<i32>();
            let mut a = [_mm256_setzero_si256(); 8];
            for g in 0..8 {
                a[g] = _mm256_set1_epi32(quants.add(g).read_unaligned());
            }
            // Signed values need no offset (their table holds no sums).
            let start = if P::SIGNED {
                _mm256_setzero_si256()
            } else {
                _mm256_set1_epi32(*sums.add(t * blocks + b))
            };
            let isum = P::block(start, &w, &a);
            let d_a = _mm256_set1_ps(*scales.add(t * blocks + b));
            acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(d_w, d_a), acc[t]);
        }
    }
    for t in 0..T {
        _mm256_storeu_ps(out.add(t * out_stride), acc[t]);
    }
}

macro_rules! eight {
    ($name:ident, $products:ty, $t:literal, $iq4:literal, $features:literal) => {
        #[target_feature(enable = $features)]
        #[allow(clippy::too_many_arguments)]
        unsafe fn $name(
            n: usize,
            w: *const u8,
            rb: usize,
            a: *const u8,
            ab: usize,
            s: (*const i32, *const f32),
            o: *mut f32,
            os: usize,
        ) {
            group::<$products, $t, $iq4>(n, w, rb, a, ab, s, o, os);
        }
    };
}

eight!(q4_0_avx2_1, PairSums, 1, false, "avx2,fma,f16c");
eight!(q4_0_avx2_4, PairSums, 4, false, "avx2,fma,f16c");
eight!(q4_0_vnni_1, AvxVnni, 1, false, "avx2,fma,f16c,avxvnni");
eight!(q4_0_vnni_4, AvxVnni, 4, false, "avx2,fma,f16c,avxvnni");
eight!(iq4_nl_vnni_1, AvxVnni, 1, true, "avx2,fma,f16c,avxvnni");
eight!(iq4_nl_vnni_4, AvxVnni, 4, true, "avx2,fma,f16c,avxvnni");
eight!(iq4_nl_avx2_1, SignedPairs, 1, true, "avx2,fma,f16c");
eight!(iq4_nl_avx2_4, SignedPairs, 4, true, "avx2,fma,f16c");

/// The table maker at the AVX2 level (the sums are exact, so every level makes the same).
#[target_feature(enable = "avx2,f16c")]
unsafe fn tables(
    shape: (usize, usize),
    activations: *const u8,
    activation_bytes: usize,
    offset: i32,
    out: (*mut i32, *mut f32),
) {
    block_sums::<Avx2>(shape, activations, activation_bytes, offset, out);
}

/// Runs the eight-row kernels over the first `count / 8 * 8` of `count` weight rows and
/// every one of `tokens` activation rows, writing `out[t * count + r]`: Q4_0 (`iq4_nl`
/// false) or IQ4_NL, with VNNI (`vnni`) or without. The caller (`x86::drive`)
/// checked the shapes, the features and [`fits`].
///
/// # Safety
/// As stated: `weight_rows` holds `count` rows of `row_bytes`, `activations` `tokens`
/// rows of `activation_bytes`, `out` `tokens * count` floats; AVX2, FMA, F16C (and
/// AVX-VNNI with `vnni`) are available.
pub(super) unsafe fn run(
    (iq4_nl, vnni): (bool, bool),
    n: usize,
    weights: (*const u8, usize, usize),
    activations: (*const u8, usize, usize),
    out: *mut f32,
) {
    let kernels: [(usize, TableKernel); 2] = match (iq4_nl, vnni) {
        (false, false) => [(4, q4_0_avx2_4), (1, q4_0_avx2_1)],
        (false, true) => [(4, q4_0_vnni_4), (1, q4_0_vnni_1)],
        (true, false) => [(4, iq4_nl_avx2_4), (1, iq4_nl_avx2_1)],
        (true, true) => [(4, iq4_nl_vnni_4), (1, iq4_nl_vnni_1)],
    };
    // The unsigned weights' offset (none for the signed IQ4_NL values of plain AVX2).
    let offset = match (iq4_nl, vnni) {
        (false, _) => 8,
        (true, false) => 0,
        (true, true) => 128,
    };
    run_with_tables(
        n,
        weights,
        activations,
        out,
        (ROWS, &kernels),
        (offset, tables),
    );
}
