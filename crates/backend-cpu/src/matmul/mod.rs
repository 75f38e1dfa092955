//! Quantized matrix multiplication `y[t][o] = sum_i W[o][i] * x[t][i]` on packed weights of
//! every type with a dot product (see `runit_quant::dot`).
//!
//! One call converts each activation row once into the weight type's activation format (in
//! parallel for many tokens), splits the output rows across the thread pool, and, for
//! several tokens, walks tiles of rows × tokens so that each weight block is unpacked once
//! for four activation rows while the tile's activations stay in cache. Results are bit
//! identical to [`matmul_scalar`], its single-threaded scalar twin, and therefore to
//! ggml-cpu's `vec_dot` arithmetic.
//!
//! ```
//! use runit_backend_cpu::matmul::{matmul, matmul_scalar, PackedWeight, Parallelism};
//! use runit_quant::dot::SimdLevel;
//! use runit_quant::{quantize, GgmlType};
//!
//! let (n_in, n_out, tokens) = (64, 3, 2);
//! let w: Vec<f32> = (0..n_in * n_out).map(|i| (i as f32 * 0.1).sin()).collect();
//! let mut bytes = vec![0u8; n_out * 2 * 34];
//! quantize(GgmlType::Q8_0, &w, &mut bytes).unwrap();
//! let weight = PackedWeight::new(GgmlType::Q8_0, &bytes, n_in, n_out);
//! let x: Vec<f32> = (0..n_in * tokens).map(|i| (i as f32 * 0.3).cos()).collect();
//! let (mut y, mut twin) = (vec![0.0; tokens * n_out], vec![0.0; tokens * n_out]);
//! matmul(&weight, &x, tokens, &mut y, &mut Vec::new(), &Parallelism::current_thread());
//! matmul_scalar(&weight, &x, tokens, &mut twin, SimdLevel::detect());
//! assert_eq!(y, twin);
//! ```

mod repacked;
mod team;
#[cfg(test)]
mod tests;
mod tinyblas;

use runit_quant::dot::{
    activation_format, activation_row_bytes, block_offsets, block_quants, block_quants_len,
    block_scales, block_scales_len, dot_fn, gemv_fn, multi_dot_fn, plain_tile_rows_fn,
    quantize_activation, tile_fn, tile_rows_fn, tile_tables, tile_tables_begin, tile_tables_blocks,
    twin_dot_fn, ActivationFormat, BlockScales, DotFn, MultiDotFn, PlainTileRowsFn, QuantLayout,
    SimdLevel, TablePointers, TileFn, TileOut, TileRowsFn, BLOCK_SCALES_PADDING,
};
use runit_quant::GgmlType;
use std::sync::atomic::{AtomicBool, Ordering};

/// Tokens whose activations one tile keeps hot (32 rows of Q8_0 at 1536 inputs: ~52 KB).
const TOKENS_PER_TILE: usize = 32;
/// Smallest number of weight rows one parallel task takes.
const MIN_ROWS_PER_TASK: usize = 16;
/// Tokens from which activation conversion runs in parallel. Below, the hand-off costs more
/// than it saves: eight SmolLM2 rows (a decode batch) took 6.0 us per matmul to convert
/// and tabulate in parallel and 4.9 us on the calling thread alone.
const PARALLEL_QUANTIZE_TOKENS: usize = 16;

/// A packed weight matrix: `n_out` rows of `n_in` elements of type `ty`, row after row.
#[derive(Debug, Clone, Copy)]
pub struct PackedWeight<'a> {
    /// Element type of the rows.
    pub ty: GgmlType,
    /// The rows, `n_out * ty.row_bytes(n_in)` bytes.
    pub bytes: &'a [u8],
    /// Elements per row (the input width).
    pub n_in: usize,
    /// Rows (the output width).
    pub n_out: usize,
    /// How llama.cpp's CPU backend would hold this weight, which decides the order of its
    /// dot products.
    pub layout: Layout,
}

/// Where ggml-cpu keeps a weight (see [`runit_backend::Weight::ggml_layout`]).
pub use runit_backend::GgmlLayout as Layout;

impl<'a> PackedWeight<'a> {
    /// A weight view; the shape is checked by [`matmul`].
    pub fn new(ty: GgmlType, bytes: &'a [u8], n_in: usize, n_out: usize) -> PackedWeight<'a> {
        PackedWeight {
            ty,
            bytes,
            n_in,
            n_out,
            layout: Layout::Plain,
        }
    }

    /// This view with another [`Layout`].
    pub fn with_layout(self, layout: Layout) -> PackedWeight<'a> {
        PackedWeight { layout, ..self }
    }

    /// Bytes of one row.
    fn row_bytes(&self) -> usize {
        self.ty
            .row_bytes(self.n_in as u64)
            .expect("checked by check_shapes") as usize
    }
}

