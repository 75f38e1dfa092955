//! `RUNIT_CUDA_PROFILE=1`: the device time of every kernel launch, measured with a pair of
//! CUDA events around it and summed per (kernel, grid), printed to standard error when the
//! backend closes, largest first. For finding where a step's time goes on a machine with no
//! profiler installed. Profiling turns off graph capture (a captured launch would not be
//! timed) and programmatic dependent launch (a kernel overlapping its predecessor would blur
//! both times); launches of cuBLAS and copies are not counted.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use cudarc::driver::{sys, CudaContext, CudaEvent, CudaStream};

/// Launches held before their events are read and folded into the totals.
const PENDING_LIMIT: usize = 4096;

/// Totals of one (kernel, grid).
#[derive(Default, Clone, Copy)]
struct Total {
    calls: u64,
    milliseconds: f64,
}

#[derive(Default)]
struct State {
    pending: Vec<(String, CudaEvent, CudaEvent)>,
    totals: HashMap<String, Total>,
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

    /// The table: total milliseconds, share, calls, mean microseconds, kernel and grid.
    fn report(&self) -> String {
        let mut state = self.state.lock().expect("profile lock");
        fold(&mut state);
        let all: f64 = state.totals.values().map(|t| t.milliseconds).sum();
        let mut rows: Vec<(&String, &Total)> = state.totals.iter().collect();
        rows.sort_by(|a, b| b.1.milliseconds.total_cmp(&a.1.milliseconds));
        let mut text = format!(
            "RUNIT_CUDA_PROFILE: {all:.3} ms of kernels in {} launches\n{:>11} {:>6} {:>8} {:>10}  kernel [grid]\n",
            rows.iter().map(|r| r.1.calls).sum::<u64>(),
            "total ms",
            "share",
            "calls",
            "mean us",
        );
        for (key, total) in rows {
            text += &format!(
                "{:>11.3} {:>5.1}% {:>8} {:>10.2}  {key}\n",
                total.milliseconds,
                100.0 * total.milliseconds / all.max(f64::MIN_POSITIVE),
                total.calls,
                1000.0 * total.milliseconds / total.calls as f64,
            );
        }
        text
    }
}

/// Reads the pending events (waiting for them) into the totals.
fn fold(state: &mut State) {
    let pending = std::mem::take(&mut state.pending);
    for (key, start, end) in pending {
        if let Ok(ms) = start.elapsed_ms(&end) {
            let total = state.totals.entry(key).or_default();
            total.calls += 1;
            total.milliseconds += f64::from(ms);
        }
    }
}

impl Drop for Profiler {
    fn drop(&mut self) {
        eprint!("{}", self.report());
    }
}
