//! AVX2 + FMA twins of the TurboQuant block kernels in `super` (bit-identical results).
//!
//! Every function is `unsafe` because it requires those CPU features: callers hold an
//! `Isa::Avx2`, which only `Isa::detect` makes, after runtime detection.

use std::arch::x86_64::*;

use runit_backend::turbo::BLOCK;

use super::{Table, LANES};

/// The table entries of 8 codes: a lane permute of each half of the table, the upper
/// half's result taken where the code is 8 or more.
#[target_feature(enable = "avx2,fma")]
fn lookup(low: __m256, high: __m256, codes: &[u8]) -> __m256 {
    let mut bytes = [0u8; 16];
    bytes[..LANES].copy_from_slice(&codes[..LANES]);
    // SAFETY: `bytes` is 16 readable bytes; the load is unaligned.
    let packed = unsafe { _mm_loadu_si128(bytes.as_ptr().cast()) };
    let index = _mm256_cvtepu8_epi32(packed);
    let from_low = _mm256_permutevar8x32_ps(low, index);
    let from_high = _mm256_permutevar8x32_ps(high, index);
    let upper = _mm256_cmpgt_epi32(index, _mm256_set1_epi32(7));
    _mm256_blendv_ps(from_low, from_high, _mm256_castsi256_ps(upper))
}

/// The twins' horizontal sum: `(l0 + l4) + (l2 + l6)` plus `(l1 + l5) + (l3 + l7)`.
#[target_feature(enable = "avx2,fma")]
fn reduce(lanes: __m256) -> f32 {
    let s = _mm_add_ps(
        _mm256_castps256_ps128(lanes),
        _mm256_extractf128_ps::<1>(lanes),
    );
    let t = _mm_add_ps(s, _mm_movehl_ps(s, s));
    _mm_cvtss_f32(_mm_add_ss(t, _mm_shuffle_ps::<0b01>(t, t)))
}

/// Loads the table's two halves.
#[target_feature(enable = "avx2,fma")]
fn halves(table: &Table) -> (__m256, __m256) {
    // SAFETY: the table holds 16 f32; each load reads 8 of them, unaligned.
    unsafe {
        (
            _mm256_loadu_ps(table.0.as_ptr()),
            _mm256_loadu_ps(table.0.as_ptr().add(8)),
        )
    }
}

/// See `super::code_dot`.
#[target_feature(enable = "avx2,fma")]
pub fn code_dot(q: &[f32; BLOCK], codes: &[u8; BLOCK], table: &Table) -> f32 {
    let (low, high) = halves(table);
    let mut acc = _mm256_setzero_ps();
    for (q, codes) in q.chunks_exact(LANES).zip(codes.chunks_exact(LANES)) {
        // SAFETY: `q` is a chunk of 8 f32.
        let q = unsafe { _mm256_loadu_ps(q.as_ptr()) };
        acc = _mm256_fmadd_ps(q, lookup(low, high, codes), acc);
    }
    reduce(acc)
}

/// See `super::sign_dot`.
#[target_feature(enable = "avx2,fma")]
pub fn sign_dot(q: &[f32; BLOCK], signs: u64) -> f32 {
    let bits = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
    let mut acc = _mm256_setzero_ps();
    for (chunk, q) in q.chunks_exact(LANES).enumerate() {
        let byte = _mm256_set1_epi32((signs >> (chunk * LANES) & 0xff) as i32);
        let set = _mm256_cmpeq_epi32(_mm256_and_si256(byte, bits), bits);
        let sign = _mm256_blendv_ps(
            _mm256_set1_ps(1.0),
            _mm256_set1_ps(-1.0),
            _mm256_castsi256_ps(set),
        );
        // SAFETY: `q` is a chunk of 8 f32.
        let q = unsafe { _mm256_loadu_ps(q.as_ptr()) };
        acc = _mm256_fmadd_ps(q, sign, acc);
    }
    reduce(acc)
}

/// See `super::code_mad`.
#[target_feature(enable = "avx2,fma")]
pub fn code_mad(acc: &mut [f32; BLOCK], codes: &[u8; BLOCK], table: &Table, weight: f32) {
    let (low, high) = halves(table);
    let weight = _mm256_set1_ps(weight);
    for (acc, codes) in acc.chunks_exact_mut(LANES).zip(codes.chunks_exact(LANES)) {
        // SAFETY: `acc` is a chunk of 8 f32, read and written unaligned.
        unsafe {
            let sum = _mm256_fmadd_ps(
                lookup(low, high, codes),
                weight,
                _mm256_loadu_ps(acc.as_ptr()),
            );
            _mm256_storeu_ps(acc.as_mut_ptr(), sum);
        }
    }
}