/// Where and how a matmul runs: a thread pool (or the calling thread) and a SIMD level.
#[derive(Debug, Clone, Copy)]
pub struct Parallelism<'a> {
    /// Pool whose threads split the output rows; `None` runs on the calling thread.
    pub pool: Option<&'a rayon::ThreadPool>,
    /// Kernel level; falls back to the best available lower level per type.
    pub level: SimdLevel,
    /// Every activation row in the arithmetic it gets in a matmul of its own (`vec_dot` or
    /// gemv order; neither tinyBLAS nor the repacked gemm order, which ggml takes for
    /// several rows): speculative verification compares its rows with one-token steps.
    pub rows_alone: bool,
}

impl<'a> Parallelism<'a> {
    /// All threads of `pool`, best SIMD level of this CPU.
    pub fn pool(pool: &'a rayon::ThreadPool) -> Parallelism<'a> {
        Parallelism {
            pool: Some(pool),
            level: SimdLevel::detect(),
            rows_alone: false,
        }
    }

    /// The calling thread only, best SIMD level of this CPU.
    pub fn current_thread() -> Parallelism<'static> {
        Parallelism {
            pool: None,
            level: SimdLevel::detect(),
            rows_alone: false,
        }
    }

    fn threads(&self) -> usize {
        self.pool.map_or(1, |pool| pool.current_num_threads())
    }

    /// Runs `work(chunk)` for every `chunk < chunks`: on the calling thread and the
    /// matmul's spinning helpers (see `team`) when there are several threads.
    pub(crate) fn for_each_chunk(&self, chunks: usize, work: &(dyn Fn(usize) + Sync)) {
        let threads = self.threads();
        match (threads > 1)
            .then(|| team::Team::with_helpers(threads - 1))
            .flatten()
        {
            Some(team) => team.run(chunks, work),
            None => (0..chunks).for_each(work),
        }
    }
}

/// True when [`matmul`] handles weights of type `ty`.
pub fn supports(ty: GgmlType) -> bool {
    activation_format(ty).is_some()
}

/// Panics unless the shapes agree (the caller validated them; a mismatch is a bug).
fn check_shapes(weight: &PackedWeight, x: &[f32], tokens: usize, y: &[f32]) {
    let ty = weight.ty;
    assert!(supports(ty), "matmul has no kernel for {ty}");
    let row_bytes = ty
        .row_bytes(weight.n_in as u64)
        .unwrap_or_else(|| panic!("{ty} rows of {} elements are not whole blocks", weight.n_in));
    assert_eq!(
        weight.bytes.len() as u64,
        row_bytes * weight.n_out as u64,
        "{ty} weight of {} x {}: byte length",
        weight.n_out,
        weight.n_in
    );
    assert_eq!(
        x.len(),
        tokens * weight.n_in,
        "x is [tokens={tokens} x n_in={}]",
        weight.n_in
    );
    assert_eq!(
        y.len(),
        tokens * weight.n_out,
        "y is [tokens={tokens} x n_out={}]",
        weight.n_out
    );
}

/// `y[t][o] = sum_i W[o][i] * x[t][i]` for `t < tokens`; `x` is `[tokens, n_in]` and `y`
/// `[tokens, n_out]`, row-major. `scratch` holds the converted activations (and, for the
/// 32-element formats, their block scales widened to f32) between calls; it grows as
/// needed and is reused.
///
/// # Panics
/// When the type has no kernel or the lengths disagree with the shape.
pub fn matmul(
    weight: &PackedWeight,
    x: &[f32],
    tokens: usize,
    y: &mut [f32],
    scratch: &mut Vec<u8>,
    parallelism: &Parallelism,
) {
    check_shapes(weight, x, tokens, y);
    if tokens == 0 || weight.n_out == 0 {
        return;
    }
    if let Some(dot) = repacked::repack_kernel(weight) {
        repacked::matmul_repacked(weight, x, tokens, y, scratch, parallelism, dot);
        return;
    }
    // Prompt processing in llamafile's sgemm order where ggml-cpu takes it (tinyblas.rs).
    if let Some(kernel) = tinyblas::kernel_for(weight, tokens, parallelism) {
        tinyblas::matmul_tinyblas(weight, x, tokens, y, scratch, parallelism, kernel);
        return;
    }
    let targets = [Target::new(*weight, y)];
    run_plain(
        &targets,
        x,
        tokens,
        scratch,
        parallelism,
        Epilogue::None,
        1,
        None,
        None,
    );
}

/// One weight of [`matmul_fused`] and its output `y` (`[tokens, n_out]`).
pub(crate) struct Part<'p, 'a> {
    pub(crate) weight: PackedWeight<'a>,
    pub(crate) y: &'p mut [f32],
}

/// What [`matmul_fused`] does with a task's outputs once its products are written.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Epilogue {
    /// Nothing.
    None,
    /// The gate of parts `[gate, up]`: `gate = act(gate) * up`, in place, for the task's
    /// columns of every token (`vector::gated`, as the separate op computes it).
    Gated(runit_backend::Activation, crate::vector::Isa),
}

