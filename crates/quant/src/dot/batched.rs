//! Batched kernel entry points: many weight rows against one activation row ([`GemvFn`],
//! decode) and one weight row against a tile of activation rows whose block scales were
//! widened to f32 beforehand ([`TileFn`] with [`BlockScales`], prompt processing). Both
//! give the single-row [`DotFn`](super::DotFn)'s results bit for bit; they exist for the 32-element
//! formats, where per-block scale conversions dominate the single-row kernels.

#[cfg(target_arch = "x86_64")]
use super::x86;
use super::{activation_row_bytes, legacy, quantize_activation, ActivationFormat, SimdLevel};
use crate::GgmlType;

/// `gemv(n, weight_rows, activation_row, out)`: `out[r] = dot(weight row r, activation_row)`
/// for `out.len()` weight rows of `n` elements stored back to back in `weight_rows`. Walks
/// several weight rows at once (independent accumulators, one activation block load and
/// scale conversion for all of them); results equal the single-row [`DotFn`](super::DotFn) bit for bit.
pub type GemvFn = fn(n: usize, weight_rows: &[u8], activation_row: &[u8], out: &mut [f32]);

/// `tile(n, weight_row, activations, scales, out)`: as [`MultiDotFn`](super::MultiDotFn), with the activation
/// block scales already widened to f32 in `scales` (column 0 of the tables is row 0 of
/// `activations`; see [`block_scales`]). Results equal the single-row [`DotFn`](super::DotFn) bit for bit.
pub type TileFn =
    fn(n: usize, weight_row: &[u8], activations: &[u8], scales: BlockScales<'_>, out: &mut [f32]);

/// `tile_rows(n, weight_rows, activations, scales, out)`: [`TileFn`] for several weight rows
/// of `n` elements stored back to back against `out`'s tokens (the activation rows), row
/// `r`'s result for token `c` to `out`'s `[c * stride + r]` (token-major, so that each
/// token's results are one run); the checks run once for all rows. Returns `false`
/// (computing nothing) when it cannot run on these tables (no [`BlockScales::quants`], or
/// another [`QuantLayout`]): loop over the [`TileFn`] then. Results equal the single-row
/// [`DotFn`](super::DotFn) bit for bit.
pub type TileRowsFn = fn(
    n: usize,
    weight_rows: &[u8],
    activations: &[u8],
    scales: BlockScales<'_>,
    out: TileOut<'_>,
) -> bool;

/// `tile_rows(n, weight_rows, activations, out)`: [`TileRowsFn`] for the float formats,
/// which have no block scale tables: every weight row of `weight_rows` (rows of `n`
/// elements back to back) against every activation row of `activations`, row `r`'s result
/// for token `c` to `out`'s `[c * stride + r]`, each equal to the single-row
/// [`DotFn`](super::DotFn) bit for bit.
pub type PlainTileRowsFn = fn(n: usize, weight_rows: &[u8], activations: &[u8], out: TileOut<'_>);

/// The [`PlainTileRowsFn`] of `weight` at `level` (or a lower level of its fallback chain),
/// where this CPU has one: F16 on CPUs with AVX512-FP16.
pub fn plain_tile_rows_fn(weight: GgmlType, level: SimdLevel) -> Option<PlainTileRowsFn> {
    #[cfg(target_arch = "x86_64")]
    return first_in_chain(weight, level, x86::plain_tile_rows);
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (weight, level);
        None
    }
}

/// The kernel `kernel` gives for `weight` at `level` or the first lower level of its
/// fallback chain that this CPU has and that has one; `None` when `level` is unavailable.
#[cfg(target_arch = "x86_64")]
fn first_in_chain<K>(
    weight: GgmlType,
    level: SimdLevel,
    kernel: fn(GgmlType, SimdLevel) -> Option<K>,
) -> Option<K> {
    if !level.is_available() {
        return None;
    }
    level
        .fallback_chain()
        .iter()
        .filter(|candidate| candidate.is_available())
        .find_map(|&candidate| kernel(weight, candidate))
}

/// Where a [`TileRowsFn`] writes: `tokens` runs of `rows` results, `stride` values apart.
/// Made from a slice, or from a pointer into a larger output that other threads fill in
/// other columns at the same time (the matmul writes its tasks' results in place).
#[derive(Debug)]
pub struct TileOut<'a> {
    start: *mut f32,
    tokens: usize,
    rows: usize,
    stride: usize,
    marker: std::marker::PhantomData<&'a mut [f32]>,
}

