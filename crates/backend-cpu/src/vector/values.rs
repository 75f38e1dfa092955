//! The value pass of attention over a Q8_0 or Q4_0 value cache for a group of query heads
//! that share one KV head, once the online softmax has been walked ([`ValueSteps`]): per
//! head exactly the operations of dequantizing each value row ([`super::dequant_q8_0`],
//! ggml's `v_to_float`), scaling the accumulator where the maximum grew
//! ([`super::scale_f32`]) and adding the weighted row ([`super::mad_f32`], fused), key after
//! key, so the same bits.
//!
//! The AVX2 path keeps a tile of up to six heads' accumulators (16 dimensions each) in
//! registers while it walks the keys, dequantizing each value half block once for the
//! tile's heads: every output element sees the same multiplications and fused multiply-adds
//! in the same order, without the row buffer or the accumulator going through memory per
//! key. With AVX-512 a tile takes two whole blocks (64 dimensions, four 512-bit registers)
//! of up to six heads, so SmolLM2's three heads of 64 walk the keys once instead of four
//! times. [`softmax_steps`] is the walk that decides them (ggml's online softmax).

use runit_quant::blocks::{BlockQ4_0, BlockQ8_0};

use super::Isa;

/// Values of a Q8_0 / Q4_0 block.
const BLOCK: usize = 32;

/// What the online softmax decided for each key and head (`[keys, group]` arrays, keys in
/// position order).
pub struct ValueSteps<'a> {
    /// Index of the first block of each key's value row in the cache.
    pub rows: &'a [usize],
    /// exp(score - max) of each key and head (1 where the key raised the maximum).
    pub weights: &'a [f32],
    /// exp(old max - score) where the key raised the head's maximum (else unused).
    pub rescales: &'a [f32],
    /// Per key, bit g set where the key raised head g's maximum (the accumulator is scaled
    /// by `rescales` before the key is added).
    pub rescaled: &'a [u16],
}

/// ggml's online softmax over the `[keys, group]` scores in `weights`, key after key (the
/// group's heads are `max.len()`, each with its running maximum and sum): a score above the
/// head's maximum makes it the maximum, with `rescale = exp(old max - score)` recorded in
/// `rescales` and `rescaled` and weight 1; any other gets weight `exp(score - max)`; the sum
/// becomes `fma(sum, rescale, weight)` (`rescale` 1 where the maximum stayed). The weights
/// replace the scores. The steps for [`accumulate`].
pub fn softmax_steps(
    isa: Isa,
    weights: &mut [f32],
    rescales: &mut [f32],
    rescaled: &mut [u16],
    max: &mut [f32],
    sum: &mut [f32],
) {
    let group = max.len();
    assert!(
        group <= 16 && sum.len() == group,
        "1 to 16 heads, a sum each"
    );
    assert!(
        weights.len() == rescaled.len() * group && rescales.len() == weights.len(),
        "[keys, group] steps"
    );
    match isa {
        // SAFETY: `Isa::Avx2` is made only by `Isa::detect`, after detecting AVX2, FMA and
        // F16C.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { x86::softmax_steps(weights, rescales, rescaled, max, sum) },
        Isa::Scalar => softmax_body(weights, rescales, rescaled, max, sum),
    }
}

/// [`softmax_steps`] (the same code with FMA instructions or without: a fused multiply-add
/// has one result either way).
#[inline(always)]
fn softmax_body(
    weights: &mut [f32],
    rescales: &mut [f32],
    rescaled: &mut [u16],
    max: &mut [f32],
    sum: &mut [f32],
) {
    let group = max.len();
    for ((weights, rescales), rescaled) in weights
        .chunks_exact_mut(group)
        .zip(rescales.chunks_exact_mut(group))
        .zip(rescaled)
    {
        *rescaled = 0;
        for (g, (weight_out, rescale_out)) in weights.iter_mut().zip(rescales).enumerate() {
            let raised = *weight_out > max[g];
            let (rescale, weight) = super::online_step(*weight_out, &mut max[g]);
            if raised {
                *rescale_out = rescale;
                *rescaled |= 1 << g;
            }
            *weight_out = weight;
            sum[g] = sum[g].mul_add(rescale, weight);
        }
    }
}