/// Several weights of one type and input width times the same activations, as if each went
/// through [`matmul`] (the same kernels, so the same bits), but with the activations
/// converted once and every part's output rows split among the threads in one dispatch.
/// With [`Epilogue::Gated`] the two parts' tasks own the same row ranges, and each task
/// applies the gate to its columns as soon as they are written.
///
/// Returns false, having done nothing, when the parts cannot share a dispatch: different
/// types or input widths, a weight that takes another path than the plain kernels
/// (repacked or tinyBLAS), or a SwiGLU whose parts differ in rows or whose rows are not
/// whole groups of the gate's SIMD width.
///
/// # Panics
/// As [`matmul`], for each part.
pub(crate) fn matmul_fused(
    parts: &mut [Part],
    x: &[f32],
    tokens: usize,
    scratch: &mut Vec<u8>,
    parallelism: &Parallelism,
    epilogue: Epilogue,
) -> bool {
    fused_into(parts, x, tokens, scratch, parallelism, epilogue, None)
}

/// [`matmul_fused`], whose SwiGLU tasks also convert their columns of the gate's output into
/// `prepare` (then each task takes whole 32-column blocks).
fn fused_into(
    parts: &mut [Part],
    x: &[f32],
    tokens: usize,
    scratch: &mut Vec<u8>,
    parallelism: &Parallelism,
    epilogue: Epilogue,
    prepare: Option<&Prepared>,
) -> bool {
    let Some(first) = parts.first().map(|part| part.weight) else {
        return true;
    };
    let shared = |weight: &PackedWeight| {
        weight.ty == first.ty && weight.n_in == first.n_in && plain(weight, tokens, parallelism)
    };
    if !parts.iter().all(|part| shared(&part.weight)) {
        return false;
    }
    let row_multiple = match epilogue {
        Epilogue::None => 1,
        Epilogue::Gated(..) => {
            let lanes = crate::vector::SILU_GROUP;
            if parts.len() != 2
                || parts[1].weight.n_out != first.n_out
                || !first.n_out.is_multiple_of(lanes)
            {
                return false;
            }
            if prepare.is_some() {
                32
            } else {
                lanes
            }
        }
    };
    for part in parts.iter() {
        check_shapes(&part.weight, x, tokens, part.y);
    }
    if tokens == 0 {
        return true;
    }
    let targets: Vec<Target> = parts
        .iter_mut()
        .map(|part| Target::new(part.weight, part.y))
        .collect();
    run_plain(
        &targets,
        x,
        tokens,
        scratch,
        parallelism,
        epilogue,
        row_multiple,
        None,
        prepare,
    );
    true
}

/// The SwiGLU FFN `y = down · (silu(gate · x) * (up · x))`: [`matmul_fused`] of `parts`
/// (`[gate, up]`) with the SwiGLU epilogue, then [`matmul`] of `down` over the gate's
/// output (the same kernels, so the same bits). For a decode batch, each task of the first
/// dispatch also converts its columns of the SwiGLU's output for the tile kernels of
/// `down` ([`Prepared`]) while they are in its cache: done on the calling thread after the
/// dispatch, that conversion read half of the rows from the other threads' caches and took
/// about 16 us per layer for eight rows of SmolLM2's 1536, with every other thread waiting.
/// `tables` holds those tables.
///
/// Returns false, having done nothing, where [`matmul_fused`] would for `parts`.
///
/// # Panics
/// As [`matmul`], for each weight.
#[allow(clippy::too_many_arguments)]
pub(crate) fn matmul_gated_down(
    parts: &mut [Part; 2],
    down: &PackedWeight,
    y: &mut [f32],
    x: &[f32],
    tokens: usize,
    scratch: &mut Vec<u8>,
    tables: &mut Vec<u8>,
    parallelism: &Parallelism,
    activation: runit_backend::Activation,
    isa: crate::vector::Isa,
) -> bool {
    let n = parts[0].weight.n_out;
    check_shapes(down, parts[0].y, tokens, y);
    // Tasks of whole blocks of the SwiGLU's columns.
    let prepared = Prepared::begin(down, tokens, tables, parallelism)
        .filter(|_| 32 % crate::vector::SILU_GROUP == 0 && n.is_multiple_of(32));
    if !fused_into(
        parts,
        x,
        tokens,
        scratch,
        parallelism,
        Epilogue::Gated(activation, isa),
        prepared.as_ref(),
    ) {
        return false;
    }
    let hidden = &*parts[0].y;
    match prepared {
        Some(prepared) => prepared.matmul(down, hidden, tokens, y, scratch, parallelism),
        None => matmul(down, hidden, tokens, y, scratch, parallelism),
    }
    true
}

/// True when `weight` takes the plain kernels for `tokens` rows (neither ggml's repacked
/// order nor tinyBLAS's).
fn plain(weight: &PackedWeight, tokens: usize, parallelism: &Parallelism) -> bool {
    repacked::repack_kernel(weight).is_none()
        && tinyblas::kernel_for(weight, tokens, parallelism).is_none()
}