impl<'a> TileOut<'a> {
    /// `out` as `[tokens, rows]`.
    ///
    /// # Panics
    /// Unless `out.len()` is a multiple of `rows`.
    pub fn new(out: &'a mut [f32], rows: usize) -> TileOut<'a> {
        let tokens = out.len() / rows.max(1);
        assert_eq!(tokens * rows, out.len(), "out is [tokens x {rows}]");
        TileOut {
            start: out.as_mut_ptr(),
            tokens,
            rows,
            stride: rows,
            marker: std::marker::PhantomData,
        }
    }

    /// `tokens` runs of `rows` values from `start`, `stride` apart.
    ///
    /// # Safety
    /// Every `start + c * stride + r` (`c < tokens`, `r < rows`) is valid for writes for
    /// `'a`, and nothing else reads or writes those values meanwhile; `rows <= stride`.
    pub unsafe fn from_raw(
        start: *mut f32,
        tokens: usize,
        rows: usize,
        stride: usize,
    ) -> TileOut<'a> {
        debug_assert!(rows <= stride || tokens <= 1);
        TileOut {
            start,
            tokens,
            rows,
            stride,
            marker: std::marker::PhantomData,
        }
    }

    /// Tokens (runs of results).
    pub fn tokens(&self) -> usize {
        self.tokens
    }

    /// Results per token.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Values between two tokens' runs.
    pub fn stride(&self) -> usize {
        self.stride
    }

    /// The first value.
    pub fn start(&mut self) -> *mut f32 {
        self.start
    }
}

/// The f16 block scales of activation rows in a 32-element format (Q8_0 `d`; Q8_1 `d` and
/// `s`), widened to f32 and stored block-major: block `i` of row `t` at `[i * stride + t]`,
/// so that a tile kernel reads one row's scale as a broadcast load and four rows' sums as
/// one vector load. The conversion is exact, so the kernels' arithmetic is unchanged.
#[derive(Debug, Clone, Copy)]
pub struct BlockScales<'a> {
    /// `d` of each block.
    pub d: &'a [f32],
    /// Q8_1's `s` of each block (empty for Q8_0).
    pub s: &'a [f32],
    /// The activation quants (32 bytes per block), block-major like the scale tables:
    /// block `i` of row `t` at bytes `[(i * stride + t) * 32..][..32]`, so that rows side by
    /// side are adjacent in memory (see [`block_quants`], which stores Q8_0's plus 128);
    /// empty when not made, and then kernels read the rows themselves.
    pub quants: &'a [u8],
    /// Rows in the tables (the distance between consecutive blocks of one row).
    pub stride: usize,
    /// How `quants` arranges a block's rows.
    pub layout: QuantLayout,
    /// `-1.5 * 2^23 * d` of each block, at `d`'s indices (see [`block_offsets`]), which the
    /// AVX-512 pair kernel of the 4-bit formats reads; empty when not made (or where some
    /// `d` is not finite), and then that kernel takes arithmetic that does without.
    pub offsets: &'a [f32],
}

/// 1.5 * 2^23: every float in `[2^23, 2^24)` is an integer, so `MAGIC + k` for `|k| < 2^22`
/// has the bits of `MAGIC` plus `k`. A `vpdpbusd` that starts from `MAGIC`'s bits therefore
/// ends on the lane sum as a float offset by `MAGIC`, with no conversion.
pub(crate) const MAGIC: f32 = 12_582_912.0;

/// Fills `offsets` with `-1.5 * 2^23 * d` of each value of `d` (a [`BlockScales`] `d`
/// table; the products are exact: the constant has two significant bits, an f16 scale
/// eleven) and returns true, or returns false where some `d` is not finite (`offsets`
/// then must not be handed to a kernel). `offsets` is as long as `d`.
pub fn block_offsets(d: &[f32], offsets: &mut [f32]) -> bool {
    assert_eq!(d.len(), offsets.len(), "one offset per scale");
    let mut finite = true;
    for (offset, &d) in offsets.iter_mut().zip(d) {
        finite &= d.is_finite();
        *offset = -MAGIC * d;
    }
    finite
}

