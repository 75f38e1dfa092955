//! The matmul of weights that llama.cpp's CPU backend keeps in its REPACK buffer: every
//! output goes through the repack-order dot product (`runit_quant::dot::repack_dot_fn`):
//! ggml's gemm order for activation rows taken four at a time, its gemv order for the
//! rest. The kernels take eight weight rows per call (`runit_quant::dot::repack_rows_fn`),
//! and up to four activation rows (the gemm kernels decode the weights once for four); each task walks its rows eight at a time and meets every activation row with
//! them while they are in cache.

use runit_quant::dot::{
    activation_format, activation_row_bytes, quantize_activation, repack_dot_fn, repack_one_order,
    repack_rows_fn, DotFn,
};

use super::{
    grown, Layout, PackedWeight, Parallelism, SharedBytes, SharedOutput, MIN_ROWS_PER_TASK,
    PARALLEL_QUANTIZE_TOKENS,
};

/// Weight rows of a task's unit (twice ggml's interleave: the AVX-512 Q4_0 / IQ4_NL
/// kernels take sixteen rows per pass).
const ROWS_PER_GROUP: usize = 16;
/// Activation rows one gemm call takes (ggml's `block_q8_0x4` / `block_q8_Kx4`).
const GEMM_ROWS: usize = 4;
/// Weight rows and activation rows one call takes where gemv and gemm are one order: the
/// weights (64 rows of 1,536 Q4_0 elements: 55 KB) stay in L2 for the token chunks.
const ONE_ORDER_ROWS: usize = 64;
const ONE_ORDER_TOKENS: usize = 8;

/// The repack-order kernels `(gemv, gemm)` for `weight`, or `None` when it follows
/// `vec_dot` order.
pub(super) fn repack_kernel(weight: &PackedWeight) -> Option<(DotFn, DotFn)> {
    match weight.layout {
        Layout::Plain => None,
        Layout::Repacked | Layout::RepackedExpert => repack_dot_fn(weight.ty),
    }
}

/// Activation rows `0..gemm_rows` go through the gemm order, the rest through the gemv
/// order (every row when each must be computed as if alone).
pub(super) fn gemm_rows(weight: &PackedWeight, tokens: usize, parallelism: &Parallelism) -> usize {
    match weight.layout {
        Layout::Repacked if parallelism.rows_alone => 0,
        Layout::Repacked => tokens - tokens % GEMM_ROWS,
        Layout::Plain | Layout::RepackedExpert => 0,
    }
}

