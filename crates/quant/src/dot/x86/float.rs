//! AVX2 and AVX-512 kernels of the float formats (F32, F16, BF16), in the 32-lane order of
//! the scalar twin (`dot::float`): lane `i % 32` by FMA, tails finished by the twin's code.

use std::arch::x86_64::*;

use crate::dot::float::{
    accumulate_tail, bf16_element, f16_element, f32_at, reduce32, FLOAT_LANES,
};

/// How to widen eight / sixteen elements of one float format to f32.
trait Element {
    const BYTES: usize;
    unsafe fn load8(p: *const u8) -> __m256;
    unsafe fn load16(p: *const u8) -> __m512;
    fn scalar(bytes: &[u8], i: usize) -> f32;
}

struct F32;
struct F16;
struct BF16;

impl Element for F32 {
    const BYTES: usize = 4;
    #[inline(always)]
    unsafe fn load8(p: *const u8) -> __m256 {
        _mm256_loadu_ps(p.cast())
    }
    #[inline(always)]
    unsafe fn load16(p: *const u8) -> __m512 {
        _mm512_loadu_ps(p.cast())
    }
    fn scalar(bytes: &[u8], i: usize) -> f32 {
        f32_at(bytes, i)
    }
}

impl Element for F16 {
    const BYTES: usize = 2;
    #[inline(always)]
    unsafe fn load8(p: *const u8) -> __m256 {
        _mm256_cvtph_ps(_mm_loadu_si128(p.cast()))
    }
    #[inline(always)]
    unsafe fn load16(p: *const u8) -> __m512 {
        _mm512_cvtph_ps(_mm256_loadu_si256(p.cast()))
    }
    fn scalar(bytes: &[u8], i: usize) -> f32 {
        f16_element(bytes, i)
    }
}

impl Element for BF16 {
    const BYTES: usize = 2;
    #[inline(always)]
    unsafe fn load8(p: *const u8) -> __m256 {
        let wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(p.cast()));
        _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16))
    }
    #[inline(always)]
    unsafe fn load16(p: *const u8) -> __m512 {
        let wide = _mm512_cvtepu16_epi32(_mm256_loadu_si256(p.cast()));
        _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16))
    }
    fn scalar(bytes: &[u8], i: usize) -> f32 {
        bf16_element(bytes, i)
    }
}

fn check(n: usize, bytes: usize, w: &[u8], a: &[u8]) {
    assert!(
        w.len() >= n * bytes && a.len() >= n * bytes,
        "float rows of {} and {} bytes are shorter than {n} elements",
        w.len(),
        a.len()
    );
}

/// Lanes 0..32 after the whole 32-element chunks, AVX2 form (four 8-lane accumulators).
#[inline(always)]
unsafe fn chunks_avx2<E: Element>(chunks: usize, w: *const u8, a: *const u8) -> [f32; FLOAT_LANES] {
    let mut acc = [_mm256_setzero_ps(); 4];
    for chunk in 0..chunks {
        for (k, lane) in acc.iter_mut().enumerate() {
            let offset = (32 * chunk + 8 * k) * E::BYTES;
            *lane = _mm256_fmadd_ps(E::load8(w.add(offset)), E::load8(a.add(offset)), *lane);
        }
    }
    let mut lanes = [0.0f32; FLOAT_LANES];
    for (k, lane) in acc.iter().enumerate() {
        _mm256_storeu_ps(lanes[8 * k..].as_mut_ptr(), *lane);
    }
    lanes
}

