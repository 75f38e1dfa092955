//! AVX-512 tile kernel of the 32-element block formats that computes two activation rows
//! per 512-bit register. The two rows' activation quants come interleaved by four-byte
//! group ([`QuantLayout::Pairs`]: group `g` of the first row in lane `2s`, of the second in
//! lane `2s + 1`, `s` being its slot `PAIR_SLOTS[g]`) and the weight block's groups doubled
//! into the same slots, so one `vpdpbusd` gives both rows' lane sums, and each row's eight
//! lanes go through the arithmetic of the single-row kernel (the same integer lane sums,
//! `d_w * d_a` rounded to f32, one FMA per block into eight lanes, then the same horizontal
//! sum): every result equals the single-row kernel bit for bit. Per pair of rows and block
//! that is one `vpdpbusd` and two FMAs for the 4-bit formats (see [`exact_products`]), or one
//! `vpdpbusd`, one multiply (`d_w` by the pair's two `d_a`, a 64-bit broadcast load), one
//! conversion and one FMA, with no shuffle; the weight's doubling (a `vpmultishiftqb` or a
//! permute) and the scale conversions (one gather and one or two conversions per sixteen
//! blocks) are shared by all pairs, and two or three weight rows share each block's
//! activation loads.
//! Signed formats need no sign trick per row: their activation quants come offset to
//! unsigned, and the offset's share is taken out once per weight block (`sums_base`).

// Kernels index several per-pair arrays (accumulators, sums) by the same `p`.
#![allow(clippy::needless_range_loop)]

use std::arch::x86_64::*;

use super::legacy::Legacy;
use crate::dot::batched::{MAGIC, PAIR_LANES, PAIR_SLOTS};
use crate::dot::{checked_blocks, BlockScales, QuantLayout, TileOut};
use crate::GgmlType;

/// Most pairs of activation rows per call (sixteen rows).
const MAX_PAIRS: usize = 8;

/// The weight block's 32 quants (as the single-row kernel unpacks them) with every
/// four-quant group doubled in its pair slot: group `g` in lanes `2 * PAIR_SLOTS[g]` and
/// `2 * PAIR_SLOTS[g] + 1` (see [`QuantLayout::Pairs`]). With `VBMI`, a nibble format's
/// block is broadcast to every 128 bits, where each slot's 64 bits hold its group's four
/// bytes, and one `vpmultishiftqb` takes every lane's nibble (and the next, which the mask
/// clears) out of them: two operations instead of three.
#[inline(always)]
unsafe fn weight_quants<W: Legacy, const VBMI: bool>(p: *const u8) -> __m512i {
    match W::TYPE {
        GgmlType::Q4_0 | GgmlType::Q4_1 if VBMI => {
            let packed = _mm512_broadcast_i32x4(_mm_loadu_si128(p.add(W::BYTES - 16).cast()));
            // Slot `k` holds group `g = PAIR_SLOTS[k]`: bytes `4 * (g % 4)..` of the block,
            // which sit at bit `32 * (g % 2)` of the slot's 64 bits (bytes 0-7 of the block
            // in even slots, 8-15 in odd ones); its high nibbles (`g >= 4`) 4 bits further.
            let control = std::array::from_fn::<u8, 64, _>(|byte| {
                let group = PAIR_SLOTS[byte / 8];
                (32 * (group % 2) + 4 * (group / 4) + 8 * (byte % 4)) as u8
            });
            let control = _mm512_loadu_si512(control.as_ptr().cast());
            let nibbles = _mm512_and_si512(
                _mm512_multishift_epi64_epi8(control, packed),
                _mm512_set1_epi8(0x0f),
            );
            if W::SIGNED {
                _mm512_sub_epi8(nibbles, _mm512_set1_epi8(8))
            } else {
                nibbles
            }
        }
        // Nibble formats: the 16 packed bytes' dwords doubled into their slots (lanes 0-7
        // take the low nibbles' dwords, 8-15 the high ones'), the upper half shifted down
        // to the high nibbles (groups 4-7).
        GgmlType::Q4_0 | GgmlType::Q4_1 => {
            let packed = _mm512_castsi128_si512(_mm_loadu_si128(p.add(W::BYTES - 16).cast()));
            let doubled = _mm512_permutexvar_epi32(
                _mm512_loadu_si512(PAIR_LANES.map(|group| group % 4).as_ptr().cast()),
                packed,
            );
            let both = _mm512_srlv_epi64(doubled, _mm512_set_epi64(4, 4, 4, 4, 0, 0, 0, 0));
            let nibbles = _mm512_and_si512(both, _mm512_set1_epi8(0x0f));
            if W::SIGNED {
                _mm512_sub_epi8(nibbles, _mm512_set1_epi8(8))
            } else {
                nibbles
            }
        }
        _ => _mm512_permutexvar_epi32(
            _mm512_loadu_si512(PAIR_LANES.as_ptr().cast()),
            _mm512_castsi256_si512(W::quants(p)),
        ),
    }
}

