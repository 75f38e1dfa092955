//! The expert matvecs of a mixture-of-experts FFN (`matvec_<type>[_swiglu]..._id` kernels):
//! one token row per (token, expert slot) pair, each pair's expert index read from device
//! memory, so the experts of a decode step need no host round trip and can be captured.
//!
//! A pair's output rows are summed exactly as the one-token kernel of the variant that
//! [`super::matmul`] picks for that expert's matrix sums them (the same part or element order
//! per thread, the same reductions), so they equal the host-routed path's matmuls.

use cudarc::driver::LaunchConfig;
use runit_backend::{BackendError, Device, Weight};

use super::matvec::{
    quantized_input, resident_warps, rows_per_block, warp_rows, THREADS, UNROLLED_MIN_ROWS,
    WARP_MAX_ROW_BYTES, WARP_MIN_ROWS,
};
use super::names::{self, WIDE_MIN_ROW};
use super::{activation_mode, forget_overwritten, launch_kernel, Operands};
use crate::memory::weight_ptr;
use crate::CudaBackend;

/// The device operands of one expert matvec.
#[derive(Debug, Clone, Copy)]
pub struct ExpertRows {
    /// f32 activations: `x_rows` rows of the weight's row length.
    pub x: u64,
    pub x_rows: usize,
    /// Pairs per activation row: pair `p` reads row `p / x_group`.
    pub x_group: usize,
    /// Output rows.
    pub pairs: usize,
    /// The u32 expert index of each pair.
    pub ids: u64,
    /// f32 output: `pairs` rows of the weight's row count.
    pub out: u64,
}

