//! The matmul of prompt processing in llamafile's sgemm ("tinyBLAS") order, which ggml-cpu
//! uses for two or more activation rows against F32, F16, BF16, Q8_0, Q4_0, Q5_0 and
//! IQ4_NL weights in a plain buffer (see `runit_quant::dot::tinyblas` for the arithmetic
//! and the shapes it takes). Tasks own groups of four weight rows and compute them for
//! every token; the kernel's `[tokens, rows]` results are then copied into `y`.

use runit_quant::dot::tile_rows_fn;
use runit_quant::dot::tinyblas::{self, KernelFn};

use super::{
    grown, Layout, PackedWeight, Parallelism, SharedBytes, SharedOutput, MIN_ROWS_PER_TASK,
    PARALLEL_QUANTIZE_TOKENS,
};

/// Weight rows a task's share is rounded to (the kernels' tile height).
const ROW_GROUP: usize = 4;

/// Most tokens for which a type whose tinyBLAS arithmetic is its `vec_dot`'s goes through
/// the several-rows tile kernel instead, where there is one (AVX-512 VNNI): for decode
/// batches that kernel streams a weight larger than the cache faster (SmolLM2's 30 MB
/// Q8_0 output matrix against 8 tokens: 5.1 ms against tinyBLAS's 7.0-7.4 ms, one thread,
/// AMD EPYC), with the same numbers; for prompt batches tinyBLAS is as fast or faster.
const TILE_INSTEAD_MAX_TOKENS: usize = 16;

/// The tinyBLAS kernel for this matmul at `parallelism`'s level, or `None` when ggml-cpu
/// would not use llamafile's sgemm for it (or every row must be computed as if alone) (or, for types whose `vec_dot` gives the same numbers, when
/// no faster kernel exists at `level` or a faster tile kernel does).
pub(super) fn kernel_for(
    weight: &PackedWeight,
    tokens: usize,
    parallelism: &Parallelism,
) -> Option<KernelFn> {
    let level = parallelism.level;
    let tile_instead = tinyblas::same_as_vec_dot(weight.ty)
        && tokens <= TILE_INSTEAD_MAX_TOKENS
        && tile_rows_fn(weight.ty, level).is_some();
    if weight.layout != Layout::Plain
        || parallelism.rows_alone
        || !tinyblas::accepts(weight.ty, weight.n_in, weight.n_out, tokens)
        || tile_instead
    {
        return None;
    }
    tinyblas::kernel(weight.ty, level)
}

/// As `matmul`, through `kernel` (from [`kernel_for`]).
pub(super) fn matmul_tinyblas(
    weight: &PackedWeight,
    x: &[f32],
    tokens: usize,
    y: &mut [f32],
    scratch: &mut Vec<u8>,
    parallelism: &Parallelism,
    kernel: KernelFn,
) {
    let (ty, n_in, n_out) = (weight.ty, weight.n_in, weight.n_out);
    let unit_tokens = tinyblas::unit_tokens(ty);
    let unit_bytes = tinyblas::prepared_unit_bytes(ty, n_in);
    let units = tokens.div_ceil(unit_tokens);
    let prepared = grown(scratch, units * unit_bytes);
    let convert = |unit: usize, out: &mut [u8]| {
        let first = unit * unit_tokens;
        let last = (first + unit_tokens).min(tokens);
        tinyblas::prepare(ty, &x[first * n_in..last * n_in], n_in, out);
    };
    if tokens >= PARALLEL_QUANTIZE_TOKENS && parallelism.threads() > 1 {
        let shared = SharedBytes(prepared.as_mut_ptr());
        let task = |unit: usize| {
            // SAFETY: chunk `unit` writes only prepared unit `unit`, inside the scratch.
            let out =
                unsafe { std::slice::from_raw_parts_mut(shared.at(unit * unit_bytes), unit_bytes) };
            convert(unit, out);
        };
        parallelism.for_each_chunk(units, &task);
    } else {
        for (unit, out) in prepared.chunks_exact_mut(unit_bytes).enumerate() {
            convert(unit, out);
        }
    }
    let prepared = &*prepared;
    let row_bytes = weight.row_bytes();
    let groups = n_out.div_ceil(ROW_GROUP);
    let groups_per_task = (groups / (parallelism.threads() * 4))
        .max(MIN_ROWS_PER_TASK / ROW_GROUP)
        .max(1);
    let rows_per_task = (groups_per_task * ROW_GROUP).min(n_out);
    let chunks = n_out.div_ceil(rows_per_task);
    let output = SharedOutput(y.as_mut_ptr());
    let task = |chunk: usize| {
        let first = chunk * rows_per_task;
        let count = rows_per_task.min(n_out - first);
        let mut results = vec![0.0f32; count * tokens];
        let rows = &weight.bytes[first * row_bytes..(first + count) * row_bytes];
        kernel(n_in, rows, prepared, tokens, &mut results);
        for (t, values) in results.chunks_exact(count).enumerate() {
            // SAFETY: t < tokens and first + count <= n_out, inside `y`; columns
            // first..first + count belong to this task alone (tasks own disjoint row ranges).
            let out =
                unsafe { std::slice::from_raw_parts_mut(output.at(t * n_out + first), count) };
            out.copy_from_slice(values);
        }
    };
    parallelism.for_each_chunk(chunks, &task);
}