/// What the `vpdpbusd` of a signed format's block starts from: `-128 * (sum of the four
/// weight quants of each lane)`, so that adding the products with the activation quants
/// offset to unsigned (`y + 128`, as [`block_quants`](crate::dot::block_quants) stores
/// Q8_0's) leaves exactly the lane sums `block_sums` computes with the sign trick (the
/// integers are exact either way). Zero for unsigned formats.
#[inline(always)]
unsafe fn sums_base<W: Legacy>(q: __m512i) -> __m512i {
    let zero = _mm512_setzero_si512();
    if W::SIGNED {
        let offset = _mm512_set1_epi8(0x80u8 as i8);
        _mm512_sub_epi32(zero, _mm512_dpbusd_epi32(zero, offset, q))
    } else {
        zero
    }
}

/// `vpdpbusd` lane sums of the weight quants `q` (groups doubled) and a pair of activation
/// rows `y`, as `block_sums` computes them for one row: unsigned weights against the
/// activations; signed ones as the offset activations (unsigned) against the weights, from
/// `base` ([`sums_base`]).
#[inline(always)]
unsafe fn pair_sums<W: Legacy>(q: __m512i, base: __m512i, y: __m512i) -> __m512i {
    if W::SIGNED {
        _mm512_dpbusd_epi32(base, y, q)
    } else {
        _mm512_dpbusd_epi32(base, q, y)
    }
}

/// Keeps the compiler from seeing through the stores behind `p`: the values are then read
/// back from memory as broadcast loads instead of being shuffled out of the register that
/// was stored, which would cost the shuffle port twice per block.
#[inline(always)]
fn opaque<T>(p: *const T) {
    // SAFETY: an empty assembly block (a comment naming the register): it reads and writes
    // no memory, uses no stack and keeps the flags; it only takes the pointer's value.
    unsafe { std::arch::asm!("/* {0} */", in(reg) p, options(nostack, preserves_flags)) };
}

/// Whether a format's lane sums times an activation scale are exact in f32: `|sum| < 2^13`
/// (four products of 4-bit weights and 8-bit activations) times `d_a`'s eleven significant
/// bits is at most 24 bits. The pair kernel then computes `fma(sum * d_a, d_w, acc)` (one
/// FMA gives `sum * d_a` from the offset sum: `(MAGIC + sum) * d_a - MAGIC * d_a`, rounded
/// once, is that exact product, with `-MAGIC * d_a` from the offset table of
/// [`BlockScales`]), which is the single-row kernel's `fma(d_w * d_a, sum, acc)` bit for
/// bit: `d_w * d_a` (22 bits) is exact too, so both FMAs round the same real number. It
/// saves the conversion and the multiply of every pair and block for one FMA. The pair's
/// `d_a` and offset are loads that all the weight rows share, and each row needs only its
/// `d_w` in a register (with the roles swapped, `d_w` and `-MAGIC * d_w` per row: Q4_1
/// 576x1536 x 8 tokens 10.4 -> 10.0 cycles per block, 1536x576 10.0 -> 9.5). Other
/// formats' sums (up to 2^16) would round.
#[inline(always)]
fn exact_products<W: Legacy>() -> bool {
    matches!(W::TYPE, GgmlType::Q4_0 | GgmlType::Q4_1)
}

/// Weight rows per [`tile_group`] pass (fewer where the scale buffer holds fewer), a
/// multiple of both row counts per call (see there). Short passes keep the widened scales
/// in L1, and the first pass of a task (whose weights nothing prefetched: the gathers wait
/// for them) short: with eight rows instead of a buffer's worth (56 rows of 576 inputs)
/// the decode batch's matmuls took 7-8% less time (`matmul_layers`, Q4_1 576x576,
/// 1536x576 and 576x1536, 8 tokens, 2 threads) and the kernel alone 6%
/// (`tile_rows_time`); twelve serve the three-row calls.
const PASS_ROWS: usize = 12;