/// A decode batch's activations converted for the tile kernels of one weight by the op
/// that makes them, piece by piece as its tasks finish them (rows or columns), while they
/// are in the task's cache: the rows' blocks and the tables, as [`tile_tables`] makes them
/// (the same bytes), then [`Prepared::matmul`] without a conversion of its own. Where the
/// matmul would convert on the calling thread alone, this moves that work (and its reads
/// of rows from other threads' caches) into the producing op's parallel tasks.
pub(crate) struct Prepared<'t> {
    format: ActivationFormat,
    layout: QuantLayout,
    /// Elements per row.
    n: usize,
    rows: usize,
    carved: Carved<'t>,
    pointers: TablePointers,
    /// False once a piece met a scale that is not finite (then the offsets are left out).
    finite: AtomicBool,
}

impl<'t> Prepared<'t> {
    /// Tables in `scratch` for `tokens` rows of input to `weight`, where its matmul would
    /// convert them for the tile kernels on the calling thread (a decode batch of the plain
    /// 32-element kernels, with AVX-512's one-pass conversion); `None` elsewhere.
    pub(crate) fn begin(
        weight: &PackedWeight,
        tokens: usize,
        scratch: &'t mut Vec<u8>,
        parallelism: &Parallelism,
    ) -> Option<Prepared<'t>> {
        let format = activation_format(weight.ty)?;
        let layout = QuantLayout::for_level(parallelism.level);
        let n = weight.n_in;
        if !(2..PARALLEL_QUANTIZE_TOKENS).contains(&tokens)
            || !plain(weight, tokens, parallelism)
            || tile_fn(weight.ty, parallelism.level).is_none()
        {
            return None;
        }
        let carved = carve(scratch, format, n, tokens, true);
        if !tile_tables_begin(format, tokens, n, carved.d, carved.s, carved.quants, layout) {
            return None;
        }
        // The padding's offsets (the blocks' come with their pieces).
        let padding = carved.d.len() - BLOCK_SCALES_PADDING;
        block_offsets(&carved.d[padding..], &mut carved.offsets[padding..]);
        let pointers = TablePointers {
            activations: carved.activations.as_mut_ptr(),
            d: carved.d.as_mut_ptr(),
            s: carved.s.as_mut_ptr(),
            quants: carved.quants.as_mut_ptr(),
            offsets: carved.offsets.as_mut_ptr(),
        };
        Some(Prepared {
            format,
            layout,
            n,
            rows: tokens,
            carved,
            pointers,
            finite: AtomicBool::new(true),
        })
    }

    /// Converts blocks `blocks` of row `t`, whose values are `x`.
    ///
    /// # Safety
    /// No other thread converts these blocks of row `t` meanwhile.
    unsafe fn convert(&self, t: usize, blocks: std::ops::Range<usize>, x: &[f32]) {
        // SAFETY: `begin` returned this value only where `tile_tables_begin` returned true
        // for these tables, rows, format and layout; `carve` gave `activations` room for
        // `rows` rows and the offsets `d`'s length; the caller promises that no other
        // thread converts these blocks of row `t` meanwhile, and nothing reads the tables
        // before `matmul` takes `self`.
        let finite = unsafe {
            tile_tables_blocks(
                self.format,
                x,
                t,
                self.rows,
                self.n,
                blocks,
                &self.pointers,
                self.layout,
            )
        };
        if !finite {
            self.finite.store(false, Ordering::Relaxed);
        }
    }

    /// Converts row `t` (`x`, all of its `n` values).
    ///
    /// # Safety
    /// No other thread converts row `t` meanwhile.
    pub(crate) unsafe fn convert_row(&self, t: usize, x: &[f32]) {
        // SAFETY: the caller promises that no other thread converts row `t` meanwhile, so
        // none converts any of its blocks.
        unsafe { self.convert(t, 0..self.n / 32, x) }
    }

    /// Converts columns `columns` (whole blocks) of every row of `y` (`[rows, n]`).
    ///
    /// # Safety
    /// Those columns of `y` are written, and these blocks converted, by no other thread
    /// meanwhile.
    unsafe fn convert_columns(&self, y: &SharedOutput, columns: std::ops::Range<usize>) {
        let blocks = columns.start / 32..columns.end / 32;
        debug_assert_eq!(32 * blocks.len(), columns.len());
        for t in 0..self.rows {
            // SAFETY: `y` is the `[rows, n]` input of this weight (`matmul_gated_down`
            // checked it) and `columns` lies within `0..n`, so the slice is inside it; the
            // caller promises that no other thread writes these columns meanwhile.
            let x = unsafe {
                std::slice::from_raw_parts(y.at(t * self.n + columns.start), columns.len())
            };
            // SAFETY: the caller promises that no other thread converts these blocks.
            unsafe { self.convert(t, blocks.clone(), x) };
        }
    }

    /// [`matmul`] of `weight` (the one `begin` took) over `x`, whose every row has been
    /// converted into these tables (which are not checked against it).
    pub(crate) fn matmul(
        self,
        weight: &PackedWeight,
        x: &[f32],
        tokens: usize,
        y: &mut [f32],
        scratch: &mut Vec<u8>,
        parallelism: &Parallelism,
    ) {
        check_shapes(weight, x, tokens, y);
        assert_eq!(
            (weight.n_in, tokens),
            (self.n, self.rows),
            "the prepared tables' shape"
        );
        let finite = self.finite.load(Ordering::Relaxed);
        let Carved {
            activations,
            quants,
            d,
            s,
            offsets,
        } = self.carved;
        let converted = Converted {
            activations,
            quants,
            d,
            s,
            offsets: if finite { offsets } else { &[] },
        };
        run_plain(
            &[Target::new(*weight, y)],
            x,
            tokens,
            scratch,
            parallelism,
            Epilogue::None,
            1,
            Some(converted),
            None,
        );
    }
}