/// `out[p] = W[ids[p]] · x[p / x_group]` for every pair `p`, or, with `up` (of the weight's
/// type and shape), `out[p] = silu(W[ids[p]] · x) * (U[ids[p]] · x)`; `weight` is the stacked
/// tensor of every expert (`shape[2]` matrices). Launches are reported as `op`.
pub fn expert_matvec(
    backend: &CudaBackend,
    op: &'static str,
    weight: &Weight,
    up: Option<&Weight>,
    rows: &ExpertRows,
) -> Result<(), BackendError> {
    let kernels = names::kernels(weight.ty).ok_or_else(|| BackendError::Unsupported {
        backend: backend.name(),
        op,
        ty: weight.ty,
        tensor: weight.name.clone(),
    })?;
    if let Some(up) = up.filter(|u| u.ty != weight.ty || u.shape != weight.shape) {
        return Err(BackendError::Shape {
            op,
            what: "up weight elements (the gate's type and shape)",
            expected: weight.n_elements(),
            found: up.n_elements(),
        });
    }
    let (n_in, n_out) = (weight.row_len(), weight.rows());
    let block = weight.ty.block_size();
    if n_in % block != 0 {
        return Err(BackendError::Shape {
            op,
            what: "row length (a whole number of blocks)",
            expected: n_in.next_multiple_of(block),
            found: n_in,
        });
    }
    let narrow = |value: usize, what: &'static str| {
        u32::try_from(value).map_err(|_| BackendError::Shape {
            op,
            what,
            expected: u32::MAX as usize,
            found: value,
        })
    };
    let (n_in32, n_out32) = (narrow(n_in, "row length")?, narrow(n_out, "rows")?);
    // One grid row per pair.
    if rows.pairs > 65_535 {
        return Err(BackendError::Shape {
            op,
            what: "expert rows (at most the grid height)",
            expected: 65_535,
            found: rows.pairs,
        });
    }
    let pairs = rows.pairs as u32;
    let x_group = narrow(rows.x_group.max(1), "pairs per activation row")?;
    if rows.pairs == 0 || n_out == 0 {
        return Ok(());
    }
    let row_bytes = weight.row_bytes();
    let expert_bytes = (n_out * row_bytes) as u64;
    let w = weight_ptr(op, "expert weight", weight)?;
    let u = up
        .map(|u| weight_ptr(op, "expert up weight", u))
        .transpose()?;
    let operands = Operands {
        weight: w,
        row_bytes,
        n_in,
        n_out,
        x: rows.x,
        out: rows.out,
        tokens: rows.x_rows,
        activation_mode: activation_mode(weight.ty),
        bias: 0,
    };
    let mut scratch = backend.matmul_state().lock();
    forget_overwritten(
        &mut scratch,
        &Operands {
            tokens: rows.pairs,
            ..operands
        },
    );
    let grid = |blocks: usize| LaunchConfig {
        grid_dim: (blocks as u32, pairs, 1),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    };
    let file = kernels.matvec_file;
    let row_bytes = row_bytes as u64;
    let Some(vector) = &kernels.matvec_vector else {
        let (aq, ads) = quantized_input(backend, &operands, &mut scratch)?;
        let names = match kernels.matvec_wide_id {
            Some(wide) if n_in >= WIDE_MIN_ROW => wide,
            _ => kernels.matvec_id,
        };
        // Four output rows per block, two of gate and two of up for SwiGLU.
        let rows_per_block = rows_per_block(0);
        return match u {
            None => launch_kernel!(
                backend,
                op,
                file,
                names.plain,
                grid(n_out.div_ceil(rows_per_block)),
                w,
                expert_bytes,
                row_bytes,
                n_in32,
                n_out32,
                aq,
                ads,
                rows.out,
                rows.ids,
                x_group
            ),
            Some(u) => launch_kernel!(
                backend,
                op,
                file,
                names.swiglu,
                grid(n_out.div_ceil(rows_per_block / 2)),
                w,
                u,
                expert_bytes,
                row_bytes,
                n_in32,
                n_out32,
                aq,
                ads,
                rows.out,
                rows.ids,
                x_group
            ),
        };
    };
    // The variant matvec::run picks for one expert's matrix (alignment holds for every
    // expert when it holds for the first: matrices are whole multiples of 16 bytes apart).
    let aligned = n_in.is_multiple_of(8)
        && w.is_multiple_of(16)
        && u.is_none_or(|u| u.is_multiple_of(16))
        && expert_bytes.is_multiple_of(16)
        && rows.x.is_multiple_of(16);
    if aligned && weight.row_bytes() <= WARP_MAX_ROW_BYTES && n_out >= WARP_MIN_ROWS {
        let name = match u {
            None => vector.warp_id.plain,
            Some(_) => vector.warp_id.swiglu,
        };
        let (per_warp, blocks) = warp_rows(n_out, resident_warps(backend, file, name)?);
        let per_warp = per_warp as u32;
        return match u {
            None => launch_kernel!(
                backend,
                op,
                file,
                name,
                grid(blocks),
                w,
                expert_bytes,
                row_bytes,
                n_in32,
                n_out32,
                rows.x,
                rows.out,
                rows.ids,
                x_group,
                per_warp
            ),
            Some(u) => launch_kernel!(
                backend,
                op,
                file,
                name,
                grid(blocks),
                w,
                u,
                expert_bytes,
                row_bytes,
                n_in32,
                n_out32,
                rows.x,
                rows.out,
                rows.ids,
                x_group,
                per_warp
            ),
        };
    }
    let names = if !aligned {
        kernels.matvec_id
    } else if n_out >= UNROLLED_MIN_ROWS {
        vector.unrolled_id
    } else {
        vector.single_id
    };
    match u {
        None => launch_kernel!(
            backend,
            op,
            file,
            names.plain,
            grid(n_out),
            w,
            expert_bytes,
            row_bytes,
            n_in32,
            n_out32,
            rows.x,
            rows.out,
            rows.ids,
            x_group
        ),
        Some(u) => launch_kernel!(
            backend,
            op,
            file,
            names.swiglu,
            grid(n_out),
            w,
            u,
            expert_bytes,
            row_bytes,
            n_in32,
            n_out32,
            rows.x,
            rows.out,
            rows.ids,
            x_group
        ),
    }
}