/// Blocks whose widened scales one [`tile_group`] pass holds (on the stack; rows of more
/// blocks take a buffer of their own).
const SCALE_BUFFER: usize = 1024;

/// Floats per weight block that [`widen_scales`] stores: `d`, and `m` for formats with one.
#[inline(always)]
fn scale_span<W: Legacy>() -> usize {
    if W::HAS_MIN {
        2
    } else {
        1
    }
}

/// `d` of the `total` weight blocks from `w` on, `W::BYTES` apart, widened to f32 into
/// `scales`, sixteen blocks per gather: block `k`'s at `scales[k]`, or for formats with a
/// minimum its `d` and `m` side by side at `scales[2k]`, `scales[2k + 1]` (the gathered
/// words hold the two halves in that order, so one conversion widens both). The buffer
/// takes up to 31 values past its last block's.
#[inline(always)]
unsafe fn widen_scales<W: Legacy>(w: *const u8, total: usize, scales: *mut f32) {
    // The first four bytes of each block: `d`, and `m` where the format has one (every
    // block is at least 18 bytes long).
    let offsets = _mm512_mullo_epi32(
        _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
        _mm512_set1_epi32(W::BYTES as i32),
    );
    for first in (0..total).step_by(16) {
        let left = total - first;
        let mask: __mmask16 = if left >= 16 {
            0xffff
        } else {
            (1u16 << left) - 1
        };
        let words = _mm512_mask_i32gather_epi32::<1>(
            _mm512_setzero_si512(),
            mask,
            offsets,
            w.add(first * W::BYTES).cast(),
        );
        if W::HAS_MIN {
            let out = scales.add(2 * first);
            _mm512_storeu_ps(out, _mm512_cvtph_ps(_mm512_castsi512_si256(words)));
            _mm512_storeu_ps(
                out.add(16),
                _mm512_cvtph_ps(_mm512_extracti64x4_epi64::<1>(words)),
            );
        } else {
            let d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(words));
            _mm512_storeu_ps(scales.add(first), d);
        }
    }
}

/// `R` weight rows (`row_bytes` apart) against `count <= 2 * P` activation rows whose
/// quants are the paired table `quants` (the pair of rows `2p, 2p + 1` of block `i` at
/// `(i * block_rows + 2p) * 32`) and whose block scales are `d` and `s` at `[i * stride + c]`;
/// with `EXACT` (the [`exact_products`] arithmetic) the pairs' `-MAGIC * d_a` are `o` at the
/// same indices; weight row `r`'s block scales are `scales_w[r * blocks + i]`, or `d` and
/// `m` at `scales_w[2 * (r * blocks + i)]` and the next for formats with a minimum
/// (widened: see [`widen_scales`]); row `c`'s result of weight row `r` goes to `out[r *
/// row_step + c * out_stride]`. The rows share each block's activation loads (the quants
/// and the pairs' scales), which cost this core's vector ports as much as the arithmetic
/// does.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn tile_pairs<
    W: Legacy,
    const P: usize,
    const R: usize,
    const VBMI: bool,
    const EXACT: bool,