/// Activations converted for the plain kernels: the rows in the weight type's activation
/// format and, for the tile kernels, their tables (empty otherwise).
#[derive(Clone, Copy)]
struct Converted<'a> {
    activations: &'a [u8],
    quants: &'a [u8],
    d: &'a [f32],
    s: &'a [f32],
    /// The pair kernel's offsets; empty where some `d` is not finite (see `block_offsets`).
    offsets: &'a [f32],
}

/// A scratch's parts for converted activations (see [`Converted`]).
struct Carved<'a> {
    activations: &'a mut [u8],
    quants: &'a mut [u8],
    d: &'a mut [f32],
    s: &'a mut [f32],
    offsets: &'a mut [f32],
}

/// `scratch` (grown as needed) cut into the parts that `tokens` rows of `n` elements
/// converted to `format` take, with the tile kernels' tables when `tables` (else those
/// are empty): `[activations | alignment | block-major quants | alignment | d table | s
/// table | offset table]`. The quants start on a cache line, so that no block's (or
/// pair's) load straddles two.
fn carve(
    scratch: &mut Vec<u8>,
    format: ActivationFormat,
    n: usize,
    tokens: usize,
    tables: bool,
) -> Carved<'_> {
    let quant_len = tokens * activation_row_bytes(format, n);
    let (table_len, block_quants_bytes) = if tables {
        (block_scales_len(n, tokens), block_quants_len(n, tokens))
    } else {
        (0, 0)
    };
    let scratch = grown(
        scratch,
        quant_len + 64 + block_quants_bytes + 4 + 3 * 4 * table_len,
    );
    let (activations, rest) = scratch.split_at_mut(quant_len);
    let skip = rest.as_ptr().align_offset(64);
    let rest = &mut rest[skip..];
    let (quants, tables) = rest.split_at_mut(block_quants_bytes);
    let skip = tables.as_ptr().align_offset(std::mem::align_of::<f32>());
    let tables: &mut [f32] = bytemuck::cast_slice_mut(&mut tables[skip..skip + 3 * 4 * table_len]);
    let (d, rest) = tables.split_at_mut(table_len);
    let (s, offsets) = rest.split_at_mut(table_len);
    Carved {
        activations,
        quants,
        d,
        s,
        offsets,
    }
}

/// `tokens` rows of `x` (`n` elements each) converted to `format` in `scratch`, with the
/// tile kernels' tables in `layout` when `tables`: a decode batch's rows and tables in one
/// pass on this thread (see `tile_tables`), many rows in parallel.
#[allow(clippy::too_many_arguments)]
fn convert<'s>(
    format: ActivationFormat,
    x: &[f32],
    tokens: usize,
    n: usize,
    tables: bool,
    layout: QuantLayout,
    scratch: &'s mut Vec<u8>,
    parallelism: &Parallelism,
) -> Converted<'s> {
    let activation_bytes = activation_row_bytes(format, n);
    let Carved {
        activations,
        quants,
        d,
        s,
        offsets,
    } = carve(scratch, format, n, tokens, tables);
    let parallel = tokens >= PARALLEL_QUANTIZE_TOKENS && parallelism.threads() > 1;
    let tabled =
        tables && !parallel && tile_tables(format, x, tokens, n, activations, d, s, quants, layout);
    if parallel {
        let shared = SharedBytes(activations.as_mut_ptr());
        let convert = |t: usize| {
            // SAFETY: chunk `t` alone writes activation row `t`, which lies inside
            // `activations` (`tokens` rows, `t < tokens`); `activations` outlives the dispatch.
            let out = unsafe {
                std::slice::from_raw_parts_mut(shared.at(t * activation_bytes), activation_bytes)
            };
            quantize_activation(format, &x[t * n..(t + 1) * n], out);
        };
        parallelism.for_each_chunk(tokens, &convert);
    } else if !tabled {
        x.chunks(n)
            .zip(activations.chunks_mut(activation_bytes))
            .for_each(|(row, out)| quantize_activation(format, row, out));
    }
    let activations = &*activations;
    if !tables {
        return Converted {
            activations,
            quants: &[],
            d: &[],
            s: &[],
            offsets: &[],
        };
    }
    let filled = tabled
        || (block_scales(format, activations, tokens, n, d, s)
            && block_quants(format, activations, tokens, n, quants, layout));
    assert!(
        filled,
        "tile kernels exist only for formats with block scales"
    );
    // The pair kernel's offsets (its exact products; the kernels that do without ignore
    // them).
    let finite = block_offsets(d, offsets);
    Converted {
        activations,
        quants: &*quants,
        d: &*d,
        s: &*s,
        offsets: if finite { &*offsets } else { &[] },
    }
}

