//! Greedy picks on the device (kernels/pick.cu): each logit row's largest value and its
//! log-probability, so greedy decoding downloads two numbers per row instead of the row.

use cudarc::driver::{CudaSlice, LaunchConfig};
use runit_backend::{BackendError, Buffer, Pick};

use super::elementwise::{product, to_u32};
use crate::memory::{buffer_ptr, check_len};
use crate::{device_address, launch, CudaBackend};

const OP: &str = "greedy_pick";

/// Logits per phase-1 block (256 threads, eight each).
pub(crate) const SLICE: usize = 2048;
/// Most phase-1 blocks per row.
pub(crate) const MAX_PARTS: usize = 256;

/// The [`Pick`] of each of the first `rows` rows of `width` values of `logits`.
pub fn greedy_pick(
    backend: &CudaBackend,
    logits: &Buffer,
    rows: usize,
    width: usize,
) -> Result<Vec<Pick>, BackendError> {
    check_len(
        OP,
        "logits",
        logits,
        product(OP, "rows × width", rows, width)?,
    )?;
    let logits = buffer_ptr(OP, "logits", logits)?;
    if rows == 0 {
        return Ok(Vec::new());
    }
    if width == 0 {
        return Err(BackendError::Shape {
            op: OP,
            what: "row width (non-zero)",
            expected: 1,
            found: 0,
        });
    }
    let mut slot = backend
        .pick_scratch()
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    // Phase 1 splits each row into `parts` slices of `chunk` logits.
    let parts = width.div_ceil(SLICE).min(MAX_PARTS);
    let chunk = width.div_ceil(parts);
    // [ids | log-probabilities as f32 bits | partials: rows × parts × (value, index, sum)]
    let needed = product(OP, "rows × parts", rows, 3 * parts)?.saturating_add(2 * rows);
    let scratch = grown(backend, OP, &mut slot, needed)?;
    let ids = device_address(scratch, backend.stream());
    let logprobs = ids + 4 * rows as u64;
    let partials = ids + 8 * rows as u64;
    let (rows_u32, parts_u32) = (to_u32(OP, "rows", rows)?, to_u32(OP, "parts", parts)?);
    let config = LaunchConfig {
        grid_dim: (parts_u32, rows_u32, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    };
    launch!(
        backend,
        OP,
        "pick.cu",
        "greedy_pick_partial_f32",
        config,
        logits,
        to_u32(OP, "width", width)?,
        rows_u32,
        parts_u32,
        to_u32(OP, "chunk", chunk)?,
        partials
    )?;
    let config = LaunchConfig {
        grid_dim: (rows_u32, 1, 1),
        block_dim: (32, 1, 1),
        shared_mem_bytes: 0,
    };
    launch!(
        backend,
        OP,
        "pick.cu",
        "greedy_pick_combine_f32",
        config,
        partials,
        parts_u32,
        rows_u32,
        ids,
        logprobs
    )?;
    let mut host = vec![0u32; 2 * rows];
    backend
        .stream()
        .memcpy_dtoh(&scratch.slice(..2 * rows), &mut host)
        .map_err(|e| backend.driver_error(OP, e))?;
    backend
        .stream()
        .synchronize()
        .map_err(|e| backend.driver_error(OP, e))?;
    Ok((0..rows)
        .map(|r| Pick {
            id: host[r],
            logprob: f32::from_bits(host[rows + r]),
        })
        .collect())
}

/// The pick scratch in `slot` (the backend's `pick_scratch`, locked by the caller), replaced
/// by a larger one when it holds fewer than `needed` words.
pub(crate) fn grown<'s>(
    backend: &CudaBackend,
    op: &'static str,
    slot: &'s mut Option<CudaSlice<u32>>,
    needed: usize,
) -> Result<&'s CudaSlice<u32>, BackendError> {
    if slot.as_ref().is_none_or(|s| s.len() < needed) {
        *slot = None;
        let slice = backend
            .stream()
            .alloc_zeros::<u32>(needed)
            .map_err(|e| backend.driver_error(op, e))?;
        *slot = Some(slice);
    }
    Ok(slot.as_ref().expect("allocated above"))
}