/// How [`block_quants`] arranges the quants of one block's rows (`stride` rows a block).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QuantLayout {
    /// Row `t` of block `i`: 32 bytes at `(i * stride + t) * 32` (the AVX2 kernels).
    Rows,
    /// Rows in pairs (0 with 1, 2 with 3, ...): the 64 bytes of the pair holding row `t` of
    /// block `i` at `(i * even + t - t % 2) * 32`, `even` being `stride` rounded up to a
    /// multiple of two, with the rows' four-byte groups interleaved: group `g` of the even
    /// row at byte `8 * PAIR_SLOTS[g]`, of the odd row at `8 * PAIR_SLOTS[g] + 4` (zero past
    /// an odd last row). A 512-bit register then holds both rows with each lane's group in
    /// the same place as the weight's doubled groups, so the pair kernel needs no shuffle
    /// per pair. The slots put groups 1 and 2 (and 5 and 6) in each other's place: a 4-bit
    /// weight block's sixteen bytes, broadcast to every 128 bits, then hold each slot's
    /// group in the 64 bits of that slot, which one `vpmultishiftqb` unpacks.
    Pairs,
}

impl QuantLayout {
    /// The layout the tile kernels at `level` read (after its fallbacks on this CPU).
    pub fn for_level(level: SimdLevel) -> QuantLayout {
        let resolved = level
            .fallback_chain()
            .iter()
            .copied()
            .find(|candidate| candidate.is_available());
        match resolved {
            Some(SimdLevel::Avx512Vnni) => QuantLayout::Pairs,
            _ => QuantLayout::Rows,
        }
    }

    /// Rows a block takes in the table: `stride`, rounded up to pairs for [`Self::Pairs`].
    pub(crate) fn block_rows(self, stride: usize) -> usize {
        match self {
            QuantLayout::Rows => stride,
            QuantLayout::Pairs => stride.next_multiple_of(2),
        }
    }
}

/// The 8-byte slot of each four-quant group in a [`QuantLayout::Pairs`] pair (its own
/// inverse).
pub(crate) const PAIR_SLOTS: [usize; 8] = [0, 2, 1, 3, 4, 6, 5, 7];

/// The group each 32-bit lane of a pair takes ([`PAIR_SLOTS`] doubled: lanes `2s` and
/// `2s + 1` of slot `s`), as a permute index.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub(crate) const PAIR_LANES: [i32; 16] = {
    let mut lanes = [0; 16];
    let mut lane = 0;
    while lane < 16 {
        lanes[lane] = PAIR_SLOTS[lane / 2] as i32;
        lane += 1;
    }
    lanes
};

/// Values of padding after the tables of [`block_scales`]: a tile kernel reads the tables
/// up to eight rows at a time.
pub const BLOCK_SCALES_PADDING: usize = 8;

impl BlockScales<'_> {
    /// These tables, starting at row `first`. A paired quant table cannot start in the
    /// middle of a pair: from an odd row it is left out (kernels then read the rows).
    pub fn from_row(self, first: usize) -> Self {
        let quants = if self.layout == QuantLayout::Pairs && first % 2 == 1 {
            &[]
        } else {
            &self.quants[(32 * first).min(self.quants.len())..]
        };
        BlockScales {
            d: &self.d[first.min(self.d.len())..],
            s: &self.s[first.min(self.s.len())..],
            offsets: &self.offsets[first.min(self.offsets.len())..],
            quants,
            ..self
        }
    }

    /// Panics unless the tables hold `blocks` blocks of `rows` rows (plus the padding that
    /// vector loads of the sums read).
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    pub(crate) fn check(&self, blocks: usize, rows: usize, with_sums: bool) {
        if blocks == 0 || rows == 0 {
            return;
        }
        assert!(
            rows <= self.stride,
            "{rows} rows in tables of stride {}",
            self.stride
        );
        let needed = (blocks - 1) * self.stride + rows + BLOCK_SCALES_PADDING - 1;
        assert!(
            self.d.len() >= needed,
            "scale table of {} values for {blocks} blocks x {rows} rows",
            self.d.len()
        );
        assert!(
            self.offsets.is_empty() || self.offsets.len() >= needed,
            "offset table of {} values for {blocks} blocks x {rows} rows (+ padding)",
            self.offsets.len()
        );
        if with_sums {
            assert!(
                self.s.len() >= needed,
                "sum table of {} values for {blocks} blocks x {rows} rows (+ padding)",
                self.s.len()
            );
        }
        if !self.quants.is_empty() {
            // A pair of rows reads the partner of an odd last row too.
            let block_rows = self.layout.block_rows(self.stride);
            let quants_needed = ((blocks - 1) * block_rows + rows.next_multiple_of(2)) * 32;
            assert!(
                self.quants.len() >= quants_needed,
                "quant table of {} bytes for {blocks} blocks x {rows} rows",
                self.quants.len()
            );
        }
    }
}