/// Lanes 0..32 after the whole 32-element chunks, AVX-512 form (two 16-lane accumulators).
#[inline(always)]
unsafe fn chunks_avx512<E: Element>(
    chunks: usize,
    w: *const u8,
    a: *const u8,
) -> [f32; FLOAT_LANES] {
    let mut acc = [_mm512_setzero_ps(); 2];
    for chunk in 0..chunks {
        for (k, lane) in acc.iter_mut().enumerate() {
            let offset = (32 * chunk + 16 * k) * E::BYTES;
            *lane = _mm512_fmadd_ps(E::load16(w.add(offset)), E::load16(a.add(offset)), *lane);
        }
    }
    let mut lanes = [0.0f32; FLOAT_LANES];
    for (k, lane) in acc.iter().enumerate() {
        _mm512_storeu_ps(lanes[16 * k..].as_mut_ptr(), *lane);
    }
    lanes
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn row_avx2<E: Element>(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let chunks = n / FLOAT_LANES;
    let mut lanes = chunks_avx2::<E>(chunks, w.as_ptr(), a.as_ptr());
    accumulate_tail(
        &mut lanes,
        chunks * FLOAT_LANES,
        n,
        |i| E::scalar(w, i),
        |i| E::scalar(a, i),
    );
    reduce32(&lanes)
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
unsafe fn row_avx512<E: Element>(n: usize, w: &[u8], a: &[u8]) -> f32 {
    let chunks = n / FLOAT_LANES;
    let mut lanes = chunks_avx512::<E>(chunks, w.as_ptr(), a.as_ptr());
    accumulate_tail(
        &mut lanes,
        chunks * FLOAT_LANES,
        n,
        |i| E::scalar(w, i),
        |i| E::scalar(a, i),
    );
    reduce32(&lanes)
}

/// Stamps the safe entry points of one format.
macro_rules! entry_points {
    ($avx2:ident, $avx512:ident, $element:ty) => {
        pub(super) fn $avx2(n: usize, w: &[u8], a: &[u8]) -> f32 {
            check(n, <$element>::BYTES, w, a);
            // SAFETY: handed out only once AVX2/FMA/F16C were detected; lengths checked.
            unsafe { row_avx2::<$element>(n, w, a) }
        }

        pub(super) fn $avx512(n: usize, w: &[u8], a: &[u8]) -> f32 {
            check(n, <$element>::BYTES, w, a);
            // SAFETY: handed out only once AVX-512 F/BW/VL were detected; lengths checked.
            unsafe { row_avx512::<$element>(n, w, a) }
        }
    };
}

entry_points!(dot_f32_avx2, dot_f32_avx512, F32);
entry_points!(dot_f16_avx2, dot_f16_avx512, F16);
entry_points!(dot_bf16_avx2, dot_bf16_avx512, BF16);

/// F16 weights against four activation rows at once: each weight chunk is widened once.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
unsafe fn f16_tile4(n: usize, w: &[u8], a: &[u8], row_bytes: usize, out: &mut [f32]) {
    let chunks = n / FLOAT_LANES;
    let mut acc = [[_mm512_setzero_ps(); 2]; 4];
    let (wp, ap) = (w.as_ptr(), a.as_ptr());
    for chunk in 0..chunks {
        let offset = 32 * chunk * 2;
        let w0 = F16::load16(wp.add(offset));
        let w1 = F16::load16(wp.add(offset + 32));
        for (c, lanes) in acc.iter_mut().enumerate() {
            let row = ap.add(c * row_bytes + offset);
            lanes[0] = _mm512_fmadd_ps(w0, F16::load16(row), lanes[0]);
            lanes[1] = _mm512_fmadd_ps(w1, F16::load16(row.add(32)), lanes[1]);
        }
    }
    for (c, pair) in acc.iter().enumerate() {
        let mut lanes = [0.0f32; FLOAT_LANES];
        _mm512_storeu_ps(lanes.as_mut_ptr(), pair[0]);
        _mm512_storeu_ps(lanes[16..].as_mut_ptr(), pair[1]);
        let row = &a[c * row_bytes..(c + 1) * row_bytes];
        accumulate_tail(
            &mut lanes,
            chunks * FLOAT_LANES,
            n,
            |i| f16_element(w, i),
            |i| f16_element(row, i),
        );
        out[c] = reduce32(&lanes);
    }
}

/// Multi-row F16 kernel (AVX-512).
pub(super) fn multi_f16_avx512(n: usize, w: &[u8], a: &[u8], out: &mut [f32]) {
    if out.is_empty() {
        return;
    }
    let row_bytes = a.len() / out.len();
    assert_eq!(
        row_bytes * out.len(),
        a.len(),
        "activation rows of equal length"
    );
    check(n, 2, w, &a[..row_bytes]);
    let mut start = 0;
    while start + 4 <= out.len() {
        // SAFETY: handed out only once AVX-512 F/BW/VL were detected; four rows of
        // `row_bytes >= 2n` bytes start at this offset (lengths checked above).
        unsafe {
            f16_tile4(
                n,
                w,
                &a[start * row_bytes..],
                row_bytes,
                &mut out[start..start + 4],
            )
        };
        start += 4;
    }
    for c in start..out.len() {
        out[c] = dot_f16_avx512(n, w, &a[c * row_bytes..(c + 1) * row_bytes]);
    }
}
