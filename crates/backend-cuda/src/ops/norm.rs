//! RMS normalisation (kernels/norm.cu), per row of `weight.row_len()` values: whole rows
//! or, with rows = tokens × heads, per-head norms.

use cudarc::driver::LaunchConfig;
use runit_backend::{BackendError, Buffer, RmsNorm};

use super::elementwise::{f32_weight, product, threads_for, to_u32};
use crate::memory::{buffer_ptr, check_len};
use crate::{launch, CudaBackend};

const OP: &str = "rms_norm";

/// Rows up to this length take one warp each; longer rows a whole block.
const WARP_ROW_MAX: usize = 256;
/// Rows handled by one block of warp-per-row launches.
const WARP_ROWS_PER_BLOCK: u32 = 4;

/// `out = norm(x)` for the first `rows` rows; `out_ptr` may be `x`'s own address (in place).
/// The caller has checked `out`'s length.
pub fn rms_norm(
    backend: &CudaBackend,
    x: &Buffer,
    norm: RmsNorm<'_>,
    rows: usize,
    out_ptr: u64,
) -> Result<(), BackendError> {
    let RmsNorm { weight, eps } = norm;
    let width = weight.row_len();
    if width == 0 {
        return Err(BackendError::Shape {
            op: OP,
            what: "norm weight length (non-zero)",
            expected: 1,
            found: 0,
        });
    }
    let len = product(OP, "rows × width", rows, width)?;
    check_len(OP, "x", x, len)?;
    let weight = f32_weight(backend, OP, "norm weight", weight, width)?;
    let x_ptr = buffer_ptr(OP, "x", x)?;
    if rows == 0 {
        return Ok(());
    }
    let config = launch_config(width, rows);
    let (width, rows) = (to_u32(OP, "row length", width)?, to_u32(OP, "rows", rows)?);
    if backend.exact_numerics() {
        return crate::exact::ops::rms_norm(backend, x_ptr, weight, width, eps, rows, out_ptr);
    }
    if x_ptr == out_ptr {
        launch!(
            backend,
            OP,
            "norm.cu",
            "rms_norm_in_place_f32",
            config,
            x_ptr,
            weight,
            width,
            eps,
            rows
        )
    } else {
        launch!(
            backend,
            OP,
            "norm.cu",
            "rms_norm_f32",
            config,
            out_ptr,
            x_ptr,
            weight,
            width,
            eps,
            rows
        )
    }
}

/// One warp per row for short rows such as per-head norms (several rows per block), one
/// block per row otherwise (about 4 values per thread, 64 to 1024 threads: a decode step's
/// single row must not wait on one warp's chain of dependent loads).
pub(crate) fn launch_config(width: usize, rows: usize) -> LaunchConfig {
    if width <= WARP_ROW_MAX {
        LaunchConfig {
            grid_dim: (rows.div_ceil(WARP_ROWS_PER_BLOCK as usize) as u32, 1, 1),
            block_dim: (32, WARP_ROWS_PER_BLOCK, 1),
            shared_mem_bytes: 0,
        }
    } else {
        LaunchConfig {
            grid_dim: (rows as u32, 1, 1),
            block_dim: (threads_for(width / 4, 1024).max(64), 1, 1),
            shared_mem_bytes: 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_rows_take_a_warp_each() {
        let config = launch_config(64, 24 * 5);
        assert_eq!(config.block_dim, (32, 4, 1));
        assert_eq!(config.grid_dim, (30, 1, 1));
        let config = launch_config(256, 5);
        assert_eq!(config.grid_dim, (2, 1, 1));
    }

    #[test]
    fn long_rows_take_a_block_each() {
        assert_eq!(launch_config(2048, 3).block_dim, (512, 1, 1));
        assert_eq!(launch_config(2048, 3).grid_dim, (3, 1, 1));
        assert_eq!(launch_config(8192, 1).block_dim, (1024, 1, 1));
        assert_eq!(launch_config(896, 1).block_dim, (224, 1, 1));
    }
}
