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

#[cfg(test)]
mod tests;

use rayon::prelude::*;
use runit_quant::dot::{
    activation_format, activation_row_bytes, dot_fn, multi_dot_fn, quantize_activation, DotFn,
    MultiDotFn, SimdLevel,
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
}

impl<'a> PackedWeight<'a> {
    /// A weight view; the shape is checked by [`matmul`].
    pub fn new(ty: GgmlType, bytes: &'a [u8], n_in: usize, n_out: usize) -> PackedWeight<'a> {
        PackedWeight {
            ty,
            bytes,
            n_in,
            n_out,
        }
    }

    /// Bytes of one row.
    fn row_bytes(&self) -> usize {
        self.ty
            .row_bytes(self.n_in as u64)
            .expect("checked by check_shapes") as usize
    }

    /// Row `o`.
    fn row(&self, o: usize) -> &'a [u8] {
        let row_bytes = self.row_bytes();
        &self.bytes[o * row_bytes..(o + 1) * row_bytes]
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

    /// Runs `work` inside the pool, or directly.
    fn run<R: Send>(&self, work: impl FnOnce() -> R + Send) -> R {
        match self.pool {
            Some(pool) => pool.install(work),
            None => work(),
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
/// `[tokens, n_out]`, row-major. `scratch` holds the converted activations between calls
/// (it grows to `tokens * activation_row_bytes` and is reused).
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
    let format = activation_format(weight.ty).expect("checked by check_shapes");
    let activation_bytes = activation_row_bytes(format, weight.n_in);
    scratch.resize(tokens * activation_bytes, 0);
    let activations = &mut scratch[..tokens * activation_bytes];
    let convert = |(row, out): (&[f32], &mut [u8])| quantize_activation(format, row, out);
    if tokens >= PARALLEL_QUANTIZE_TOKENS && parallelism.pool.is_some() {
        parallelism.run(|| {
            x.par_chunks(weight.n_in)
                .zip(activations.par_chunks_mut(activation_bytes))
                .for_each(convert)
        });
    } else {
        x.chunks(weight.n_in)
            .zip(activations.chunks_mut(activation_bytes))
            .for_each(convert);
    }
    let activations = &scratch[..tokens * activation_bytes];
    let dot = dot_fn(weight.ty, parallelism.level).expect("checked by check_shapes");
    let multi = multi_dot_fn(weight.ty, parallelism.level).expect("checked by check_shapes");
    let rows_per_task = (weight.n_out / (parallelism.threads() * 8))
        .max(MIN_ROWS_PER_TASK)
        .min(weight.n_out);
    if tokens == 1 {
        let task = |(chunk, out): (usize, &mut [f32])| {
            for (j, value) in out.iter_mut().enumerate() {
                *value = dot(
                    weight.n_in,
                    weight.row(chunk * rows_per_task + j),
                    activations,
                );
            }
        };
        if parallelism.threads() > 1 {
            parallelism.run(|| y.par_chunks_mut(rows_per_task).enumerate().for_each(task));
        } else {
            y.chunks_mut(rows_per_task).enumerate().for_each(task);
        }
        return;
    }
    let output = SharedOutput(y.as_mut_ptr());
    let starts: Vec<usize> = (0..weight.n_out).step_by(rows_per_task).collect();
    let task = |&first: &usize| {
        let rows = first..(first + rows_per_task).min(weight.n_out);
        // SAFETY: tasks own disjoint row ranges, so each writes only the columns `rows` of
        // `y`; `y` outlives the parallel section and holds tokens * n_out values.
        unsafe {
            tile_rows(
                weight,
                rows,
                activations,
                activation_bytes,
                tokens,
                multi,
                &output,
            )
        };
    };
    if parallelism.threads() > 1 {
        parallelism.run(|| starts.par_iter().for_each(task));
    } else {
        starts.iter().for_each(task);
    }
}

/// `y` shared between tasks that write disjoint columns.
struct SharedOutput(*mut f32);
// SAFETY: only used by `tile_rows`, whose callers give each task its own columns.
unsafe impl Sync for SharedOutput {}

/// Output columns `rows` for every token, tile by tile: for each block of tokens, each
/// weight row meets all of the block's activation rows through the multi-row kernel.
///
/// # Safety
/// No other thread may write columns `rows` of `y` (`[tokens, n_out]`) meanwhile.
unsafe fn tile_rows(
    weight: &PackedWeight,
    rows: std::ops::Range<usize>,
    activations: &[u8],
    activation_bytes: usize,
    tokens: usize,
    multi: MultiDotFn,
    y: &SharedOutput,
) {
    let mut dots = [0.0f32; TOKENS_PER_TILE];
    for first_token in (0..tokens).step_by(TOKENS_PER_TILE) {
        let count = TOKENS_PER_TILE.min(tokens - first_token);
        let block =
            &activations[first_token * activation_bytes..(first_token + count) * activation_bytes];
        for o in rows.clone() {
            multi(weight.n_in, weight.row(o), block, &mut dots[..count]);
            for (t, value) in dots[..count].iter().enumerate() {
                // SAFETY: (first_token + t) < tokens and o < n_out, inside `y`; column `o`
                // belongs to this task (see the function's contract).
                unsafe { *y.0.add((first_token + t) * weight.n_out + o) = *value };
            }
        }
    }
}

/// The scalar twin of [`matmul`]: one thread, scalar kernels, one dot product per output.
/// Bit-identical to `matmul` at every SIMD level.
///
/// # Panics
/// As [`matmul`].
pub fn matmul_scalar(weight: &PackedWeight, x: &[f32], tokens: usize, y: &mut [f32]) {
    check_shapes(weight, x, tokens, y);
    let format = activation_format(weight.ty).expect("checked by check_shapes");
    let activation_bytes = activation_row_bytes(format, weight.n_in);
    let dot: DotFn = dot_fn(weight.ty, SimdLevel::Scalar).expect("checked by check_shapes");
    let mut activation = vec![0u8; activation_bytes];
    for t in 0..tokens {
        quantize_activation(
            format,
            &x[t * weight.n_in..(t + 1) * weight.n_in],
            &mut activation,
        );
        for o in 0..weight.n_out {
            y[t * weight.n_out + o] = dot(weight.n_in, weight.row(o), &activation);
        }
    }
}
