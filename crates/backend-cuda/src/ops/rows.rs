//! Row movement for MoE routing (kernels/rows.cu): `gather_rows` and the weighted
//! `scatter_add_rows`, which adds each destination row's sources in the order given, as the
//! CPU reference does, without atomics.

use cudarc::driver::LaunchConfig;
use runit_backend::{BackendError, Buffer, ScatterAddRows};

use super::elementwise::{product, threads_for, to_u32};
use crate::memory::{buffer_ptr, check_len};
use crate::{launch, CudaBackend};

/// `out[i] = src[rows[i]]` for rows of `width` elements. When `rows` are the active step's
/// logit rows they are read from the step buffer, otherwise uploaded for this call.
pub fn gather_rows(
    backend: &CudaBackend,
    src: &Buffer,
    rows: &[u32],
    width: usize,
    out: &mut Buffer,
) -> Result<(), BackendError> {
    const OP: &str = "gather_rows";
    let src_rows = src.len().checked_div(width).unwrap_or(0);
    check_rows(OP, rows, src_rows)?;
    check_len(
        OP,
        "out",
        out,
        product(OP, "rows × width", rows.len(), width)?,
    )?;
    let src = buffer_ptr(OP, "src", src)?;
    let out = buffer_ptr(OP, "out", out)?;
    if rows.is_empty() || width == 0 {
        return Ok(());
    }
    let config = LaunchConfig {
        grid_dim: (to_u32(OP, "rows", rows.len())?, 1, 1),
        block_dim: (threads_for(width, 256), 1, 1),
        shared_mem_bytes: 0,
    };
    let step = backend.step_inputs(OP, None, None, None, Some(rows))?;
    launch!(
        backend,
        OP,
        "rows.cu",
        "gather_rows_f32",
        config,
        out,
        src,
        step.ptr,
        to_u32(OP, "width", width)?,
        src_rows as u64
    )
}

/// `dst[rows[i]] += scales[i] * src[i]` for rows of `width` elements.
pub fn scatter_add_rows(
    backend: &CudaBackend,
    scatter: ScatterAddRows<'_>,
) -> Result<(), BackendError> {
    const OP: &str = "scatter_add_rows";
    let ScatterAddRows {
        src,
        rows,
        scales,
        width,
        dst,
    } = scatter;
    if scales.len() < rows.len() {
        return Err(BackendError::Shape {
            op: OP,
            what: "scales",
            expected: rows.len(),
            found: scales.len(),
        });
    }
    check_len(
        OP,
        "src",
        src,
        product(OP, "rows × width", rows.len(), width)?,
    )?;
    let dst_rows = dst.len().checked_div(width).unwrap_or(0);
    check_rows(OP, rows, dst_rows)?;
    let src = buffer_ptr(OP, "src", src)?;
    let dst = buffer_ptr(OP, "dst", dst)?;
    if rows.is_empty() || width == 0 {
        return Ok(());
    }
    let plan = ScatterPlan::new(rows, scales);
    let n_targets = to_u32(OP, "destination rows", plan.targets)?;
    let n_sources = to_u32(OP, "rows", rows.len())?;
    let (_plan_buffer, plan_ptr) = backend.upload_small(OP, &plan.data)?;
    let config = LaunchConfig {
        grid_dim: (n_targets, 1, 1),
        block_dim: (threads_for(width, 256), 1, 1),
        shared_mem_bytes: 0,
    };
    launch!(
        backend,
        OP,
        "rows.cu",
        "scatter_add_rows_f32",
        config,
        dst,
        src,
        plan_ptr,
        n_targets,
        n_sources,
        to_u32(OP, "width", width)?,
        dst_rows as u64
    )
}

/// The sources of a scatter-add grouped by destination row, as `scatter_add_rows_f32` reads
/// them (all i32): targets, offsets (one more than targets) into order, order (source
/// indices, in their original order within each destination), scales (f32 bits by source).
struct ScatterPlan {
    targets: usize,
    data: Vec<i32>,
}

impl ScatterPlan {
    fn new(rows: &[u32], scales: &[f32]) -> ScatterPlan {
        let mut order: Vec<usize> = (0..rows.len()).collect();
        // Stable: sources of one destination keep their order.
        order.sort_by_key(|&i| rows[i]);
        let mut targets = Vec::new();
        let mut offsets = Vec::new();
        for (k, &i) in order.iter().enumerate() {
            if targets.last() != Some(&(rows[i] as i32)) {
                targets.push(rows[i] as i32);
                offsets.push(k as i32);
            }
        }
        offsets.push(order.len() as i32);
        let count = targets.len();
        let mut data = targets;
        data.extend(offsets);
        data.extend(order.iter().map(|&i| i as i32));
        data.extend(scales[..rows.len()].iter().map(|s| s.to_bits() as i32));
        ScatterPlan {
            targets: count,
            data,
        }
    }
}

/// Fails unless every row index is below `available`.
fn check_rows(op: &'static str, rows: &[u32], available: usize) -> Result<(), BackendError> {
    match rows.iter().find(|row| **row as usize >= available) {
        Some(row) => Err(BackendError::Shape {
            op,
            what: "row index (exclusive bound)",
            expected: available,
            found: *row as usize,
        }),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scatter_plan_groups_sources_by_destination_in_order() {
        let rows = [4u32, 0, 4, 2];
        let scales = [0.5f32, -1.25, 0.75, 2.0];
        let plan = ScatterPlan::new(&rows, &scales);
        assert_eq!(plan.targets, 3);
        let (targets, rest) = plan.data.split_at(3);
        let (offsets, rest) = rest.split_at(4);
        let (order, scale_bits) = rest.split_at(4);
        assert_eq!(targets, [0, 2, 4]);
        assert_eq!(offsets, [0, 1, 2, 4]);
        assert_eq!(order, [1, 3, 0, 2]);
        let decoded: Vec<f32> = scale_bits
            .iter()
            .map(|b| f32::from_bits(*b as u32))
            .collect();
        assert_eq!(decoded, scales);
    }

    #[test]
    fn row_indices_past_the_buffer_are_rejected() {
        assert!(check_rows("op", &[0, 4], 5).is_ok());
        assert!(matches!(
            check_rows("op", &[0, 5], 5),
            Err(BackendError::Shape {
                expected: 5,
                found: 5,
                ..
            })
        ));
    }
}