>(
    blocks: usize,
    w: *const u8,
    row_bytes: usize,
    scales_w: *const f32,
    quants: *const u8,
    d: *const f32,
    o: *const f32,
    s: *const f32,
    stride: usize,
    count: usize,
    out: *mut f32,
    out_stride: usize,
    row_step: usize,
    ahead: usize,
) {
    let block_rows = QuantLayout::Pairs.block_rows(stride);
    let span = scale_span::<W>();
    let mut acc = [[_mm512_setzero_ps(); P]; R];
    // Lane c % 8 of minimums[r][c / 8]: the running `m * s` of row c. Up to four pairs the
    // rows fit one octet; from five they need both (`count > 8`).
    let octets = if P > 4 { 2 } else { 1 };
    let mut minimums = [[_mm256_setzero_ps(); 2]; R];
    for i in 0..blocks {
        if W::HAS_MIN {
            for octet in 0..octets {
                let sums = _mm256_loadu_ps(s.add(i * stride + 8 * octet));
                for r in 0..R {
                    let m = _mm256_set1_ps(*scales_w.add(2 * (r * blocks + i) + 1));
                    minimums[r][octet] = _mm256_fmadd_ps(m, sums, minimums[r][octet]);
                }
            }
        }
        // Plain loops, not `array::from_fn`: its closure runs inside a function compiled
        // without this one's target features, where the intrinsics become calls (Q5 decode
        // batches ran ten times slower that way).
        let mut q = [_mm512_setzero_si512(); R];
        let mut base = [_mm512_setzero_si512(); R];
        let mut scale_w = [_mm512_setzero_ps(); R];
        for r in 0..R {
            let block = w.add(r * row_bytes + i * W::BYTES);
            _mm_prefetch::<_MM_HINT_T0>(block.wrapping_add(ahead).cast());
            q[r] = weight_quants::<W, VBMI>(block);
            let sums = sums_base::<W>(q[r]);
            base[r] = if EXACT {
                _mm512_add_epi32(sums, _mm512_set1_epi32(MAGIC.to_bits() as i32))
            } else {
                sums
            };
            scale_w[r] = _mm512_set1_ps(*scales_w.add(span * (r * blocks + i)));
        }
        let row_quants = quants.add(i * block_rows * 32);
        let row_d = d.add(i * stride);
        let row_o = o.add(i * stride);
        for p in 0..P {
            let y = _mm512_loadu_si512(row_quants.add(p * 64).cast());
            let pair = _mm512_castpd_ps(_mm512_set1_pd(
                row_d.add(2 * p).cast::<f64>().read_unaligned(),
            ));
            // `-MAGIC * d_a` of the pair (exact products only).
            let offset = if EXACT {
                _mm512_castpd_ps(_mm512_set1_pd(
                    row_o.add(2 * p).cast::<f64>().read_unaligned(),
                ))
            } else {
                _mm512_setzero_ps()
            };
            for r in 0..R {
                let sums = pair_sums::<W>(q[r], base[r], y);
                acc[r][p] = if EXACT {
                    let weighted = _mm512_fmadd_ps(_mm512_castsi512_ps(sums), pair, offset);
                    _mm512_fmadd_ps(weighted, scale_w[r], acc[r][p])
                } else {
                    let scale = _mm512_mul_ps(scale_w[r], pair);
                    _mm512_fmadd_ps(scale, _mm512_cvtepi32_ps(sums), acc[r][p])
                };
            }
        }
    }
    for r in 0..R {
        store_sums::<W, P>(
            &acc[r],
            &minimums[r],
            count,
            out.add(r * row_step),
            out_stride,
        );
    }
}

/// One weight row's results from its pair accumulators `acc` (and, for formats with a
/// minimum, the running `m * s` of each activation row): row `c`'s to `out[c * out_stride]`.
#[inline(always)]
unsafe fn store_sums<W: Legacy, const P: usize>(
    acc: &[__m512; P],
    minimums: &[__m256; 2],
    count: usize,
    out: *mut f32,
    out_stride: usize,
) {
    let octets = if P > 4 { 2 } else { 1 };
    // The horizontal sums, as `hsum8` adds one row's eight lanes (`((l0 + l4) + (l2 + l6))
    // + ((l1 + l5) + (l3 + l7))`), for four pairs (eight rows) at once: a pair's two rows
    // sit side by side lane by lane, so every step adds the upper half of each pair's
    // values to the lower, and the shuffles only gather the halves of several pairs into
    // one register. Pairs past `P` are zeros and unused.
    let mut padded = [_mm512_setzero_ps(); 8];
    padded[..P].copy_from_slice(acc);
    let mut sums = [0.0f32; 16];
    for octet in 0..octets {
        let [a, b, c, e] = [0, 1, 2, 3].map(|k| padded[4 * octet + k]);
        // Pairs (a, b) and (c, e): lane k of each one's upper 256 bits onto its lower.
        let halves = |x: __m512, y: __m512| {
            let low = _mm512_shuffle_f32x4::<0b01_00_01_00>(x, y);
            let high = _mm512_shuffle_f32x4::<0b11_10_11_10>(x, y);
            _mm512_add_ps(low, high)
        };
        // Now each pair's lower 128 bits hold groups (0 + 4, 2 + 6) (the slots of groups 0
        // and 2), its upper ones (1 + 5, 3 + 7). Lanes 2, 3 of each 128 bits onto lanes
        // 0, 1: ((0 + 4) + (2 + 6)) and ((1 + 5) + (3 + 7)), of both rows.
        let fold = |x: __m512| _mm512_add_ps(x, _mm512_shuffle_ps::<0b11_10_11_10>(x, x));
        let (ab, ce) = (fold(halves(a, b)), fold(halves(c, e)));
        // Each pair's upper 128 bits onto its lower: [pairs a, b, c, e], the two rows' sums
        // in lanes 0 and 1 of each.
        let low = _mm512_shuffle_f32x4::<0b10_00_10_00>(ab, ce);
        let high = _mm512_shuffle_f32x4::<0b11_01_11_01>(ab, ce);
        let both = _mm512_add_ps(low, high);
        let rows = _mm512_permutexvar_ps(
            _mm512_set_epi32(0, 0, 0, 0, 0, 0, 0, 0, 13, 12, 9, 8, 5, 4, 1, 0),
            both,
        );
        let mut rows = _mm512_castps512_ps256(rows);
        if W::HAS_MIN {
            rows = _mm256_add_ps(rows, minimums[octet]);
        }
        _mm256_storeu_ps(sums.as_mut_ptr().add(8 * octet), rows);
    }
    for c in 0..count {
        *out.add(c * out_stride) = sums[c];
    }
}

