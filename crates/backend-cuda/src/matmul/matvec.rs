//! The decode path: blocks of 128 threads read each weight row's packed bytes once for all
//! (up to 8) token rows.
//!
//! Quantized weights (2 or 4 rows per block, see `MATVEC_ROWS` in matvec.cuh): the
//! activations are first quantized to q8_1 (`quantize_q8_1` in convert.cu: per 32 values an
//! int8 block, its scale `d` and `d · sum`), then
//! `matvec_<type>_t<T>` (matvec_legacy.cu / matvec_kquants.cu) dots weight parts with them by
//! `dp4a`. Float weights: `matvec_<type>[_vec]_t<T>` (matvec_float.cu) on the f32 activations.

use cudarc::driver::LaunchConfig;
use runit_backend::BackendError;

use super::names::{rows_per_block, token_variant, TypeKernels};
use super::{ensure, launch_kernel, Operands, Scratch, MATVEC_MAX_TOKENS, OP, PREPARED_ROW_LEN};
use crate::CudaBackend;

/// Threads per row (MATVEC_THREADS in the kernels).
const THREADS: u32 = 128;

/// Bytes of q8_1 activations for `tokens` rows of `n_in` (a multiple of 32) values: the int8
/// values (padded to 16 bytes), then one (d, d·sum) f32 pair per 32 values.
pub fn q8_1_bytes(tokens: usize, n_in: usize) -> usize {
    (tokens * n_in).next_multiple_of(16) + tokens * n_in / 32 * 8
}

/// Runs the decode matvec for `op.tokens <= MATVEC_MAX_TOKENS` rows.
pub(super) fn run(
    backend: &CudaBackend,
    kernels: &TypeKernels,
    op: &Operands,
    scratch: &mut Scratch,
) -> Result<(), BackendError> {
    debug_assert!((1..=MATVEC_MAX_TOKENS).contains(&op.tokens));
    let variant = token_variant(op.tokens);
    let grid = |rows_per_block: usize| LaunchConfig {
        grid_dim: (op.n_out.div_ceil(rows_per_block) as u32, 1, 1),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    };
    let (row_bytes, n_in, n_out, tokens) = (
        op.row_bytes as u64,
        op.n_in as u32,
        op.n_out as u32,
        op.tokens as u32,
    );
    match kernels.matvec_vector {
        None => {
            // Sized for the largest token count, so the scratch grows only for longer rows.
            let len = q8_1_bytes(MATVEC_MAX_TOKENS, op.n_in.max(PREPARED_ROW_LEN));
            let base = ensure(backend, &mut scratch.q8_1, len, "q8_1 activation")?;
            let values = op.tokens * op.n_in;
            let (aq, ads) = (base, base + values.next_multiple_of(16) as u64);
            let blocks = values / 32;
            let quantize = LaunchConfig {
                grid_dim: (blocks.div_ceil(8).clamp(1, 65_535) as u32, 1, 1),
                block_dim: (256, 1, 1),
                shared_mem_bytes: 0,
            };
            let current = (op.x, op.tokens, op.n_in, backend.write_generation(), base);
            if scratch.quantized != Some(current) {
                launch_kernel!(
                    backend,
                    OP,
                    "convert.cu",
                    "quantize_q8_1",
                    quantize,
                    op.x,
                    aq,
                    ads,
                    values as u64
                )?;
                scratch.quantized = Some(current);
            }
            launch_kernel!(
                backend,
                OP,
                kernels.matvec_file,
                kernels.matvec[variant],
                grid(rows_per_block(variant)),
                op.weight,
                row_bytes,
                n_in,
                n_out,
                aq,
                ads,
                op.out,
                tokens
            )
        }
        Some(vector) => {
            let aligned = op.n_in.is_multiple_of(8)
                && op.weight.is_multiple_of(16)
                && op.x.is_multiple_of(16);
            let name = if aligned {
                vector[variant]
            } else {
                kernels.matvec[variant]
            };
            launch_kernel!(
                backend,
                OP,
                kernels.matvec_file,
                name,
                grid(1),
                op.weight,
                row_bytes,
                n_in,
                n_out,
                op.x,
                op.out,
                tokens
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn q8_1_scratch_holds_every_token_count() {
        for n_in in [32, 896, 3584, 18944] {
            let capacity = q8_1_bytes(MATVEC_MAX_TOKENS, n_in);
            for tokens in 1..=MATVEC_MAX_TOKENS {
                let values = tokens * n_in;
                let end = values.next_multiple_of(16) + values / 32 * 8;
                assert!(end <= capacity, "{tokens} x {n_in}");
            }
        }
        assert_eq!(q8_1_bytes(1, 32), 32 + 8);
    }
}
