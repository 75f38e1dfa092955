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
//! matmul_scalar(&weight, &x, tokens, &mut twin);
//! assert_eq!(y, twin);
//! ```

mod repacked;
mod team;
#[cfg(test)]
mod tests;
mod tinyblas;

use runit_quant::dot::{
    activation_format, activation_row_bytes, block_quants, block_quants_len, block_scales,
    block_scales_len, dot_fn, gemv_fn, multi_dot_fn, quantize_activation, tile_fn, tile_rows_fn,
    ActivationFormat, BlockScales, DotFn, MultiDotFn, SimdLevel, TileFn, TileRowsFn,
};
use runit_quant::GgmlType;

/// Tokens whose activations one tile keeps hot (32 rows of Q8_0 at 1536 inputs: ~52 KB).
const TOKENS_PER_TILE: usize = 32;
/// Smallest number of weight rows one parallel task takes.
const MIN_ROWS_PER_TASK: usize = 8;
/// Tokens from which activation conversion runs in parallel.
const PARALLEL_QUANTIZE_TOKENS: usize = 8;

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

/// Where ggml-cpu keeps a weight (see `runit_quant::dot::is_repacked`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Layout {
    /// A plain buffer: `vec_dot` (or tinyBLAS) order.
    #[default]
    Plain,
    /// The REPACK buffer, as a 2-D matrix (MUL_MAT: gemm order for groups of four
    /// activation rows, gemv order for the rest).
    Repacked,
    /// The REPACK buffer, as one expert of a 3-D tensor (MUL_MAT_ID: gemv order for every
    /// activation row).
    RepackedExpert,
}

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
}