/// [`tile_pairs`] for `rows` weight rows stored back to back (`row_bytes` apart, so every
/// block of them is `W::BYTES` after the last), row `r`'s results starting at
/// `out[r * row_step]`. The weight scales of as many rows as [`SCALE_BUFFER`] holds are
/// widened in one pass before their sums.
#[inline(always)]
unsafe fn tile_group<W: Legacy, const P: usize, const VBMI: bool>(group: Group) {
    let Group {
        rows,
        row_bytes,
        blocks,
        w,
        quants,
        d,
        o,
        s,
        stride,
        count,
        out,
        out_stride,
        row_step,
    } = group;
    // The pass's widened weight scales (`d`, or `d` and `m` side by side: see
    // [`widen_scales`]), with 32 values of slack for the gathers' last stores. Left unset:
    // every value read was widened there first (zeroing 8 KB per call showed up in decode
    // profiles).
    let span = scale_span::<W>();
    let mut stack = std::mem::MaybeUninit::<[f32; 2 * SCALE_BUFFER + 32]>::uninit();
    let mut heap = Vec::new();
    let (scales, capacity) = if blocks <= SCALE_BUFFER {
        (stack.as_mut_ptr().cast::<f32>(), SCALE_BUFFER)
    } else {
        heap.resize(span * blocks + 32, 0.0f32);
        (heap.as_mut_ptr(), blocks)
    };
    let group_rows = (capacity / blocks.max(1)).clamp(1, PASS_ROWS);
    // Each block prefetches the one a pass of rows later: the next pass's scale gathers
    // (which cannot overlap the sums they precede) then find their lines in the cache.
    let ahead = group_rows * row_bytes;
    // The exact products need every pair's `-MAGIC * d_a` (`o`, absent where the tables
    // came without, as where some `d_a` is not finite: an infinite one would make the
    // first FMA `inf - inf`, where the reference's `(d_w * d_a) * sum` is infinite).
    let exact = exact_products::<W>() && !o.is_null();
    let mut first = 0;
    while first < rows {
        let group = group_rows.min(rows - first);
        widen_scales::<W>(w.add(first * row_bytes), group * blocks, scales);
        opaque(scales);
        // Three weight rows at a time for the 4-bit formats up to four pairs (their exact
        // products need no scale register per pair and row, which leaves room for a third
        // row's accumulators: the pairs' loads then serve three rows; batch_decode 8 at
        // once, medians of 6 alternated runs, 653-661 -> 675-682 tok/s; four spilled: 10.6
        // -> 12.2 cycles per block), two for the others and for more pairs (three spilled:
        // Q8_0 13.4 -> 14.1 cycles per block; Q4_1 with 16 tokens 19.6 -> 24.9, with 12
        // tokens 15.7 -> 17.5), a last odd one alone.
        let mut r = first;
        while r < first + group {
            let at = (r - first) * blocks;
            macro_rules! rows {
                ($rows:literal, $exact:literal) => {
                    tile_pairs::<W, P, $rows, VBMI, $exact>(
                        blocks,
                        w.add(r * row_bytes),
                        row_bytes,
                        scales.add(span * at),
                        quants,
                        d,
                        o,
                        s,
                        stride,
                        count,
                        out.add(r * row_step),
                        out_stride,
                        row_step,
                        ahead,
                    )
                };
            }
            if exact && P <= 4 && r + 3 <= first + group {
                rows!(3, true);
                r += 3;
            } else if r + 2 <= first + group {
                if exact {
                    rows!(2, true);
                } else {
                    rows!(2, false);
                }
                r += 2;
            } else {
                if exact {
                    rows!(1, true);
                } else {
                    rows!(1, false);
                }
                r += 1;
            }
        }
        first += group;
    }
}