/// Bytes of [`block_quants`]'s table for `rows` rows of `n` elements in either layout (with
/// room for the partner of an odd last row).
pub fn block_quants_len(n: usize, rows: usize) -> usize {
    (n / 32 * rows.next_multiple_of(2) + 1) * 32
}

/// Copies the quants of the `rows` activation rows of `n` elements in `activations`
/// (format Q8_0 or Q8_1) into `quants` block-major, as [`BlockScales::quants`] and `layout`
/// describe with `stride == rows`; `quants` is [`block_quants_len`] long. Q8_0's are stored
/// plus 128 (`q ^ 0x80`: unsigned bytes), Q8_1's as they are. Returns `false` (and
/// leaves `quants` alone) for other formats.
///
/// # Panics
/// When a length disagrees.
pub fn block_quants(
    format: ActivationFormat,
    activations: &[u8],
    rows: usize,
    n: usize,
    quants: &mut [u8],
    layout: QuantLayout,
) -> bool {
    let block_bytes = match format {
        ActivationFormat::Q8_0 => 34,
        ActivationFormat::Q8_1 => 36,
        _ => return false,
    };
    let row_bytes = activation_row_bytes(format, n);
    assert_eq!(
        activations.len(),
        rows * row_bytes,
        "{rows} activation rows of {n}"
    );
    assert_eq!(
        quants.len(),
        block_quants_len(n, rows),
        "quant table length"
    );
    let block_rows = layout.block_rows(rows);
    let tail = quants.len() - 32;
    quants[tail..].fill(0);
    if block_rows > rows {
        // The missing partner of the odd last row of every block.
        for i in 0..n / 32 {
            let at = (i * block_rows + rows - 1) * 32;
            quants[at..at + 64].fill(0);
        }
    }
    // Q8_0 pairs with signed weights: its quants are stored plus 128 (as unsigned bytes),
    // the operand `vpdpbusd` takes unsigned (see the pair kernel's `sums_base`).
    let offset = if format == ActivationFormat::Q8_0 {
        0x80
    } else {
        0
    };
    // Four quants at a time (one group), the offset applied to all four bytes at once.
    let offset = u32::from_ne_bytes([offset; 4]);
    for (t, row) in activations.chunks_exact(row_bytes).enumerate() {
        for (i, block) in row.chunks_exact(block_bytes).enumerate() {
            let (at, step, slots) = match layout {
                QuantLayout::Rows => ((i * rows + t) * 32, 4, [0, 1, 2, 3, 4, 5, 6, 7]),
                QuantLayout::Pairs => (
                    (i * block_rows + t - t % 2) * 32 + 4 * (t % 2),
                    8,
                    PAIR_SLOTS,
                ),
            };
            for (g, group) in block[block_bytes - 32..].chunks_exact(4).enumerate() {
                let group = u32::from_ne_bytes(group.try_into().expect("four bytes")) ^ offset;
                let at = at + step * slots[g];
                quants[at..at + 4].copy_from_slice(&group.to_ne_bytes());
            }
        }
    }
    true
}