impl<'a> Parallelism<'a> {
    /// All threads of `pool`, best SIMD level of this CPU.
    pub fn pool(pool: &'a rayon::ThreadPool) -> Parallelism<'a> {
        Parallelism {
            pool: Some(pool),
            level: SimdLevel::detect(),
        }
    }

    /// The calling thread only, best SIMD level of this CPU.
    pub fn current_thread() -> Parallelism<'static> {
        Parallelism {
            pool: None,
            level: SimdLevel::detect(),
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
    if let Some(kernel) = tinyblas::kernel_for(weight, tokens, parallelism.level) {
        tinyblas::matmul_tinyblas(weight, x, tokens, y, scratch, parallelism, kernel);
        return;
    }
    let format = activation_format(weight.ty).expect("checked by check_shapes");
    let activation_bytes = activation_row_bytes(format, weight.n_in);
    let tile = if tokens > 1 {
        tile_fn(weight.ty, parallelism.level)
    } else {
        None
    };
    let quant_len = tokens * activation_bytes;
    let table_len = if tile.is_some() {
        block_scales_len(weight.n_in, tokens)
    } else {
        0
    };
    let block_quants_bytes = if tile.is_some() {
        block_quants_len(weight.n_in, tokens)
    } else {
        0
    };
    // [activations | block-major quants | alignment | d table | s table]
    let scratch = grown(
        scratch,
        quant_len + block_quants_bytes + 4 + 2 * 4 * table_len,
    );
    let (activations, rest) = scratch.split_at_mut(quant_len);
    let (quants, tables) = rest.split_at_mut(block_quants_bytes);
    if tokens >= PARALLEL_QUANTIZE_TOKENS && parallelism.threads() > 1 {
        let shared = SharedBytes(activations.as_mut_ptr());
        let convert = |t: usize| {
            // SAFETY: chunk `t` writes only activation row `t`, inside `activations`.
            let out = unsafe {
                std::slice::from_raw_parts_mut(shared.at(t * activation_bytes), activation_bytes)
            };
            quantize_activation(format, &x[t * weight.n_in..(t + 1) * weight.n_in], out);
        };
        parallelism.for_each_chunk(tokens, &convert);
    } else {
        x.chunks(weight.n_in)
            .zip(activations.chunks_mut(activation_bytes))
            .for_each(|(row, out)| quantize_activation(format, row, out));
    }
    let activations = &*activations;
    let skip = tables.as_ptr().align_offset(std::mem::align_of::<f32>());
    let tables: &mut [f32] = bytemuck::cast_slice_mut(&mut tables[skip..skip + 2 * 4 * table_len]);
    let (d, s) = tables.split_at_mut(table_len);
    let kernel = match tile {
        Some(tile) => {
            let filled = block_scales(format, activations, tokens, weight.n_in, d, s)
                && block_quants(format, activations, tokens, weight.n_in, quants);
            assert!(
                filled,
                "tile kernels exist only for formats with block scales"
            );
            let s: &[f32] = if format == ActivationFormat::Q8_1 {
                s
            } else {
                &[]
            };
            TileKernel::Scaled(
                tile,
                tile_rows_fn(weight.ty, parallelism.level),
                BlockScales {
                    d,
                    s,
                    quants,
                    stride: tokens,
                },
            )
        }
        None => TileKernel::Multi(
            multi_dot_fn(weight.ty, parallelism.level).expect("checked by check_shapes"),
        ),
    };
    let row_bytes = weight.row_bytes();
    let rows_per_task = (weight.n_out / (parallelism.threads() * 8))
        .max(MIN_ROWS_PER_TASK)
        .min(weight.n_out);
    let chunks = weight.n_out.div_ceil(rows_per_task);
    let output = SharedOutput(y.as_mut_ptr());
    if tokens == 1 {
        let gemv = gemv_fn(weight.ty, parallelism.level);
        let dot = dot_fn(weight.ty, parallelism.level).expect("checked by check_shapes");
        let task = |chunk: usize| {
            let first = chunk * rows_per_task;
            let count = rows_per_task.min(weight.n_out - first);
            let rows = &weight.bytes[first * row_bytes..(first + count) * row_bytes];
            // SAFETY: chunk `chunk` alone writes outputs first..first + count (< n_out).
            let out = unsafe { std::slice::from_raw_parts_mut(output.at(first), count) };
            match gemv {
                Some(gemv) => gemv(weight.n_in, rows, activations, out),
                None => {
                    for (value, row) in out.iter_mut().zip(rows.chunks_exact(row_bytes)) {
                        *value = dot(weight.n_in, row, activations);
                    }
                }
            }
        };
        parallelism.for_each_chunk(chunks, &task);
        return;
    }
    let task = |chunk: usize| {
        let first = chunk * rows_per_task;
        let rows = first..(first + rows_per_task).min(weight.n_out);
        // SAFETY: tasks own disjoint row ranges, so each writes only the columns `rows` of
        // `y`; `y` outlives the parallel section and holds tokens * n_out values.
        unsafe {
            tile_rows(
                weight,
                row_bytes,
                rows,
                activations,
                activation_bytes,
                tokens,
                kernel,
                &output,
            )
        };
    };
    parallelism.for_each_chunk(chunks, &task);
}

/// The first `len` bytes of `scratch`, grown if shorter. It never shrinks: matmuls of
/// several sizes take turns with one scratch, and regrowing it zeroes the new part.
fn grown(scratch: &mut Vec<u8>, len: usize) -> &mut [u8] {
    if scratch.len() < len {
        scratch.resize(len, 0);
    }
    &mut scratch[..len]
}

thread_local! {
    /// The results buffer of `tile_rows`, kept per thread.
    static TILE_RESULTS: std::cell::Cell<Vec<f32>> = const { std::cell::Cell::new(Vec::new()) };
}

/// The kernel a tile of tokens goes through.
#[derive(Clone, Copy)]
enum TileKernel<'a> {
    /// A 32-element format, with the activations' f32 scale tables (and, where the CPU has
    /// it, the kernel that takes all of a task's weight rows in one call).
    Scaled(TileFn, Option<TileRowsFn>, BlockScales<'a>),
    /// Any other type.
    Multi(MultiDotFn),
}

/// `y` shared between tasks that write disjoint parts of it.
struct SharedOutput(*mut f32);
// SAFETY: each task writes only its own outputs (rows of `y` for one token, columns for
// several).
unsafe impl Sync for SharedOutput {}

/// The activation scratch shared between tasks that convert disjoint rows.
struct SharedBytes(*mut u8);
// SAFETY: each task writes only its own activation row.
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
    // Reused between calls on this thread (a decode step makes hundreds).
    let mut all_rows = TILE_RESULTS.take();
    for first_token in (0..tokens).step_by(TOKENS_PER_TILE) {
        let count = TOKENS_PER_TILE.min(tokens - first_token);
        let block =
            &activations[first_token * activation_bytes..(first_token + count) * activation_bytes];
        if let TileKernel::Scaled(_, Some(tile_rows), scales) = kernel {
            // Every weight row of the task in one call: `all_rows[t * rows + r]`.
            if all_rows.len() < rows.len() * count {
                all_rows.resize(rows.len() * count, 0.0);
            }
            let all_rows = &mut all_rows[..rows.len() * count];
            let weights = &weight.bytes[rows.start * row_bytes..rows.end * row_bytes];
            let scales = scales.from_row(first_token);
            if tile_rows(weight.n_in, weights, block, scales, all_rows) {
                for (t, values) in all_rows.chunks_exact(rows.len()).enumerate() {
                    // SAFETY: as below: columns `rows` of token `first_token + t`.
                    let out = unsafe {
                        std::slice::from_raw_parts_mut(
                            y.at((first_token + t) * weight.n_out + rows.start),
                            rows.len(),
                        )
                    };
                    out.copy_from_slice(values);
                }
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
                TileKernel::Multi(multi) => multi(weight.n_in, row, block, &mut dots[..count]),
            }
            for (t, value) in dots[..count].iter().enumerate() {
                // SAFETY: (first_token + t) < tokens and o < n_out, inside `y`; column `o`
                // belongs to this task (see the function's contract).
                unsafe { *y.at((first_token + t) * weight.n_out + o) = *value };
            }
        }
    }
    TILE_RESULTS.set(all_rows);
}

/// The scalar twin of [`matmul`]: one thread, scalar kernels, one dot product per output.
/// Bit-identical to `matmul` at every SIMD level.
///
/// # Panics
/// As [`matmul`].
pub fn matmul_scalar(weight: &PackedWeight, x: &[f32], tokens: usize, y: &mut [f32]) {
    check_shapes(weight, x, tokens, y);
    // llamafile's sgemm order, as in `matmul` (tinyblas.rs).
    if let Some(kernel) = tinyblas::kernel_for(weight, tokens, SimdLevel::Scalar) {
        let serial = Parallelism {
            pool: None,
            level: SimdLevel::Scalar,
        };
        tinyblas::matmul_tinyblas(weight, x, tokens, y, &mut Vec::new(), &serial, kernel);
        return;
    }
    let format = activation_format(weight.ty).expect("checked by check_shapes");
    let activation_bytes = activation_row_bytes(format, weight.n_in);
    let vec_dot: DotFn = dot_fn(weight.ty, SimdLevel::Scalar).expect("checked by check_shapes");
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
            Some((_, gemm)) if t < repacked::gemm_rows(weight, tokens) => gemm,
            Some((gemv, _)) => gemv,
            None => vec_dot,
        };
        for o in 0..weight.n_out {
            let row = &weight.bytes[o * row_bytes..(o + 1) * row_bytes];
            y[t * weight.n_out + o] = dot(weight.n_in, row, &activation);
        }
    }
}
