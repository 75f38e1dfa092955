//! Q4_0 and IQ4_NL kernels of the repack order (32-element span for the gemv and the
//! gemm alike): eight weight rows against one activation row, or against four at once
//! (the gemm), which decodes each weight block once for the four rows. One lane per
//! weight row; per block each row's exact i32 sum is reduced into its lane and folded in
//! with one vector FMA, the scalar twins' arithmetic lane by lane.
//!
//! The integer part takes unsigned weights: Q4_0's raw nibbles `q` (the value is `q - 8`),
//! or, with VNNI, IQ4_NL's `kvalues + 128`; the offset times the activation block's sum is
//! subtracted afterwards, exactly. AVX2's `vpmaddubsw` would saturate on `kvalues + 128`,
//! so IQ4_NL on AVX2 keeps the signed values and the sign trick.

use std::arch::x86_64::*;

use super::x86::{f16x8, reduce8, GroupFn};
use crate::blocks::KVALUES_IQ4NL;
use crate::dot::x86::{nibbles, Avx2, Avx512Vnni, AvxVnni, Isa};

/// Bytes of a Q4_0 / IQ4_NL / Q8_0 block: an f16 scale, then 32 (or 16 packed) quants.
const WEIGHT_BYTES: usize = 18;
/// Bytes of a Q8_0 activation block.
const Q8_0_BYTES: usize = 34;

/// How the nibbles become integers.
#[derive(Clone, Copy)]
enum Values {
    /// Q4_0: the raw nibble, minus 8 (the offset) per activation element.
    Q4_0,
    /// IQ4_NL, `kvalues + 128` through a table, minus 128 per activation element (VNNI).
    Iq4NlOffset,
    /// IQ4_NL, signed `kvalues` and the sign trick (AVX2).
    Iq4NlSigned,
}

/// `KVALUES_IQ4NL + 128`, as unsigned bytes.
pub(super) const IQ4NL_UNSIGNED: [u8; 16] = {
    let mut table = [0u8; 16];
    let mut i = 0;
    while i < 16 {
        table[i] = (KVALUES_IQ4NL[i] as i16 + 128) as u8;
        i += 1;
    }
    table
};

/// `acc` plus the sums of four adjacent u8 x i8 products, in one `vpdpbusd` with VNNI.
trait Accumulate: Isa {
    /// `a` unsigned, `b` signed.
    unsafe fn dot_acc(acc: __m256i, a: __m256i, b: __m256i) -> __m256i;
}

impl Accumulate for Avx2 {
    #[inline(always)]
    unsafe fn dot_acc(acc: __m256i, a: __m256i, b: __m256i) -> __m256i {
        _mm256_add_epi32(acc, Self::dot_u8_i8(a, b))
    }
}

impl Accumulate for AvxVnni {
    #[inline(always)]
    unsafe fn dot_acc(acc: __m256i, a: __m256i, b: __m256i) -> __m256i {
        _mm256_dpbusd_avx_epi32(acc, a, b)
    }
}

impl Accumulate for Avx512Vnni {
    #[inline(always)]
    unsafe fn dot_acc(acc: __m256i, a: __m256i, b: __m256i) -> __m256i {
        _mm256_dpbusd_epi32(acc, a, b)
    }
}