/// A part of a plain-kernel matmul: its weight and where its outputs go.
struct Target<'a> {
    weight: PackedWeight<'a>,
    y: SharedOutput,
}

impl<'a> Target<'a> {
    fn new(weight: PackedWeight<'a>, y: &mut [f32]) -> Target<'a> {
        Target {
            weight,
            y: SharedOutput(y.as_mut_ptr()),
        }
    }
}

/// Where the tasks of `rows` output rows split them, on `threads` threads: the boundaries
/// (`0` first, `rows` last) of ever smaller tasks (guided self-scheduling), each about
/// `1 / threads` of the rows still left, a multiple of `multiple` rows and at least
/// [`MIN_ROWS_PER_TASK`]. The threads claim tasks in order, so the big ones go first and
/// the last ones to finish are small: a thread that finishes early waits for at most a
/// small task, where equal tasks of a sixteenth each left it waiting for half of one on
/// average (the decode step's matmuls are a few tens of microseconds each). Few tasks
/// matter as much: each one's first weights come from the last-level cache or memory
/// with nothing prefetched (about 1.5 us each here), so halving the tasks of a decode step
/// (tasks of `1 / (2 * threads)`, at least 8 rows, before) took its batch of eight from
/// 631-674 to 659-696 tok/s and one request from 260-267 to 284-293. Which rows share a
/// task never changes a result.
fn task_bounds(rows: usize, threads: usize, multiple: usize) -> Vec<usize> {
    let mut bounds = vec![0];
    if threads <= 1 {
        bounds.push(rows);
        return bounds;
    }
    let mut start = 0;
    while start < rows {
        let left = rows - start;
        let size = left
            .div_ceil(threads)
            .max(MIN_ROWS_PER_TASK)
            .next_multiple_of(multiple)
            .min(left);
        start += size;
        bounds.push(start);
    }
    bounds
}

/// The vec_dot-ordered kernels of one activation format (the same for every target).
#[derive(Clone, Copy)]
struct RowKernels<'a> {
    /// One token: the several-rows matvec, else one dot per row.
    gemv: Option<runit_quant::dot::GemvFn>,
    dot: DotFn,
    /// Several tokens.
    tile: TileKernel<'a>,
}

/// The plain-kernel matmul of `targets` (one type and input width, at least one token and
/// one row each): the activations converted once (or, for the tile kernels, taken as
/// `converted` where an earlier op's tasks made them), then every target's tasks in one
/// dispatch ([`task_bounds`] over the targets' rows one after the other; with the SwiGLU
/// epilogue, over the gate's rows, each task a multiple of `row_multiple` of them, taking
/// the same rows of both parts, and converting its columns of the gate's output into
/// `prepare` where given).
#[allow(clippy::too_many_arguments)]
fn run_plain(
    targets: &[Target],
    x: &[f32],
    tokens: usize,
    scratch: &mut Vec<u8>,
    parallelism: &Parallelism,
    epilogue: Epilogue,
    row_multiple: usize,
    converted: Option<Converted>,
    prepare: Option<&Prepared>,
) {
    let weight = &targets[0].weight;
    let format = activation_format(weight.ty).expect("checked by check_shapes");
    let activation_bytes = activation_row_bytes(format, weight.n_in);
    let tile = if tokens > 1 {
        tile_fn(weight.ty, parallelism.level)
    } else {
        None
    };
    let layout = QuantLayout::for_level(parallelism.level);
    let tables = match (converted, tile) {
        (Some(converted), Some(_)) => converted,
        _ => convert(
            format,
            x,
            tokens,
            weight.n_in,
            tile.is_some(),
            layout,
            scratch,
            parallelism,
        ),
    };
    let activations = tables.activations;
    let tile = match tile {
        Some(tile) => TileKernel::Scaled(
            tile,
            tile_rows_fn(weight.ty, parallelism.level),
            BlockScales {
                d: tables.d,
                s: if format == ActivationFormat::Q8_1 {
                    tables.s
                } else {
                    &[]
                },
                quants: tables.quants,
                stride: tokens,
                layout,
                offsets: tables.offsets,
            },
        ),
        None => TileKernel::Multi(
            multi_dot_fn(weight.ty, parallelism.level).expect("checked by check_shapes"),
            plain_tile_rows_fn(weight.ty, parallelism.level),
        ),
    };
    let kernels = RowKernels {
        gemv: gemv_fn(weight.ty, parallelism.level),
        dot: dot_fn(weight.ty, parallelism.level).expect("checked by check_shapes"),
        tile,
    };
    let rows_of = |target: &Target, rows: std::ops::Range<usize>| {
        // SAFETY: every task owns a distinct row range of its target, so it alone writes
        // those outputs of every token; the outputs outlive the dispatch.
        unsafe { run_rows(target, rows, activations, activation_bytes, tokens, kernels) }
    };
    match epilogue {
        Epilogue::None => {
            let total = targets.iter().map(|target| target.weight.n_out).sum();
            let bounds = task_bounds(total, parallelism.threads(), row_multiple);
            let task = |chunk: usize| {
                // The task's rows of the targets' rows one after the other.
                let (start, end) = (bounds[chunk], bounds[chunk + 1]);
                let mut first = 0;
                for target in targets {
                    let rows = start.max(first)..end.min(first + target.weight.n_out);
                    if !rows.is_empty() {
                        rows_of(target, rows.start - first..rows.end - first);
                    }
                    first += target.weight.n_out;
                }
            };
            parallelism.for_each_chunk(bounds.len() - 1, &task);
        }
        Epilogue::Gated(activation, isa) => {
            let [gate, up] = targets else {
                unreachable!("matmul_fused checked the SwiGLU's two parts")
            };
            let n_out = gate.weight.n_out;
            let bounds = task_bounds(n_out, parallelism.threads(), row_multiple);
            let task = |chunk: usize| {
                let rows = bounds[chunk]..bounds[chunk + 1];
                rows_of(gate, rows.clone());
                rows_of(up, rows.clone());
                for t in 0..tokens {
                    let at = t * n_out + rows.start;
                    // SAFETY: this task's columns of token `t`, written just above by this
                    // task alone (both parts split their rows alike).
                    let (g, u) = unsafe {
                        (
                            std::slice::from_raw_parts_mut(gate.y.at(at), rows.len()),
                            std::slice::from_raw_parts(up.y.at(at), rows.len()),
                        )
                    };
                    crate::vector::gated(isa, activation, g, u);
                }
                if let Some(prepared) = prepare {
                    // SAFETY: this task's columns (whole blocks: `row_multiple` is 32),
                    // written just above by this task alone.
                    unsafe { prepared.convert_columns(&gate.y, rows) };
                }
            };
            parallelism.for_each_chunk(bounds.len() - 1, &task);
        }
    }
}

