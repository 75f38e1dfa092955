//! Greedy picks on the device (kernels/pick.cu): each logit row's largest value and its
//! log-probability, so greedy decoding downloads two numbers per row instead of the row.

use cudarc::driver::{CudaSlice, LaunchConfig};
use runit_backend::{BackendError, Buffer, Pick};

use super::elementwise::{product, to_u32};
use crate::memory::{buffer_ptr, check_len};
use crate::{device_address, launch, CudaBackend};

const OP: &str = "greedy_pick";

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
    // [ids | log-probabilities as f32 bits]
    if slot
        .as_ref()
        .is_none_or(|s: &CudaSlice<u32>| s.len() < 2 * rows)
    {
        *slot = None;
        let slice = backend
            .stream()
            .alloc_zeros::<u32>(2 * rows)
            .map_err(|e| backend.driver_error(OP, e))?;
        *slot = Some(slice);
    }
    let scratch = slot.as_ref().expect("allocated above");
    let ids = device_address(scratch, backend.stream());
    let logprobs = ids + 4 * rows as u64;
    let config = LaunchConfig {
        grid_dim: (to_u32(OP, "rows", rows)?, 1, 1),
        block_dim: (1024, 1, 1),
        shared_mem_bytes: 0,
    };
    launch!(
        backend,
        OP,
        "pick.cu",
        "greedy_pick_f32",
        config,
        logits,
        to_u32(OP, "width", width)?,
        to_u32(OP, "rows", rows)?,
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