/// Converts the `rows` activation rows of `n` elements in `x` to `format` (Q8_0 or Q8_1)
/// into `activations` and fills the tables a tile kernel reads (`d`, `s` and `quants`, as
/// [`block_scales`] and [`block_quants`] make them in `layout`): the same bytes and values
/// as [`quantize_activation`] on every row followed by those two, which is what runs except
/// where AVX-512 is available and `layout` is [`QuantLayout::Pairs`]: there one pass per
/// row does all three (8 rows of 1536: 3.3 us instead of 5.1; the decode batch's conversions
/// run while the other threads wait). Returns `false` (converting nothing) for other formats.
///
/// # Panics
/// When a length disagrees (as the three functions check them).
#[allow(clippy::too_many_arguments)]
pub fn tile_tables(
    format: ActivationFormat,
    x: &[f32],
    rows: usize,
    n: usize,
    activations: &mut [u8],
    d: &mut [f32],
    s: &mut [f32],
    quants: &mut [u8],
    layout: QuantLayout,
) -> bool {
    if !matches!(format, ActivationFormat::Q8_0 | ActivationFormat::Q8_1) {
        return false;
    }
    let row_bytes = activation_row_bytes(format, n);
    assert_eq!(x.len(), rows * n, "{rows} rows of {n} values");
    assert_eq!(activations.len(), rows * row_bytes, "activation rows");
    if tile_tables_begin(format, rows, n, d, s, quants, layout) {
        let tables = TablePointers {
            activations: activations.as_mut_ptr(),
            d: d.as_mut_ptr(),
            s: s.as_mut_ptr(),
            quants: quants.as_mut_ptr(),
            offsets: std::ptr::null_mut(),
        };
        for (t, x) in x.chunks_exact(n.max(1)).enumerate() {
            // SAFETY: `tile_tables_begin` just returned true for these tables (lengths
            // checked, AVX-512 detected); `activations` holds `rows` rows (asserted above);
            // the offsets are null; this thread alone holds the tables (borrowed mutably).
            unsafe { tile_tables_blocks(format, x, t, rows, n, 0..n / 32, &tables, layout) };
        }
        return true;
    }
    for (row, out) in x
        .chunks_exact(n.max(1))
        .zip(activations.chunks_mut(row_bytes.max(1)))
    {
        quantize_activation(format, row, out);
    }
    block_scales(format, activations, rows, n, d, s)
        && block_quants(format, activations, rows, n, quants, layout)
}

/// Where [`tile_tables_blocks`] writes: the starts of the activation rows and of the
/// tables (each as [`tile_tables`] takes it).
#[derive(Debug, Clone, Copy)]
pub struct TablePointers {
    pub activations: *mut u8,
    pub d: *mut f32,
    /// Unused for Q8_0.
    pub s: *mut f32,
    pub quants: *mut u8,
    /// The pair kernel's offsets (as [`block_offsets`] makes them from `d`), or null.
    pub offsets: *mut f32,
}

// SAFETY: plain addresses, written through only by `tile_tables_blocks`, whose contract
// keeps the threads that share them to disjoint blocks.
unsafe impl Send for TablePointers {}
// SAFETY: plain addresses, written through only by `tile_tables_blocks`, whose contract
// keeps the threads that share them to disjoint blocks.
unsafe impl Sync for TablePointers {}

/// True when [`tile_tables_blocks`] can fill these tables for `rows` rows of `n` elements
/// in `format` and `layout` (the one-pass AVX-512 conversion of [`tile_tables`]); then the
/// tables' padding is also written (the blocks' entries are left to
/// `tile_tables_blocks`). False, touching nothing, elsewhere.
///
/// # Panics
/// When a table's length disagrees.
pub fn tile_tables_begin(
    format: ActivationFormat,
    rows: usize,
    n: usize,
    d: &mut [f32],
    s: &mut [f32],
    quants: &mut [u8],
    layout: QuantLayout,
) -> bool {
    let with_sums = match format {
        ActivationFormat::Q8_0 => false,
        ActivationFormat::Q8_1 => true,
        _ => return false,
    };
    #[cfg(target_arch = "x86_64")]
    if layout == QuantLayout::Pairs && SimdLevel::Avx512.is_available() && n.is_multiple_of(32) {
        pad_scale_tables(n, rows, d, s, with_sums);
        assert_eq!(
            quants.len(),
            block_quants_len(n, rows),
            "quant table length"
        );
        let tail = quants.len() - 32;
        quants[tail..].fill(0);
        return true;
    }
    let _ = (rows, n, d, s, quants, layout, with_sums);
    false
}

