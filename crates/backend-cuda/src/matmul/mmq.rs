//! The decode-batch path: matmuls of more rows than the matvecs take (up to
//! [`MMQ_MAX_TOKENS`]) on the tensor cores, each packed weight block read once for all the
//! rows and dequantized per warp in shared memory (kernels/mmq.cu); no weight is staged as a
//! dequantized matrix. Larger batches take the GEMM path: on an H200 (qwen2.5-7b Q4_K_M) these
//! kernels decoded 16 rows 6% faster than it, and tiles of 64 rows 31-35% slower (64 and 128
//! rows), so only 16-row tiles are built.
//!
//! The activations are converted to f16 once per input with the CPU's rounding for the
//! weight type (`activation_f16_cpu`, the values the matvecs' q8 activations hold), and the
//! conversion is reused by the next matmul of the same input (Q, K and V; gate and up).
//! Matrices with too few row blocks to fill the device split their rows' length into ranges;
//! the last block of a tile to finish adds the ranges' partial sums in a fixed order.

use cudarc::driver::LaunchConfig;
use runit_backend::BackendError;

use super::names::TypeKernels;
use super::{ensure, launch_kernel, Operands, Scratch, OP};
use crate::CudaBackend;

/// Most token rows the batched kernels take (one tile); more go through the GEMM path.
pub const MMQ_MAX_TOKENS: usize = 16;
/// Weight rows of one block (`MMQ_BLOCK_ROWS` in mmq.cu).
const BLOCK_ROWS: usize = 128;
/// Token rows of one tile (8 NT of the built kernels).
const TILE_TOKENS: usize = 16;
/// Threads of one block (`MMQ_THREADS`).
const THREADS: u32 = 128;
/// Blocks per multiprocessor the split aims for, so that every multiprocessor streams weights.
const BLOCKS_PER_MULTIPROCESSOR: usize = 4;

/// Elements of the activations staged at once (`MMQ_CHUNK` in mmq.cu): ranges of the row
/// length and the rows themselves are whole multiples of it.
const CHUNK: usize = 128;

/// True when the batched kernels take a matmul of `tokens` rows of `n_in` elements.
pub fn takes(kernels: &TypeKernels, tokens: usize, n_in: usize) -> bool {
    kernels.mmq.is_some() && tokens <= MMQ_MAX_TOKENS && n_in.is_multiple_of(CHUNK)
}

/// The launch shape of one batched matmul.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MmqPlan {
    pub row_blocks: usize,
    pub token_tiles: usize,
    /// Elements of each range of the rows' length; `splits` ranges.
    pub split: usize,
    pub splits: usize,
}

impl MmqPlan {
    /// The plan for `tokens` × `n_in` activations and `n_out` weight rows on a device of
    /// `multiprocessors`.
    pub fn new(tokens: usize, n_in: usize, n_out: usize, multiprocessors: usize) -> MmqPlan {
        let row_blocks = n_out.div_ceil(BLOCK_ROWS);
        let token_tiles = tokens.div_ceil(TILE_TOKENS).max(1);
        // Ranges are whole K-quant super-blocks when the row holds them, else whole chunks.
        let granularity = if n_in.is_multiple_of(256) { 256 } else { CHUNK };
        let wanted = (BLOCKS_PER_MULTIPROCESSOR * multiprocessors)
            .div_ceil(row_blocks * token_tiles)
            .clamp(1, (n_in / granularity).max(1));
        let split = n_in.div_ceil(wanted).next_multiple_of(granularity);
        MmqPlan {
            row_blocks,
            token_tiles,
            split,
            splits: n_in.div_ceil(split),
        }
    }
}

/// Runs the batched kernels for `op.tokens` rows (adding `op.bias` when it is not 0).
pub(super) fn run(
    backend: &CudaBackend,
    kernels: &TypeKernels,
    op: &Operands,
    scratch: &mut Scratch,
) -> Result<(), BackendError> {
    let name = kernels.mmq.expect("checked by takes()");
    let half_x = half_input(backend, op, scratch)?;
    let plan = MmqPlan::new(
        op.tokens,
        op.n_in,
        op.n_out,
        super::matvec::multiprocessors(backend)?,
    );
    let (partial, counters) = if plan.splits > 1 {
        let values = op.tokens * op.n_out;
        let partial = ensure(
            backend,
            &mut scratch.partial,
            plan.splits * values,
            "split partial sums",
        )?;
        let tiles = plan.row_blocks * plan.token_tiles;
        (partial, backend.arrival_counters(OP, tiles)?)
    } else {
        (0, 0)
    };
    let config = LaunchConfig {
        grid_dim: (
            plan.row_blocks as u32,
            plan.token_tiles as u32,
            plan.splits as u32,
        ),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    };
    launch_kernel!(
        backend,
        OP,
        "mmq.cu",
        name,
        config,
        op.weight,
        op.row_bytes as u64,
        op.n_in as u32,
        op.n_out as u32,
        half_x,
        op.tokens as u32,
        plan.split as u32,
        op.out,
        op.bias,
        partial,
        counters
    )
}

/// Converts the activations to f16 with the CPU's rounding for the weight type unless the
/// scratch already holds them; returns their address.
pub(super) fn half_input(
    backend: &CudaBackend,
    op: &Operands,
    scratch: &mut Scratch,
) -> Result<u64, BackendError> {
    let values = op.tokens * op.n_in;
    let base = ensure(backend, &mut scratch.half_x, values, "f16 activation")?;
    let current = super::Converted {
        x: op.x,
        tokens: op.tokens,
        row_len: op.n_in,
        generation: backend.write_generation(),
        scratch: base,
        mode: op.activation_mode,
    };
    if scratch.halved != Some(current) {
        launch_kernel!(
            backend,
            OP,
            "convert.cu",
            "activation_f16_cpu",
            super::gemm::convert_grid(values, op.activation_mode),
            op.x,
            base,
            values as u64,
            op.activation_mode
        )?;
        scratch.halved = Some(current);
    }
    Ok(base)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plans_cover_rows_tokens_and_length() {
        for (tokens, n_in, n_out) in [
            (9, 896, 896),
            (16, 3584, 3584),
            (16, 18944, 3584),
            (12, 3584, 18944),
            (13, 4864, 896),
            (9, 128, 1),
        ] {
            let plan = MmqPlan::new(tokens, n_in, n_out, 132);
            assert!(plan.token_tiles * TILE_TOKENS >= tokens);
            assert!(plan.row_blocks * BLOCK_ROWS >= n_out);
            assert!(plan.splits * plan.split >= n_in);
            assert!((plan.splits - 1) * plan.split < n_in, "no empty range");
            assert!(plan.split.is_multiple_of(CHUNK));
            if n_in.is_multiple_of(256) {
                assert!(plan.split.is_multiple_of(256));
            }
        }
        // A 3584-row matrix (28 row blocks) splits its length to fill 132 multiprocessors.
        let plan = MmqPlan::new(16, 18944, 3584, 132);
        assert!(plan.row_blocks * plan.splits >= BLOCKS_PER_MULTIPROCESSOR * 132);
        // Enough row blocks: one range.
        assert_eq!(MmqPlan::new(16, 3584, 151_936, 132).splits, 1);
    }
}