/// Outputs `rows` of `target` for every token.
///
/// # Safety
/// No other thread may write those outputs meanwhile.
unsafe fn run_rows(
    target: &Target,
    rows: std::ops::Range<usize>,
    activations: &[u8],
    activation_bytes: usize,
    tokens: usize,
    kernels: RowKernels,
) {
    let weight = &target.weight;
    let row_bytes = weight.row_bytes();
    if tokens == 1 {
        let bytes = &weight.bytes[rows.start * row_bytes..rows.end * row_bytes];
        // SAFETY: `target.y` holds the one token's `n_out` outputs (`check_shapes`) and
        // `rows` lies within them; the caller promises that no other thread writes them.
        let out = unsafe { std::slice::from_raw_parts_mut(target.y.at(rows.start), rows.len()) };
        match kernels.gemv {
            Some(gemv) => gemv(weight.n_in, bytes, activations, out),
            None => {
                for (value, row) in out.iter_mut().zip(bytes.chunks_exact(row_bytes)) {
                    *value = (kernels.dot)(weight.n_in, row, activations);
                }
            }
        }
        return;
    }
    // SAFETY: `tile_rows`'s contract is this function's: the caller promises that no
    // other thread writes columns `rows` of any token meanwhile.
    unsafe {
        tile_rows(
            weight,
            row_bytes,
            rows,
            activations,
            activation_bytes,
            tokens,
            kernels.tile,
            &target.y,
        )
    };
}

/// The first `len` bytes of `scratch`, grown if shorter. It never shrinks: matmuls of
/// several sizes take turns with one scratch, and regrowing it zeroes the new part.
fn grown(scratch: &mut Vec<u8>, len: usize) -> &mut [u8] {
    if scratch.len() < len {
        scratch.resize(len, 0);
    }
    &mut scratch[..len]
}

/// The kernel a tile of tokens goes through.
#[derive(Clone, Copy)]
enum TileKernel<'a> {
    /// A 32-element format, with the activations' f32 scale tables (and, where the CPU has
    /// it, the kernel that takes all of a task's weight rows in one call).
    Scaled(TileFn, Option<TileRowsFn>, BlockScales<'a>),
    /// Any other type (and, where the CPU has it, the kernel that takes all of a task's
    /// weight rows in one call).
    Multi(MultiDotFn, Option<PlainTileRowsFn>),
}

/// `y` shared between tasks that write disjoint parts of it.
struct SharedOutput(*mut f32);
// SAFETY: the pointer is only used through `at`, and each task writes only its own outputs
// through it (rows of `y` for one token, columns for several); `y` outlives the dispatch.
unsafe impl Sync for SharedOutput {}

/// The activation scratch shared between tasks that convert disjoint rows.
struct SharedBytes(*mut u8);
// SAFETY: the pointer is only used through `at`, and each task writes only its own
// activation row (or prepared unit) through it; the scratch outlives the dispatch.
unsafe impl Sync for SharedBytes {}

impl SharedOutput {
    /// The value `offset` elements in (a method, so closures capture the whole wrapper).
    ///
    /// # Safety
    /// `offset` lies inside `y`.
    unsafe fn at(&self, offset: usize) -> *mut f32 {
        // SAFETY: the caller keeps `offset` inside `y`.
        unsafe { self.0.add(offset) }
    }
}