/// [`tile_tables`] for blocks `blocks` of row `t` alone: `x` holds those blocks' values
/// (`32 * blocks.len()`), which go to row `t`'s activation blocks and their entries of the
/// tables, bit for bit as `tile_tables` writes them, and their offsets where
/// `tables.offsets` is not null (as [`block_offsets`] makes them). The threads of one
/// matmul may each convert the blocks of their own columns (or rows) at once. Returns
/// false where some block's `d` is not finite (the offsets must then not reach a kernel).
///
/// # Safety
/// [`tile_tables_begin`] returned true for these tables (`format`, `rows`, `n`, `layout`);
/// `tables.activations` holds `rows` activation rows of `n` elements; `tables.offsets`,
/// where not null, is as long as `d`; nothing else reads or writes these blocks' parts of
/// the activations and tables meanwhile.
#[allow(clippy::too_many_arguments)]
pub unsafe fn tile_tables_blocks(
    format: ActivationFormat,
    x: &[f32],
    t: usize,
    rows: usize,
    n: usize,
    blocks: std::ops::Range<usize>,
    tables: &TablePointers,
    layout: QuantLayout,
) -> bool {
    assert!(
        t < rows && blocks.end <= n / 32,
        "row {t} of {rows}, blocks {blocks:?}"
    );
    assert_eq!(x.len(), 32 * blocks.len(), "the blocks' values");
    #[cfg(target_arch = "x86_64")]
    {
        let prepared = x86::prepare::Tables {
            with_sums: format == ActivationFormat::Q8_1,
            rows,
            block_rows: layout.block_rows(rows),
            d: tables.d,
            s: tables.s,
            quants: tables.quants,
            offsets: tables.offsets,
        };
        let row = tables
            .activations
            .wrapping_add(t * activation_row_bytes(format, n));
        // SAFETY: the caller promises that `tile_tables_begin` returned true for these
        // tables, so `x86::has_avx512` detected AVX-512 F/BW/VL (the AVX2, FMA and F16C
        // that `row` is also compiled with are not checked there: every CPU with AVX-512 F
        // has them) and `d`, `s` and `quants` have the lengths of `rows` rows of `n`
        // elements; `t < rows` and `blocks` lie within the row (asserted above), and `row`
        // is row `t` of the `rows` activation rows the caller promises; the offsets' length
        // and the exclusive access of these blocks are the caller's promises too.
        unsafe { x86::prepare::row(x, t, blocks, row, &prepared) }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (format, t, rows, n, blocks, tables, layout);
        unreachable!("tile_tables_begin is false off x86-64")
    }
}

/// Values in each table of [`block_scales`] for `rows` rows of `n` elements.
pub fn block_scales_len(n: usize, rows: usize) -> usize {
    n / 32 * rows + BLOCK_SCALES_PADDING
}

/// Fills `d` (and `s` for Q8_1) with the block scales of the `rows` activation rows of `n`
/// elements in `activations` (format Q8_0 or Q8_1), laid out as [`BlockScales`] describes
/// with `stride == rows`; each table is [`block_scales_len`] long (`s` may be empty for
/// Q8_0). Returns `false` (and leaves the tables alone) for other formats.
///
/// # Panics
/// When a length disagrees.
pub fn block_scales(
    format: ActivationFormat,
    activations: &[u8],
    rows: usize,
    n: usize,
    d: &mut [f32],
    s: &mut [f32],
) -> bool {
    let (block_bytes, has_sum) = match format {
        ActivationFormat::Q8_0 => (34, false),
        ActivationFormat::Q8_1 => (36, true),
        _ => return false,
    };
    let row_bytes = activation_row_bytes(format, n);
    assert_eq!(
        activations.len(),
        rows * row_bytes,
        "{rows} activation rows of {n}"
    );
    pad_scale_tables(n, rows, d, s, has_sum);
    for (t, row) in activations.chunks_exact(row_bytes).enumerate() {
        for (i, block) in row.chunks_exact(block_bytes).enumerate() {
            d[i * rows + t] = half_of(block, 0);
            if has_sum {
                s[i * rows + t] = half_of(block, 2);
            }
        }
    }
    true
}

/// Checks the lengths of [`block_scales`]'s tables for `rows` rows of `n` elements (`s` only
/// `with_sums`) and zeroes their padding.
///
/// # Panics
/// When a length disagrees.
fn pad_scale_tables(n: usize, rows: usize, d: &mut [f32], s: &mut [f32], with_sums: bool) {
    let len = block_scales_len(n, rows);
    assert_eq!(d.len(), len, "scale table length");
    if with_sums {
        assert_eq!(s.len(), len, "sum table length");
        s[len - BLOCK_SCALES_PADDING..].fill(0.0);
    }
    d[len - BLOCK_SCALES_PADDING..].fill(0.0);
}

