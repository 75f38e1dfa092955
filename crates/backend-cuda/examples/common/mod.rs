//! Pieces the CUDA crate's benches share.

use std::time::Instant;

use runit_backend::{BackendError, Device, StepKey};
use runit_backend_cuda::CudaBackend;

/// Seconds per call of `calls` back-to-back calls that `body` runs, from `replays` replays of
/// their graph under `key` (run once op by op, captured, then replayed once more to warm up).
pub fn graph_seconds(
    cuda: &CudaBackend,
    key: StepKey,
    calls: usize,
    replays: usize,
    body: &mut dyn FnMut() -> Result<(), BackendError>,
) -> Result<f64, BackendError> {
    for _ in 0..3 {
        cuda.run_captured(key, body)?;
    }
    cuda.synchronize()?;
    let start = Instant::now();
    for _ in 0..replays {
        cuda.run_captured(key, body)?;
    }
    cuda.synchronize()?;
    Ok(start.elapsed().as_secs_f64() / (replays * calls) as f64)
}

/// Seconds per call of `body`, over `runs` calls after three warm-up calls.
pub fn wall_seconds(
    backend: &CudaBackend,
    runs: usize,
    mut body: impl FnMut() -> Result<(), BackendError>,
) -> Result<f64, BackendError> {
    for _ in 0..3 {
        body()?;
    }
    backend.synchronize()?;
    let start = Instant::now();
    for _ in 0..runs {
        body()?;
    }
    backend.synchronize()?;
    Ok(start.elapsed().as_secs_f64() / runs as f64)
}