/// The arguments of one [`tile_group`] call (see [`tile_pairs`] for what they are).
#[derive(Clone, Copy)]
struct Group {
    rows: usize,
    row_bytes: usize,
    blocks: usize,
    w: *const u8,
    quants: *const u8,
    d: *const f32,
    /// `-MAGIC * d` at `d`'s indices (`BlockScales::offsets`), for the [`exact_products`]
    /// formats; null where they take the other arithmetic.
    o: *const f32,
    s: *const f32,
    stride: usize,
    count: usize,
    out: *mut f32,
    out_stride: usize,
    row_step: usize,
}

/// `$name`: [`tile_group`] compiled for `$features`, with or without VBMI's unpacking.
macro_rules! tile_group_for {
    ($name:ident, $features:literal, $vbmi:literal) => {
        #[target_feature(enable = $features)]
        unsafe fn $name<W: Legacy, const P: usize>(group: Group) {
            tile_group::<W, P, $vbmi>(group)
        }
    };
}

tile_group_for!(
    tile_group_vnni,
    "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni",
    false
);
tile_group_for!(
    tile_group_vbmi,
    "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi",
    true
);

/// Whether [`crate::cpu`] allows AVX-512 VBMI (`vpmultishiftqb`), unless a test turned it
/// off (both paths give the same bits, so other tests running meanwhile are unaffected).
fn has_vbmi() -> bool {
    #[cfg(test)]
    if WITHOUT_VBMI.load(std::sync::atomic::Ordering::Relaxed) {
        return false;
    }
    crate::cpu::may_use(crate::cpu::Feature::Avx512Vbmi)
}

/// Makes the pair kernels take the path of CPUs without VBMI (for the twin tests).
#[cfg(test)]
pub(crate) static WITHOUT_VBMI: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(false);

/// [`TileRowsFn`](crate::dot::TileRowsFn): every weight row of `w` (rows of `n` elements,
/// back to back) against `out`'s tokens (the activation rows), row `r` of token `c` to
/// `out`'s `[c * stride + r]`; the checks run once for all rows. Needs `scales.quants` in the paired layout (else `false`:
/// the caller loops over the single-row [`tile`]).
pub(super) fn tile_rows<W: Legacy>(
    n: usize,
    w: &[u8],
    a: &[u8],
    scales: BlockScales<'_>,
    mut out: TileOut<'_>,
) -> bool {
    let paired = scales.layout == QuantLayout::Pairs && !scales.quants.is_empty();
    let tokens = out.tokens();
    if !paired || tokens == 0 || w.is_empty() {
        return paired;
    }
    let row_bytes = n / 32 * W::BYTES;
    let rows = w.len() / row_bytes.max(1);
    assert_eq!(rows * row_bytes, w.len(), "whole weight rows");
    assert_eq!(rows, out.rows(), "one output per weight row");
    let activation_bytes = a.len() / tokens;
    assert_eq!(
        activation_bytes * tokens,
        a.len(),
        "activation rows of equal length"
    );
    let blocks = checked_blocks(W::TYPE, n, &w[..row_bytes], &a[..activation_bytes]);
    scales.check(blocks, tokens, W::HAS_MIN);
    let (stride, first) = (out.stride(), out.start());
    let mut start = 0;
    while start < tokens {
        let count = (tokens - start).min(2 * MAX_PAIRS);
        // SAFETY: `tile_rows_fn` hands this kernel out only at the AVX-512 VNNI level, which
        // `SimdLevel::is_available` confirmed; `checked_blocks` and `scales.check` above
        // cover every weight row (all have `row_bytes` bytes) and the paired tables for
        // `tokens` rows; `out` may be written at `c * stride + r` for every token `c` and
        // row `r` (`TileOut`'s promise), and this group writes `(start + c) * stride + r`
        // for `c < count`.
        unsafe {
            run_group::<W>(
                Rows {
                    count: rows,
                    bytes: row_bytes,
                    step: 1,
                },
                blocks,
                w.as_ptr(),
                scales,
                start,
                count,
                first.add(start * stride),
                stride,
            )
        };
        start += count;
    }
    true
}