/// The value cache, a row of `head_dim / 32` blocks per key.
#[derive(Clone, Copy)]
pub enum ValueBlocks<'a> {
    Q8_0(&'a [BlockQ8_0]),
    Q4_0(&'a [BlockQ4_0]),
}

impl ValueBlocks<'_> {
    fn len(&self) -> usize {
        match self {
            ValueBlocks::Q8_0(blocks) => blocks.len(),
            ValueBlocks::Q4_0(blocks) => blocks.len(),
        }
    }

    /// The reference dequantization of `out.len() / 32` blocks from block `first` on.
    fn dequantize(&self, first: usize, out: &mut [f32]) {
        let range = first..first + out.len() / BLOCK;
        match self {
            ValueBlocks::Q8_0(blocks) => super::dequant_q8_0(Isa::Scalar, &blocks[range], out),
            ValueBlocks::Q4_0(blocks) => super::dequant_q4_0(Isa::Scalar, &blocks[range], out),
        }
    }
}

/// `out` (`[group, head_dim]`, as accumulated so far) after every key of `steps`: for key k
/// and head g, `out_g *= rescales[k, g]` where bit g of `rescaled[k]` is set, then
/// `out_g[i] = fma(value_k[i], weights[k, g], out_g[i])` with `value_k` the dequantized row
/// of `head_dim / 32` blocks from block `rows[k]` of `values` on.
///
/// # Panics
/// When the lengths disagree (`head_dim` a multiple of 32, `group <= 16`) or a row lies
/// outside `values`.
pub fn accumulate(isa: Isa, values: ValueBlocks<'_>, steps: &ValueSteps<'_>, out: &mut [f32]) {
    accumulate_with(isa, wide(), values, steps, out);
}

/// True when [`accumulate`]'s AVX2 path may take its AVX-512 kernels (AVX-512 F, BW and VL
/// as `runit_quant::cpu` allows them).
fn wide() -> bool {
    cfg!(target_arch = "x86_64") && runit_quant::cpu::may_use_all(&runit_quant::cpu::AVX512)
}