/// Eight weight rows (18-byte blocks, `row_bytes` apart) against `T` activation rows
/// (`activation_bytes` apart); `out[t * out_stride + r]`.
#[inline(always)]
#[allow(clippy::too_many_arguments, clippy::needless_range_loop)]
unsafe fn group<I: Accumulate, const T: usize>(
    n: usize,
    rows: *const u8,
    row_bytes: usize,
    activations: *const u8,
    activation_bytes: usize,
    out: *mut f32,
    out_stride: usize,
    values: Values,
) {
    let table = match values {
        Values::Q4_0 => _mm256_setzero_si256(),
        Values::Iq4NlOffset => {
            _mm256_broadcastsi128_si256(_mm_loadu_si128(IQ4NL_UNSIGNED.as_ptr().cast()))
        }
        Values::Iq4NlSigned => {
            _mm256_broadcastsi128_si256(_mm_loadu_si128(KVALUES_IQ4NL.as_ptr().cast()))
        }
    };
    let offset = _mm256_set1_epi8(match values {
        Values::Q4_0 => 8,
        Values::Iq4NlOffset => -128,
        Values::Iq4NlSigned => 0,
    });
    let mut acc = [_mm256_setzero_ps(); T];
    for b in 0..n / 32 {
        let block = rows.add(b * WEIGHT_BYTES);
        // Plain loops: closures and iterator adaptors here are not always inlined into
        // the `target_feature` function, which leaves every intrinsic a call.
        let mut weights = [_mm256_setzero_si256(); 8];
        for r in 0..8 {
            let q = nibbles(block.add(r * row_bytes + 2));
            weights[r] = match values {
                Values::Q4_0 => q,
                Values::Iq4NlOffset | Values::Iq4NlSigned => _mm256_shuffle_epi8(table, q),
            };
        }
        let d_w = f16x8(block, row_bytes, 0);
        for t in 0..T {
            let a = activations.add(t * activation_bytes + b * Q8_0_BYTES);
            let quants = _mm256_loadu_si256(a.add(2).cast());
            // The offset times the activation block's sum, negated, spread over the
            // lanes of every row's sums (-128 reads as the unsigned 128 in `dot_u8_i8`);
            // the lanes are summed exactly below.
            let base = match values {
                Values::Iq4NlSigned => _mm256_setzero_si256(),
                Values::Q4_0 | Values::Iq4NlOffset => {
                    _mm256_sub_epi32(_mm256_setzero_si256(), I::dot_u8_i8(offset, quants))
                }
            };
            let mut sums = [_mm256_setzero_si256(); 8];
            for r in 0..8 {
                let w = weights[r];
                sums[r] = match values {
                    Values::Iq4NlSigned => {
                        I::dot_u8_i8(_mm256_sign_epi8(w, w), _mm256_sign_epi8(quants, w))
                    }
                    Values::Q4_0 | Values::Iq4NlOffset => I::dot_acc(base, w, quants),
                };
            }
            let isum = reduce8(&sums);
            let d_a = _mm256_cvtph_ps(_mm_set1_epi16(a.cast::<i16>().read_unaligned()));
            acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(d_w, d_a), acc[t]);
        }
    }
    for t in 0..T {
        _mm256_storeu_ps(out.add(t * out_stride), acc[t]);
    }
}

macro_rules! kernels {
    ($one:ident, $four:ident, $isa:ty, $values:expr, $features:literal) => {
        #[target_feature(enable = $features)]
        unsafe fn $one(
            n: usize,
            w: *const u8,
            rb: usize,
            a: *const u8,
            ab: usize,
            o: *mut f32,
            os: usize,
        ) {
            group::<$isa, 1>(n, w, rb, a, ab, o, os, $values);
        }
        #[target_feature(enable = $features)]
        unsafe fn $four(
            n: usize,
            w: *const u8,
            rb: usize,
            a: *const u8,
            ab: usize,
            o: *mut f32,
            os: usize,
        ) {
            group::<$isa, 4>(n, w, rb, a, ab, o, os, $values);
        }
    };
}

kernels!(
    q4_0_avx2_1,
    q4_0_avx2_4,
    Avx2,
    Values::Q4_0,
    "avx2,fma,f16c"
);
kernels!(
    iq4_nl_avx2_1,
    iq4_nl_avx2_4,
    Avx2,
    Values::Iq4NlSigned,
    "avx2,fma,f16c"
);
kernels!(
    q4_0_avxvnni_1,
    q4_0_avxvnni_4,
    AvxVnni,
    Values::Q4_0,
    "avx2,fma,f16c,avxvnni"
);
kernels!(
    iq4_nl_avxvnni_1,
    iq4_nl_avxvnni_4,
    AvxVnni,
    Values::Iq4NlOffset,
    "avx2,fma,f16c,avxvnni"
);
kernels!(
    q4_0_vnni_1,
    q4_0_vnni_4,
    Avx512Vnni,
    Values::Q4_0,
    "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni"
);
kernels!(
    iq4_nl_vnni_1,
    iq4_nl_vnni_4,
    Avx512Vnni,
    Values::Iq4NlOffset,
    "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni"
);

/// Which instruction set the integer part uses.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum Integer {
    /// `vpmaddubsw` + `vpmaddwd`.
    Avx2,
    /// VEX `vpdpbusd`.
    AvxVnni,
    /// EVEX `vpdpbusd` (AVX-512 VL + VNNI).
    Avx512Vnni,
}

/// `(one activation row, four activation rows)` kernels for Q4_0 (`iq4_nl` false) or
/// IQ4_NL; the caller checked the features of `integer`.
pub(super) fn kernels(iq4_nl: bool, integer: Integer) -> (GroupFn, GroupFn) {
    match (iq4_nl, integer) {
        (false, Integer::Avx2) => (q4_0_avx2_1, q4_0_avx2_4),
        (true, Integer::Avx2) => (iq4_nl_avx2_1, iq4_nl_avx2_4),
        (false, Integer::AvxVnni) => (q4_0_avxvnni_1, q4_0_avxvnni_4),
        (true, Integer::AvxVnni) => (iq4_nl_avxvnni_1, iq4_nl_avxvnni_4),
        (false, Integer::Avx512Vnni) => (q4_0_vnni_1, q4_0_vnni_4),
        (true, Integer::Avx512Vnni) => (iq4_nl_vnni_1, iq4_nl_vnni_4),
    }
}