/// The weight rows of one [`run_group`] call: `count` rows `bytes` apart, whose results
/// start `step` outputs apart.
#[derive(Clone, Copy)]
struct Rows {
    count: usize,
    bytes: usize,
    step: usize,
}

/// The weight rows at `w` against activation rows `start .. start + count` (count <= 16,
/// `start` even), row `c`'s result of weight row `r` to `out[r * rows.step + c *
/// out_stride]`.
///
/// # Safety
/// AVX-512 VNNI is available; `scales` passed `check` for `blocks` and at least `start +
/// count` rows, in the paired layout; every weight row holds `blocks` blocks; `out` has
/// the slots written.
#[allow(clippy::too_many_arguments)]
unsafe fn run_group<W: Legacy>(
    rows: Rows,
    blocks: usize,
    w: *const u8,
    scales: BlockScales<'_>,
    start: usize,
    count: usize,
    out: *mut f32,
    out_stride: usize,
) {
    let quants = scales.quants[start * 32..].as_ptr();
    let d = scales.d[start..].as_ptr();
    let o = if scales.offsets.is_empty() {
        std::ptr::null()
    } else {
        scales.offsets[start..].as_ptr()
    };
    let s = if W::HAS_MIN {
        scales.s[start..].as_ptr()
    } else {
        d
    };
    let stride = scales.stride;
    let Rows {
        count: n_rows,
        bytes,
        step,
    } = rows;
    let vbmi = has_vbmi();
    let group = Group {
        rows: n_rows,
        row_bytes: bytes,
        blocks,
        w,
        quants,
        d,
        o,
        s,
        stride,
        count,
        out,
        out_stride,
        row_step: step,
    };
    macro_rules! group {
        ($pairs:literal) => {
            if vbmi {
                tile_group_vbmi::<W, $pairs>(group)
            } else {
                tile_group_vnni::<W, $pairs>(group)
            }
        };
    }
    // SAFETY: the caller promises what `tile_group` needs (see `# Safety`: AVX-512 VNNI,
    // checked tables, whole weight rows, writable output slots); the VBMI variant runs only
    // where `has_vbmi` confirmed AVX-512 VBMI.
    unsafe {
        match count.div_ceil(2) {
            8 => group!(8),
            7 => group!(7),
            6 => group!(6),
            5 => group!(5),
            4 => group!(4),
            3 => group!(3),
            2 => group!(2),
            _ => group!(1),
        }
    }
}

/// The tile kernel ([`TileFn`](crate::dot::TileFn)): `scales.quants` must hold the paired
/// copy of the activation quants; without it the 256-bit kernel `fallback` runs.
pub(super) fn tile<W: Legacy>(
    n: usize,
    w: &[u8],
    a: &[u8],
    scales: BlockScales<'_>,
    out: &mut [f32],
    fallback: crate::dot::TileFn,
) {
    if out.is_empty() {
        return;
    }
    if scales.layout != QuantLayout::Pairs || scales.quants.is_empty() {
        return fallback(n, w, a, scales, out);
    }
    let row_bytes = a.len() / out.len();
    assert_eq!(
        row_bytes * out.len(),
        a.len(),
        "activation rows of equal length"
    );
    let blocks = checked_blocks(W::TYPE, n, w, &a[..row_bytes]);
    scales.check(blocks, out.len(), W::HAS_MIN);
    let mut start = 0;
    while start < out.len() {
        let count = (out.len() - start).min(2 * MAX_PAIRS);
        // SAFETY: `tile_fn` hands this kernel out only at the AVX-512 VNNI level, which
        // `SimdLevel::is_available` confirmed; `scales.check` verified that the tables hold
        // every value read (sums eight at a time past each block's rows, quants up to the
        // pair partner of the last row, d through a masked load), and `out` has `count`
        // slots from `start`.
        unsafe {
            run_group::<W>(
                Rows {
                    count: 1,
                    bytes: 0,
                    step: 0,
                },
                blocks,
                w.as_ptr(),
                scales,
                start,
                count,
                out[start..].as_mut_ptr(),
                1,
            )
        };
        start += count;
    }
}