/// As `matmul`, in ggml's repack split (see [`gemm_rows`]). The scalar twins passed in
/// are only used to check that `weight` is repacked; the kernels come from the SIMD level.
pub(super) fn matmul_repacked(
    weight: &PackedWeight,
    x: &[f32],
    tokens: usize,
    y: &mut [f32],
    scratch: &mut Vec<u8>,
    parallelism: &Parallelism,
    _twins: (DotFn, DotFn),
) {
    let format = activation_format(weight.ty).expect("checked by check_shapes");
    let (gemv, gemm) =
        repack_rows_fn(weight.ty, parallelism.level).expect("repacked types have kernels");
    let activation_bytes = activation_row_bytes(format, weight.n_in);
    let activations = grown(scratch, tokens * activation_bytes);
    if tokens >= PARALLEL_QUANTIZE_TOKENS && parallelism.threads() > 1 {
        let shared = SharedBytes(activations.as_mut_ptr());
        let convert = |t: usize| {
            // SAFETY: chunk `t` alone writes activation row `t`, which lies inside
            // `activations` (`tokens` rows, `t < tokens`); `activations` outlives the dispatch.
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
    let row_bytes = weight.row_bytes();
    // Whole groups of sixteen rows per task (the last task may end on a partial group).
    let groups = weight.n_out.div_ceil(ROWS_PER_GROUP);
    let groups_per_task = (groups / (parallelism.threads() * 8))
        .max(MIN_ROWS_PER_TASK / ROWS_PER_GROUP)
        .max(1);
    let rows_per_task = (groups_per_task * ROWS_PER_GROUP).min(weight.n_out);
    let chunks = weight.n_out.div_ceil(rows_per_task);
    let gemm_rows = gemm_rows(weight, tokens, parallelism);
    // Where gemv and gemm are one order, a call takes several groups of rows and up to
    // `ONE_ORDER_TOKENS` activation rows (the kernels decode each weight block once for
    // them); otherwise one group and ggml's split into fours and single rows.
    let one_order = repack_one_order(weight.ty);
    let rows_per_call = if one_order {
        ONE_ORDER_ROWS
    } else {
        ROWS_PER_GROUP
    };
    let output = SharedOutput(y.as_mut_ptr());
    let task = |chunk: usize| {
        let first = chunk * rows_per_task;
        let end = (first + rows_per_task).min(weight.n_out);
        let mut values = [0.0f32; ONE_ORDER_TOKENS * ONE_ORDER_ROWS];
        for group in (first..end).step_by(rows_per_call) {
            let count = rows_per_call.min(end - group);
            let rows = &weight.bytes[group * row_bytes..(group + count) * row_bytes];
            let mut t = 0;
            while t < tokens {
                // Up to eight activation rows per call where the orders are one; else
                // fours through the gemm order and the rest through the gemv order.
                let (kernel, step) = if one_order {
                    (gemv, ONE_ORDER_TOKENS.min(tokens - t))
                } else if t < gemm_rows {
                    (gemm, GEMM_ROWS)
                } else {
                    (gemv, GEMM_ROWS.min(tokens - t))
                };
                let activation = &activations[t * activation_bytes..(t + step) * activation_bytes];
                let values = &mut values[..step * count];
                kernel(weight.n_in, rows, activation, values);
                for (s, values) in values.chunks_exact(count).enumerate() {
                    // SAFETY: t + s < tokens and group + count <= n_out, inside `y`;
                    // columns group..group + count belong to this task alone (tasks own
                    // disjoint row ranges).
                    let out = unsafe {
                        std::slice::from_raw_parts_mut(
                            output.at((t + s) * weight.n_out + group),
                            count,
                        )
                    };
                    out.copy_from_slice(values);
                }
                t += step;
            }
        }
    };
    parallelism.for_each_chunk(chunks, &task);
}

#[cfg(test)]
mod tests {
    use super::super::{matmul, matmul_scalar, Layout, PackedWeight, Parallelism};
    use runit_quant::dot::SimdLevel;
    use runit_quant::{quantize, GgmlType};

    #[test]
    fn repacked_matmul_equals_its_scalar_twin_bit_for_bit() {
        let (n_in, n_out) = (512, 168);
        let w: Vec<f32> = (0..n_in * n_out)
            .map(|i| (i as f32 * 0.013).sin() * (1.0 + (i % 5) as f32))
            .collect();
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .build()
            .expect("pool");
        for ty in [
            GgmlType::Q4_0,
            GgmlType::IQ4_NL,
            GgmlType::Q2_K,
            GgmlType::Q4_K,
        ] {
            let row_bytes = ty.row_bytes(n_in as u64).expect("whole blocks") as usize;
            let mut bytes = vec![0u8; n_out * row_bytes];
            for (row, out) in w.chunks(n_in).zip(bytes.chunks_mut(row_bytes)) {
                quantize(ty, row, out).expect("quantize");
            }
            for layout in [Layout::Repacked, Layout::RepackedExpert] {
                // Row counts through the 16-row, 8-row and scalar tails of the kernels.
                for rows in [1, 2, 7, 8, 33, 40, 168] {
                    let bytes = &bytes[..rows * row_bytes];
                    let weight = PackedWeight::new(ty, bytes, n_in, rows).with_layout(layout);
                    for tokens in [1, 2, 4, 7, 8, 9, 19] {
                        let x: Vec<f32> = (0..n_in * tokens)
                            .map(|i| (i as f32 * 0.07).cos())
                            .collect();
                        for level in [SimdLevel::Scalar, SimdLevel::detect()] {
                            let mut want = vec![0.0; tokens * rows];
                            matmul_scalar(&weight, &x, tokens, &mut want, level);
                            for pool in [None, Some(&pool)] {
                                let mut y = vec![0.0; tokens * rows];
                                let parallelism = Parallelism {
                                    pool,
                                    level,
                                    rows_alone: false,
                                };
                                matmul(&weight, &x, tokens, &mut y, &mut Vec::new(), &parallelism);
                                assert_eq!(
                                    y, want,
                                    "{ty} {layout:?} {rows} rows, tokens {tokens} {level:?}"
                                );
                            }
                        }
                    }
                }
            }
        }
    }
}