/// [`accumulate`], its AVX2 path with the AVX-512 kernels where `wide` (which only
/// [`wide`]'s answer, or false, may be).
fn accumulate_with(
    isa: Isa,
    wide: bool,
    values: ValueBlocks<'_>,
    steps: &ValueSteps<'_>,
    out: &mut [f32],
) {
    #[cfg(not(target_arch = "x86_64"))]
    let _ = wide;
    let keys = steps.rows.len();
    assert_eq!(steps.rescaled.len(), keys, "a rescale mask per key");
    if keys == 0 {
        return;
    }
    let group = steps.weights.len() / keys;
    assert!((1..=16).contains(&group), "1 to 16 heads");
    assert_eq!(
        steps.weights.len(),
        keys * group,
        "weights of [keys, group]"
    );
    assert_eq!(
        steps.rescales.len(),
        keys * group,
        "rescales of [keys, group]"
    );
    let head_dim = out.len() / group;
    assert!(
        out.len() == group * head_dim && head_dim.is_multiple_of(BLOCK),
        "out of [group, head_dim], head_dim a multiple of 32"
    );
    let blocks = head_dim / BLOCK;
    let cache_blocks = values.len();
    assert!(
        steps.rows.iter().all(|&row| row + blocks <= cache_blocks),
        "value rows inside the cache"
    );
    match isa {
        // SAFETY: `Isa::Avx2` is made only by `Isa::detect`, after detecting AVX2, FMA and
        // F16C, and `wide` is set only where `wide()` found AVX-512 F, BW and VL; the
        // lengths and the rows' bounds were checked above.
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe {
            match (values, wide) {
                (ValueBlocks::Q8_0(blocks), true) => {
                    x86::accumulate_wide(blocks, steps, group, out)
                }
                (ValueBlocks::Q4_0(blocks), true) => {
                    x86::accumulate_wide(blocks, steps, group, out)
                }
                (ValueBlocks::Q8_0(blocks), false) => x86::accumulate(blocks, steps, group, out),
                (ValueBlocks::Q4_0(blocks), false) => x86::accumulate(blocks, steps, group, out),
            }
        },
        Isa::Scalar => {
            let mut row = vec![0.0f32; head_dim];
            for (k, &first) in steps.rows.iter().enumerate() {
                values.dequantize(first, &mut row);
                for (g, out) in out.chunks_exact_mut(head_dim).enumerate() {
                    if steps.rescaled[k] >> g & 1 != 0 {
                        super::scale_f32(out, steps.rescales[k * group + g]);
                    }
                    super::mad_f32(Isa::Scalar, out, &row, steps.weights[k * group + g]);
                }
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;
    use std::ops::Range;

    use runit_quant::blocks::{BlockQ4_0, BlockQ8_0};

    use super::{ValueSteps, BLOCK};

    /// f32 lanes of one AVX2 register.
    const LANES: usize = 8;
    /// Keys whose value rows the tiles of a row take in turn (their blocks, some 70 bytes a
    /// key and head at head_dim 64, stay in the L1 cache from one tile to the next).
    const KEY_CHUNK: usize = 128;

    /// [`super::softmax_steps`] compiled with FMA (a `mul_add` is one instruction, not a
    /// call).
    ///
    /// # Safety
    /// Requires AVX2, FMA and F16C.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn softmax_steps(
        weights: &mut [f32],
        rescales: &mut [f32],
        rescaled: &mut [u16],
        max: &mut [f32],
        sum: &mut [f32],
    ) {
        super::softmax_body(weights, rescales, rescaled, max, sum);
    }

    /// Eight values of a block at a time, as the AVX2 dequantization makes them.
    pub trait Codes: Sized {
        /// The block's scale in every lane.
        ///
        /// # Safety
        /// Requires AVX2 and F16C; `block` points at a readable block.
        unsafe fn scale(block: *const Self) -> __m256;
        /// Codes `8 part .. 8 part + 8` (`part < 4`) of the block as f32 (exact).
        ///
        /// # Safety
        /// As [`Codes::scale`].
        unsafe fn codes(block: *const Self, part: usize) -> __m256;
        /// The block's scale in every lane of a 512-bit register.
        ///
        /// # Safety
        /// Requires AVX-512 F; `block` points at a readable block.
        unsafe fn scale_wide(block: *const Self) -> __m512;
        /// Codes `16 half .. 16 half + 16` (`half < 2`) of the block as f32 (exact).
        ///
        /// # Safety
        /// As [`Codes::scale_wide`].
        unsafe fn codes_wide(block: *const Self, half: usize) -> __m512;
    }

    /// The f16 scale `d` at the start of a block, widened (exactly, as `f16::to_f32`).
    #[inline(always)]
    unsafe fn half_scale(d: *const u16) -> __m256 {
        // SAFETY: the caller promises a readable block, which starts with `d`.
        _mm256_cvtph_ps(_mm_set1_epi16(unsafe { d.read_unaligned() } as i16))
    }

    /// The f16 scale `d` at the start of a block, widened into 16 lanes.
    #[inline(always)]
    unsafe fn half_scale_wide(d: *const u16) -> __m512 {
        // SAFETY: the caller promises a readable block, which starts with `d`.
        _mm512_cvtph_ps(_mm256_set1_epi16(unsafe { d.read_unaligned() } as i16))
    }

    impl Codes for BlockQ8_0 {
        #[inline(always)]
        unsafe fn scale(block: *const Self) -> __m256 {
            // SAFETY: as promised by the caller.
            unsafe { half_scale(std::ptr::addr_of!((*block).d).cast()) }
        }

        #[inline(always)]
        unsafe fn scale_wide(block: *const Self) -> __m512 {
            // SAFETY: as promised by the caller.
            unsafe { half_scale_wide(std::ptr::addr_of!((*block).d).cast()) }
        }

        #[inline(always)]
        unsafe fn codes_wide(block: *const Self, half: usize) -> __m512 {
            // SAFETY: `qs` holds 32 codes; 16 are read at offset 16 half (half < 2).
            let codes = unsafe {
                _mm_loadu_si128(
                    std::ptr::addr_of!((*block).qs)
                        .cast::<i8>()
                        .add(16 * half)
                        .cast(),
                )
            };
            _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(codes))
        }

        #[inline(always)]
        unsafe fn codes(block: *const Self, part: usize) -> __m256 {
            // SAFETY: `qs` holds 32 codes; 8 are read at offset 8 part (part < 4).
            let codes = unsafe {
                _mm_loadl_epi64(
                    std::ptr::addr_of!((*block).qs)
                        .cast::<i8>()
                        .add(8 * part)
                        .cast(),
                )
            };
            _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(codes))
        }
    }

    impl Codes for BlockQ4_0 {
        #[inline(always)]
        unsafe fn scale(block: *const Self) -> __m256 {
            // SAFETY: as promised by the caller.
            unsafe { half_scale(std::ptr::addr_of!((*block).d).cast()) }
        }

        #[inline(always)]
        unsafe fn scale_wide(block: *const Self) -> __m512 {
            // SAFETY: as promised by the caller.
            unsafe { half_scale_wide(std::ptr::addr_of!((*block).d).cast()) }
        }

        /// Half 0 is the low nibbles of the 16 bytes (values 0-15), half 1 their high
        /// nibbles (values 16-31), each less 8.
        #[inline(always)]
        unsafe fn codes_wide(block: *const Self, half: usize) -> __m512 {
            // SAFETY: `qs` holds 16 bytes.
            let bytes = unsafe { _mm_loadu_si128(std::ptr::addr_of!((*block).qs).cast()) };
            let bytes = if half == 1 {
                _mm_srli_epi16::<4>(bytes)
            } else {
                bytes
            };
            let codes = _mm_sub_epi8(_mm_and_si128(bytes, _mm_set1_epi8(0x0f)), _mm_set1_epi8(8));
            _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(codes))
        }

        /// Parts 0 and 1 are the low nibbles of bytes 0-7 and 8-15 (values 0-15), parts 2
        /// and 3 their high nibbles (values 16-31), each less 8.
        #[inline(always)]
        unsafe fn codes(block: *const Self, part: usize) -> __m256 {
            // SAFETY: `qs` holds 16 bytes; 8 are read at offset 0 or 8.
            let bytes = unsafe {
                _mm_loadl_epi64(
                    std::ptr::addr_of!((*block).qs)
                        .cast::<u8>()
                        .add(8 * (part % 2))
                        .cast(),
                )
            };
            let bytes = if part >= 2 {
                _mm_srli_epi16::<4>(bytes)
            } else {
                bytes
            };
            let codes = _mm_sub_epi8(_mm_and_si128(bytes, _mm_set1_epi8(0x0f)), _mm_set1_epi8(8));
            _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(codes))
        }
    }

    /// Where a tile's accumulators come from and go: `[group, head_dim]` values at `out`.
    struct Tiles<'a, B> {
        values: *const B,
        steps: &'a ValueSteps<'a>,
        group: usize,
        head_dim: usize,
        out: *mut f32,
    }

    /// One tile: dimensions `8 first_part .. 8 (first_part + R)` of value block `block` for
    /// heads `first_head .. first_head + H`, the keys of `keys` in order, the accumulators
    /// held in `R * H` registers.
    ///
    /// # Safety
    /// Requires AVX2, FMA and F16C; `values + rows[k] + block` is a readable block for every
    /// key; `keys` lies inside the steps' keys; `first_head + H <= group`,
    /// `first_part + R <= 4` and `block < head_dim / 32`; the steps' arrays are
    /// `[keys, group]` (what [`super::accumulate`] checked).
    #[inline(always)]
    unsafe fn tile<B: Codes, const R: usize, const H: usize>(
        tiles: &Tiles<'_, B>,
        block: usize,
        first_part: usize,
        first_head: usize,
        keys: Range<usize>,
    ) {
        let (values, steps, group, head_dim, out) = (
            tiles.values,
            tiles.steps,
            tiles.group,
            tiles.head_dim,
            tiles.out,
        );
        let at = |h: usize, r: usize| {
            (first_head + h) * head_dim + block * BLOCK + (first_part + r) * LANES
        };
        let mut acc = [[_mm256_setzero_ps(); R]; H];
        for (h, acc) in acc.iter_mut().enumerate() {
            for (r, acc) in acc.iter_mut().enumerate() {
                // SAFETY: inside head `first_head + h`'s row of `out`, as promised.
                *acc = unsafe { _mm256_loadu_ps(out.add(at(h, r))) };
            }
        }
        let heads = (1u16 << H) - 1;
        for k in keys {
            let row = steps.rows[k];
            // SAFETY: a readable block, as promised.
            let p = unsafe { values.add(row + block) };
            let first = k * group + first_head;
            let rescaled = steps.rescaled[k] >> first_head & heads;
            if rescaled != 0 {
                for (h, acc) in acc.iter_mut().enumerate() {
                    if rescaled >> h & 1 != 0 {
                        let rescale = _mm256_set1_ps(steps.rescales[first + h]);
                        for acc in acc.iter_mut() {
                            *acc = _mm256_mul_ps(*acc, rescale);
                        }
                    }
                }
            }
            let weights = &steps.weights[first..first + H];
            // SAFETY: as above.
            let d = unsafe { B::scale(p) };
            for r in 0..R {
                // The dequantized value, `f32(q) * d` (one rounding), as `dequant_*` makes it.
                // SAFETY: as above; `first_part + r < 4`.
                let value = _mm256_mul_ps(unsafe { B::codes(p, first_part + r) }, d);
                for (acc, &weight) in acc.iter_mut().zip(weights) {
                    acc[r] = _mm256_fmadd_ps(value, _mm256_set1_ps(weight), acc[r]);
                }
            }
        }
        for (h, acc) in acc.iter().enumerate() {
            for (r, acc) in acc.iter().enumerate() {
                // SAFETY: as for the loads.
                unsafe { _mm256_storeu_ps(out.add(at(h, r)), *acc) };
            }
        }
    }

    /// AVX2 twin of [`super::accumulate`]: chunks of [`KEY_CHUNK`] keys, and for each the
    /// tiles of half a block (2 registers a head) and up to six heads (more heads, or whole
    /// blocks, would not fit the 16 registers: spilled accumulators cost more than a second
    /// dequantization).
    ///
    /// # Safety
    /// Requires AVX2, FMA and F16C; the lengths and rows checked by [`super::accumulate`].
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn accumulate<B: Codes>(
        values: &[B],
        steps: &ValueSteps<'_>,
        group: usize,
        out: &mut [f32],
    ) {
        let head_dim = out.len() / group;
        let tiles = Tiles {
            values: values.as_ptr(),
            steps,
            group,
            head_dim,
            out: out.as_mut_ptr(),
        };
        let chunks = group.div_ceil(6);
        let keys = steps.rows.len();
        for start in (0..keys).step_by(KEY_CHUNK) {
            let keys = start..(start + KEY_CHUNK).min(keys);
            for block in 0..head_dim / BLOCK {
                // SAFETY: every tile takes heads below `group`, parts below 4, a block below
                // head_dim / 32 and keys of the steps, whose rows' blocks lie inside `values`
                // (the caller's promise).
                unsafe {
                    let mut first_head = 0;
                    for chunk in 0..chunks {
                        let heads = (group - first_head) / (chunks - chunk);
                        for part in [0, 2] {
                            match heads {
                                1 => tile::<B, 2, 1>(&tiles, block, part, first_head, keys.clone()),
                                2 => tile::<B, 2, 2>(&tiles, block, part, first_head, keys.clone()),
                                3 => tile::<B, 2, 3>(&tiles, block, part, first_head, keys.clone()),
                                4 => tile::<B, 2, 4>(&tiles, block, part, first_head, keys.clone()),
                                5 => tile::<B, 2, 5>(&tiles, block, part, first_head, keys.clone()),
                                _ => tile::<B, 2, 6>(&tiles, block, part, first_head, keys.clone()),
                            }
                        }
                        first_head += heads;
                    }
                }
            }
        }
    }

    /// f32 lanes of one AVX-512 register (half a block).
    const WIDE_LANES: usize = 16;

    /// [`tile`] with 512-bit registers: dimensions `32 block .. 32 block + 16 R` (`R` 2 or
    /// 4: one block or two) for heads `first_head .. first_head + H`, the keys of `keys`
    /// in order, the accumulators held in `R * H` registers; lane for lane the operations
    /// of [`tile`].
    ///
    /// # Safety
    /// Requires AVX2, FMA, F16C and AVX-512 F, BW and VL; `values + rows[k] + block + R / 2 - 1`
    /// is a readable block for every key; `keys` lies inside the steps' keys;
    /// `first_head + H <= group`, `block + R / 2 <= head_dim / 32`; the steps' arrays are
    /// `[keys, group]` (what [`super::accumulate`] checked).
    #[inline(always)]
    unsafe fn tile_wide<B: Codes, const R: usize, const H: usize>(
        tiles: &Tiles<'_, B>,
        block: usize,
        first_head: usize,
        keys: Range<usize>,
    ) {
        let (values, steps, group, head_dim, out) = (
            tiles.values,
            tiles.steps,
            tiles.group,
            tiles.head_dim,
            tiles.out,
        );
        let at = |h: usize, r: usize| (first_head + h) * head_dim + block * BLOCK + r * WIDE_LANES;
        let mut acc = [[_mm512_setzero_ps(); R]; H];
        for (h, acc) in acc.iter_mut().enumerate() {
            for (r, acc) in acc.iter_mut().enumerate() {
                // SAFETY: inside head `first_head + h`'s row of `out`, as promised.
                *acc = unsafe { _mm512_loadu_ps(out.add(at(h, r))) };
            }
        }
        let heads = (1u16 << H) - 1;
        for k in keys {
            let row = steps.rows[k];
            // SAFETY: readable blocks, as promised.
            let p = unsafe { values.add(row + block) };
            let first = k * group + first_head;
            let rescaled = steps.rescaled[k] >> first_head & heads;
            if rescaled != 0 {
                for (h, acc) in acc.iter_mut().enumerate() {
                    if rescaled >> h & 1 != 0 {
                        let rescale = _mm512_set1_ps(steps.rescales[first + h]);
                        for acc in acc.iter_mut() {
                            *acc = _mm512_mul_ps(*acc, rescale);
                        }
                    }
                }
            }
            let weights = &steps.weights[first..first + H];
            for r in 0..R {
                // SAFETY: as above; block `r / 2` of the tile is one of its `R / 2`.
                let block = unsafe { p.add(r / 2) };
                // The dequantized value, `f32(q) * d` (one rounding), as `dequant_*` makes it.
                // SAFETY: as above.
                let value =
                    unsafe { _mm512_mul_ps(B::codes_wide(block, r % 2), B::scale_wide(block)) };
                for (acc, &weight) in acc.iter_mut().zip(weights) {
                    acc[r] = _mm512_fmadd_ps(value, _mm512_set1_ps(weight), acc[r]);
                }
            }
        }
        for (h, acc) in acc.iter().enumerate() {
            for (r, acc) in acc.iter().enumerate() {
                // SAFETY: as for the loads.
                unsafe { _mm512_storeu_ps(out.add(at(h, r)), *acc) };
            }
        }
    }

    /// AVX-512 twin of [`super::accumulate`] (and of [`accumulate`]): tiles of two blocks
    /// (one where a row has an odd count; 4 registers a head) and up to six heads (24 of
    /// the 32 registers), each walking all the keys.
    ///
    /// # Safety
    /// Requires AVX2, FMA, F16C and AVX-512 F, BW and VL; the lengths and rows checked by
    /// [`super::accumulate`].
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
    pub unsafe fn accumulate_wide<B: Codes>(
        values: &[B],
        steps: &ValueSteps<'_>,
        group: usize,
        out: &mut [f32],
    ) {
        let head_dim = out.len() / group;
        let tiles = Tiles {
            values: values.as_ptr(),
            steps,
            group,
            head_dim,
            out: out.as_mut_ptr(),
        };
        let chunks = group.div_ceil(6);
        let keys = 0..steps.rows.len();
        let blocks = head_dim / BLOCK;
        for block in (0..blocks).step_by(2) {
            let pair = block + 1 < blocks;
            let mut first_head = 0;
            for chunk in 0..chunks {
                let heads = (group - first_head) / (chunks - chunk);
                // SAFETY: every tile takes heads below `group`, blocks below head_dim / 32
                // (two only where `block + 1` is one) and keys of the steps, whose rows'
                // blocks lie inside `values` (the caller's promise).
                unsafe {
                    macro_rules! tile {
                        ($($h:literal)*) => {
                            match (heads, pair) {
                                $(
                                    ($h, true) => tile_wide::<B, 4, $h>(&tiles, block, first_head, keys.clone()),
                                    ($h, false) => tile_wide::<B, 2, $h>(&tiles, block, first_head, keys.clone()),
                                )*
                                _ => unreachable!("1 to 6 heads a tile"),
                            }
                        };
                    }
                    tile!(1 2 3 4 5 6);
                }
                first_head += heads;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use half::f16;
    use runit_backend::testing::Rng;
    use runit_quant::blocks::{BlockQ4_0, BlockQ8_0};

    use super::{accumulate_with, softmax_steps, ValueBlocks, ValueSteps};
    use crate::vector::Isa;

    /// Scores whose maxima rise now and then (rescales) for `keys` keys and `group` heads,
    /// walked by the scalar softmax; returns the steps' arrays.
    fn steps(rng: &mut Rng, keys: usize, group: usize) -> (Vec<f32>, Vec<f32>, Vec<u16>) {
        let mut weights: Vec<f32> = (0..keys * group)
            .map(|i| rng.uniform(-4.0, 1.0) + (i / group) as f32 * 0.01)
            .collect();
        let mut rescales = vec![0.0; keys * group];
        let mut rescaled = vec![0; keys];
        let (mut max, mut sum) = (vec![f32::NEG_INFINITY; group], vec![0.0; group]);
        softmax_steps(
            Isa::Scalar,
            &mut weights,
            &mut rescales,
            &mut rescaled,
            &mut max,
            &mut sum,
        );
        assert!(
            rescaled.iter().skip(1).any(|&mask| mask != 0),
            "some rescales"
        );
        (weights, rescales, rescaled)
    }

    /// The value pass under every kernel this machine has (scalar, AVX2, AVX-512) gives
    /// the same bits, for Q8_0 and Q4_0 blocks, 1 to 16 heads and head dims of 1 to 4
    /// blocks, from accumulators already holding values.
    #[test]
    fn value_kernels_agree_bit_for_bit() {
        let mut rng = Rng::new(0x7a1e);
        let best = Isa::detect(true);
        let mut kernels = vec![(Isa::Scalar, false), (best, false)];
        if super::wide() && best != Isa::Scalar {
            kernels.push((best, true));
        }
        let cache_blocks = 600;
        let scales = rng.values(cache_blocks, -0.05, 0.05);
        let codes = rng.values(cache_blocks * 32, -128.0, 127.0);
        let q8: Vec<BlockQ8_0> = (0..cache_blocks)
            .map(|b| BlockQ8_0 {
                d: f16::from_f32(scales[b]),
                qs: std::array::from_fn(|i| codes[b * 32 + i] as i8),
            })
            .collect();
        let q4: Vec<BlockQ4_0> = (0..cache_blocks)
            .map(|b| BlockQ4_0 {
                d: f16::from_f32(scales[b] * 10.0),
                qs: std::array::from_fn(|i| (codes[b * 32 + i] as i32 & 0xff) as u8),
            })
            .collect();
        let mut compared = 0;
        for blocks in 1..=4 {
            for group in 1..=16 {
                let keys = 150 + group;
                let (weights, rescales, rescaled) = steps(&mut rng, keys, group);
                let rows: Vec<usize> = (0..keys)
                    .map(|_| rng.below(cache_blocks - blocks + 1))
                    .collect();
                let steps = ValueSteps {
                    rows: &rows,
                    weights: &weights,
                    rescales: &rescales,
                    rescaled: &rescaled,
                };
                let start = rng.values(group * blocks * 32, -1.0, 1.0);
                for values in [ValueBlocks::Q8_0(&q8), ValueBlocks::Q4_0(&q4)] {
                    let results: Vec<Vec<u32>> = kernels
                        .iter()
                        .map(|&(isa, wide)| {
                            let mut out = start.clone();
                            accumulate_with(isa, wide, values, &steps, &mut out);
                            out.iter().map(|v| v.to_bits()).collect()
                        })
                        .collect();
                    for (result, kernel) in results.iter().zip(&kernels).skip(1) {
                        assert_eq!(
                            result, &results[0],
                            "{kernel:?}: {group} heads of {blocks} blocks"
                        );
                        compared += 1;
                    }
                }
            }
        }
        assert!(compared >= 4 * 16 * 2);
    }
}