/// The f16 at byte `at` of `bytes`, widened.
fn half_of(bytes: &[u8], at: usize) -> f32 {
    widen_half(u16::from_le_bytes([bytes[at], bytes[at + 1]]))
}

/// f16 bits widened to f32, exactly as `half::f16::to_f32` (and F16C) widen them (NaNs
/// come out quiet), but inlined: the crate's runtime-dispatched conversion costs a call
/// per value, which made the scale tables of a decode batch a serial hot spot.
#[inline]
pub(crate) fn widen_half(bits: u16) -> f32 {
    let sign = u32::from(bits & 0x8000) << 16;
    let exponent = u32::from((bits >> 10) & 0x1f);
    let mantissa = u32::from(bits & 0x3ff);
    match exponent {
        0 => {
            // Zero or subnormal: mantissa * 2^-24, exact in f32.
            let magnitude = mantissa as f32 * f32::from_bits(0x3380_0000);
            if sign != 0 {
                -magnitude
            } else {
                magnitude
            }
        }
        31 if mantissa == 0 => f32::from_bits(sign | 0x7f80_0000),
        31 => f32::from_bits(sign | 0x7fc0_0000 | (mantissa << 13)),
        _ => f32::from_bits(sign | ((exponent + 112) << 23) | (mantissa << 13)),
    }
}

/// The gemv kernel for `weight` at `level` (or the best lower SIMD level that has one), or
/// `None` when there is none (callers loop over the [`DotFn`](super::DotFn)).
pub fn gemv_fn(weight: GgmlType, level: SimdLevel) -> Option<GemvFn> {
    for &candidate in level.fallback_chain() {
        if !candidate.is_available() {
            continue;
        }
        let kernel = match candidate {
            // The scalar twin only stands in for itself: at a SIMD level without a gemv
            // kernel the caller's loop over that level's `DotFn` is faster.
            SimdLevel::Scalar if level == SimdLevel::Scalar => legacy::gemv(weight),
            SimdLevel::Scalar => None,
            #[cfg(target_arch = "x86_64")]
            _ => x86::gemv(weight, candidate),
            #[cfg(not(target_arch = "x86_64"))]
            _ => None,
        };
        if kernel.is_some() {
            return kernel;
        }
    }
    None
}

/// The several-weight-rows tile kernel for `weight` at `level` (or the best lower SIMD level
/// that has one: AVX-512 VNNI's pair kernel, the AVX-VNNI and AVX2 block-major kernels), when
/// this CPU has it; `None` elsewhere (callers loop over [`tile_fn`]'s kernel).
pub fn tile_rows_fn(weight: GgmlType, level: SimdLevel) -> Option<TileRowsFn> {
    #[cfg(target_arch = "x86_64")]
    return first_in_chain(weight, level, x86::tile_rows);
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (weight, level);
        None
    }
}

/// The tile kernel for `weight` at `level` (or the best lower SIMD level that has one), or
/// `None` when there is none (callers use the [`MultiDotFn`](super::MultiDotFn)).
pub fn tile_fn(weight: GgmlType, level: SimdLevel) -> Option<TileFn> {
    for &candidate in level.fallback_chain() {
        if !candidate.is_available() {
            continue;
        }
        let kernel = match candidate {
            SimdLevel::Scalar if level == SimdLevel::Scalar => legacy::tile(weight),
            SimdLevel::Scalar => None,
            #[cfg(target_arch = "x86_64")]
            _ => x86::tile(weight, candidate),
            #[cfg(not(target_arch = "x86_64"))]
            _ => None,
        };
        if kernel.is_some() {
            return kernel;
        }
    }
    None
}

#[cfg(test)]
mod widen_tests {
    #[test]
    fn widen_half_equals_the_half_crate_for_every_value() {
        for bits in 0..=u16::MAX {
            let expected = half::f16::from_bits(bits).to_f32();
            assert_eq!(
                super::widen_half(bits).to_bits(),
                expected.to_bits(),
                "f16 bits {bits:#06x}"
            );
        }
    }
}
