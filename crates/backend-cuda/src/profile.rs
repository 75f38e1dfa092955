//! `RUNIT_CUDA_PROFILE=1`: the device time of every kernel launch, measured with a pair of
//! CUDA events around it and summed per (kernel, grid), printed to standard error when the
//! backend closes, largest first. For finding where a step's time goes on a machine with no
//! profiler installed. Profiling turns off graph capture (a captured launch would not be
//! timed) and programmatic dependent launch (a kernel overlapping its predecessor would blur
//! both times); launches of cuBLAS and copies are not counted.

use std::sync::{Arc, Mutex};

use cudarc::driver::{sys, CudaContext, CudaEvent, CudaStream};
use runit_backend::profile::KernelTimes;

/// Launches held before their events are read and folded into the totals.
const PENDING_LIMIT: usize = 4096;

#[derive(Default)]
struct State {
    pending: Vec<(String, CudaEvent, CudaEvent)>,
    totals: KernelTimes,
}

/// Per-kernel device times (see the module documentation).
pub(crate) struct Profiler {
    context: Arc<CudaContext>,
    state: Mutex<State>,
}

impl Profiler {
    /// A profiler when `RUNIT_CUDA_PROFILE=1`.
    pub(crate) fn from_env(context: &Arc<CudaContext>) -> Option<Profiler> {
        std::env::var("RUNIT_CUDA_PROFILE")
            .is_ok_and(|v| v == "1")
            .then(|| Profiler {
                context: Arc::clone(context),
                state: Mutex::new(State::default()),
            })
    }

    /// An event recorded on `stream` now (timing on), or None when the driver refuses one
    /// (the launch then goes untimed).
    pub(crate) fn mark(&self, stream: &CudaStream) -> Option<CudaEvent> {
        let event = self
            .context
            .new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))
            .ok()?;
        event.record(stream).ok()?;
        Some(event)
    }

    /// Files the launch of `name` with `grid` between `start` and `end`.
    pub(crate) fn record(
        &self,
        name: &str,
        grid: (u32, u32, u32),
        start: CudaEvent,
        end: CudaEvent,
    ) {
        let key = format!("{name} [{}x{}x{}]", grid.0, grid.1, grid.2);
        let mut state = self.state.lock().expect("profile lock");
        state.pending.push((key, start, end));
        if state.pending.len() >= PENDING_LIMIT {
            fold(&mut state);
        }
    }

    /// The table of kernel times (`KernelTimes::report`).
    fn report(&self) -> String {
        let mut state = self.state.lock().expect("profile lock");
        fold(&mut state);
        state
            .totals
            .report("RUNIT_CUDA_PROFILE", "launches", "kernel [grid]")
    }
}

/// Reads the pending events (waiting for them) into the totals.
fn fold(state: &mut State) {
    let pending = std::mem::take(&mut state.pending);
    for (key, start, end) in pending {
        if let Ok(ms) = start.elapsed_ms(&end) {
            state.totals.add(key, f64::from(ms));
        }
    }
}

impl Drop for Profiler {
    fn drop(&mut self) {
        eprint!("{}", self.report());
    }
}
