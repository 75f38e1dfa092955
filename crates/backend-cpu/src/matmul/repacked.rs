//! The matmul of weights that llama.cpp's CPU backend keeps in its REPACK buffer: every
//! output goes through the repack-order dot product (`runit_quant::dot::repack_dot_fn`),
//! for one activation row (ggml's gemv) as for many (its gemm keeps the same per-output
//! arithmetic).

use runit_quant::dot::{
    activation_format, activation_row_bytes, quantize_activation, repack_dot_fn, DotFn,
};

use super::{Layout, PackedWeight, Parallelism, SharedOutput, MIN_ROWS_PER_TASK};

/// The repack-order kernels `(gemv, gemm)` for `weight`, or `None` when it follows
/// `vec_dot` order.
pub(super) fn repack_kernel(weight: &PackedWeight) -> Option<(DotFn, DotFn)> {
    match weight.layout {
        Layout::Plain => None,
        Layout::Repacked | Layout::RepackedExpert => repack_dot_fn(weight.ty),
    }
}

/// Activation rows `0..gemm_rows` go through the gemm order, the rest through the gemv
/// order.
pub(super) fn gemm_rows(weight: &PackedWeight, tokens: usize) -> usize {
    match weight.layout {
        Layout::Repacked => tokens - tokens % 4,
        Layout::Plain | Layout::RepackedExpert => 0,
    }
}

/// As `matmul`, in ggml's repack split (see [`gemm_rows`]).
pub(super) fn matmul_repacked(
    weight: &PackedWeight,
    x: &[f32],
    tokens: usize,
    y: &mut [f32],
    scratch: &mut Vec<u8>,
    parallelism: &Parallelism,
    (gemv, gemm): (DotFn, DotFn),
) {
    let format = activation_format(weight.ty).expect("checked by check_shapes");
    let activation_bytes = activation_row_bytes(format, weight.n_in);
    scratch.resize(tokens * activation_bytes, 0);
    x.chunks(weight.n_in)
        .zip(scratch.chunks_mut(activation_bytes))
        .for_each(|(row, out)| quantize_activation(format, row, out));
    let activations = &scratch[..tokens * activation_bytes];
    let row_bytes = weight.row_bytes();
    let rows_per_task = (weight.n_out / (parallelism.threads() * 8))
        .max(MIN_ROWS_PER_TASK)
        .min(weight.n_out);
    let chunks = weight.n_out.div_ceil(rows_per_task);
    let gemm_rows = gemm_rows(weight, tokens);
    let output = SharedOutput(y.as_mut_ptr());
    let task = |chunk: usize| {
        let first = chunk * rows_per_task;
        for o in first..(first + rows_per_task).min(weight.n_out) {
            let row = &weight.bytes[o * row_bytes..(o + 1) * row_bytes];
            for (t, activation) in activations.chunks_exact(activation_bytes).enumerate() {
                let dot = if t < gemm_rows { gemm } else { gemv };
                let value = dot(weight.n_in, row, activation);
                // SAFETY: t < tokens and o < n_out, inside `y`; column `o` belongs to this
                // task alone (tasks own disjoint row ranges).
                unsafe { *output.at(t * weight.n_out + o) = value };
            }
        }
    };
    parallelism.for_each_chunk(chunks, &task);
}