impl SharedBytes {
    /// The byte `offset` bytes in.
    ///
    /// # Safety
    /// `offset` lies inside the scratch.
    unsafe fn at(&self, offset: usize) -> *mut u8 {
        // SAFETY: the caller keeps `offset` inside the scratch.
        unsafe { self.0.add(offset) }
    }
}

/// Output columns `rows` for every token, tile by tile: for each block of tokens, each
/// weight row meets all of the block's activation rows through the multi-row kernel.
///
/// # Safety
/// No other thread may write columns `rows` of `y` (`[tokens, n_out]`) meanwhile.
#[allow(clippy::too_many_arguments)]
unsafe fn tile_rows(
    weight: &PackedWeight,
    row_bytes: usize,
    rows: std::ops::Range<usize>,
    activations: &[u8],
    activation_bytes: usize,
    tokens: usize,
    kernel: TileKernel,
    y: &SharedOutput,
) {
    let mut dots = [0.0f32; TOKENS_PER_TILE];
    for first_token in (0..tokens).step_by(TOKENS_PER_TILE) {
        let count = TOKENS_PER_TILE.min(tokens - first_token);
        let block =
            &activations[first_token * activation_bytes..(first_token + count) * activation_bytes];
        let weights = || &weight.bytes[rows.start * row_bytes..rows.end * row_bytes];
        // SAFETY: columns `rows` of tokens `first_token .. first_token + count` lie inside
        // `y` (`[tokens, n_out]`) and belong to this task alone (the function's contract);
        // `rows.len() <= n_out`.
        let out = || unsafe {
            TileOut::from_raw(
                y.at(first_token * weight.n_out + rows.start),
                count,
                rows.len(),
                weight.n_out,
            )
        };
        if let TileKernel::Multi(_, Some(tile_rows)) = kernel {
            // Every weight row of the task in one call, written in place.
            tile_rows(weight.n_in, weights(), block, out());
            continue;
        }
        if let TileKernel::Scaled(_, Some(tile_rows), scales) = kernel {
            // Every weight row of the task in one call, written in place.
            if tile_rows(
                weight.n_in,
                weights(),
                block,
                scales.from_row(first_token),
                out(),
            ) {
                continue;
            }
        }
        for o in rows.clone() {
            let row = &weight.bytes[o * row_bytes..(o + 1) * row_bytes];
            match kernel {
                TileKernel::Scaled(tile, _, scales) => tile(
                    weight.n_in,
                    row,
                    block,
                    scales.from_row(first_token),
                    &mut dots[..count],
                ),
                TileKernel::Multi(multi, _) => multi(weight.n_in, row, block, &mut dots[..count]),
            }
            for (t, value) in dots[..count].iter().enumerate() {
                // SAFETY: (first_token + t) < tokens and o < n_out, inside `y`; column `o`
                // belongs to this task (see the function's contract).
                unsafe { *y.at((first_token + t) * weight.n_out + o) = *value };
            }
        }
    }
}

/// The scalar twin of [`matmul`] at `level`: one thread, scalar kernels, one dot product per
/// output. Bit-identical to `matmul` at that level (the levels differ only where their
/// arithmetic does: F16's one-row sums, `runit_quant::dot::HalfSums`).
///
/// # Panics
/// As [`matmul`].
pub fn matmul_scalar(
    weight: &PackedWeight,
    x: &[f32],
    tokens: usize,
    y: &mut [f32],
    level: SimdLevel,
) {
    check_shapes(weight, x, tokens, y);
    let serial = Parallelism {
        pool: None,
        level: SimdLevel::Scalar,
        rows_alone: false,
    };
    // llamafile's sgemm order, as in `matmul` (tinyblas.rs).
    if let Some(kernel) = tinyblas::kernel_for(weight, tokens, &serial) {
        tinyblas::matmul_tinyblas(weight, x, tokens, y, &mut Vec::new(), &serial, kernel);
        return;
    }
    let format = activation_format(weight.ty).expect("checked by check_shapes");
    let activation_bytes = activation_row_bytes(format, weight.n_in);
    let vec_dot: DotFn = twin_dot_fn(weight.ty, level).expect("checked by check_shapes");
    let repack = repacked::repack_kernel(weight);
    let row_bytes = weight.row_bytes();
    let mut activation = vec![0u8; activation_bytes];
    for t in 0..tokens {
        quantize_activation(
            format,
            &x[t * weight.n_in..(t + 1) * weight.n_in],
            &mut activation,
        );
        let dot = match repack {
            Some((_, gemm)) if t < repacked::gemm_rows(weight, tokens, &serial) => gemm,
            Some((gemv, _)) => gemv,
            None => vec_dot,
        };
        for o in 0..weight.n_out {
            let row = &weight.bytes[o * row_bytes..(o + 1) * row_bytes];
            y[t * weight.n_out + o] = dot(weight.n_in, row, &activation);
        }
    }
}
