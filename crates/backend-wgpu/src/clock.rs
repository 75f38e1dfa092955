//! The host's cost of decode steps: dispatches, submits, wall time and the recording thread's
//! CPU time from `begin_step` to the step's last submit (the one its read-back makes), summed
//! over the passes of one row a sequence, and of that the CPU time spent inside the recording
//! of dispatches and copies and inside the submits (under `RUNIT_WGPU_COUNTS=1`). On a GPU the device runs meanwhile; on
//! lavapipe its threads compete for the cores, so the thread's CPU time is the figure to
//! compare there (a step's recording runs while lavapipe is idle: its one submit comes last).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

pub use runit_backend::clock::thread_cpu_ns;

use crate::DispatchCounts;

/// Totals over the decode steps measured since the backend opened
/// ([`crate::WgpuBackend::step_costs`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StepCosts {
    /// Decode steps measured.
    pub steps: u64,
    /// Decode steps left out because they compiled a pipeline (the first ones).
    pub compiling_steps: u64,
    pub dispatches: u64,
    pub submits: u64,
    /// Bind groups made (the others were reused).
    pub bind_groups_made: u64,
    /// CPU time inside the recording of dispatches and copies (parameters, tables, pipeline
    /// and bind group lookup, the pass's commands), in nanoseconds; measured only under
    /// `RUNIT_WGPU_COUNTS=1`.
    pub recording_ns: u64,
    /// CPU time inside submits (the rings' writes, the encoder's finish, the queue's
    /// submit), in nanoseconds; measured only under `RUNIT_WGPU_COUNTS=1`.
    pub submitting_ns: u64,
    /// Wall time, in nanoseconds.
    pub wall_ns: u64,
    /// CPU time of the thread that recorded the steps, in nanoseconds (`None` where the
    /// system does not tell it).
    pub cpu_ns: Option<u64>,
}

impl std::fmt::Display for StepCosts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let steps = self.steps.max(1) as f64;
        let per_step = |value: u64| value as f64 / steps;
        write!(
            f,
            "{} decode steps (and {} that compiled pipelines, left out), each {:.1} dispatches, \
             {:.1} submits, {:.0} µs wall",
            self.steps,
            self.compiling_steps,
            per_step(self.dispatches),
            per_step(self.submits),
            per_step(self.wall_ns) / 1e3,
        )?;
        if let Some(cpu_ns) = self.cpu_ns {
            let per_dispatch = cpu_ns as f64 / self.dispatches.max(1) as f64;
            write!(
                f,
                ", {:.0} µs of the recording thread's CPU ({:.2} µs a dispatch)",
                per_step(cpu_ns) / 1e3,
                per_dispatch / 1e3
            )?;
        }
        if self.recording_ns + self.submitting_ns > 0 {
            write!(
                f,
                ", of it {:.0} µs inside dispatches and copies ({:.2} µs a dispatch) and {:.0} \
                 µs inside submits",
                per_step(self.recording_ns) / 1e3,
                self.recording_ns as f64 / self.dispatches.max(1) as f64 / 1e3,
                per_step(self.submitting_ns) / 1e3,
            )?;
        }
        write!(
            f,
            "; {:.1} bind groups made",
            per_step(self.bind_groups_made)
        )
    }
}

/// Where a step's measurement started.
struct Start {
    wall: Instant,
    cpu_ns: Option<u64>,
    counts: DispatchCounts,
}

/// The decode step under way, if one is, and the totals of those measured.
#[derive(Default)]
pub(crate) struct StepClock {
    open: Option<Start>,
    /// Whether the open step's ops are all recorded (`end_step`): its next submit ends it.
    ended: bool,
    pub(crate) totals: StepCosts,
}

impl StepClock {
    /// Starts measuring a decode step (dropping one that never submitted).
    pub fn begin(&mut self, counts: DispatchCounts) {
        self.open = Some(Start {
            wall: Instant::now(),
            cpu_ns: thread_cpu_ns(),
            counts,
        });
        self.ended = false;
    }

    /// Marks the open step's ops as recorded.
    pub fn end(&mut self) {
        self.ended = self.open.is_some();
    }

    /// After a submit: ends the open step if its ops are all recorded.
    pub fn submitted(&mut self, counts: DispatchCounts) {
        if !self.ended {
            return;
        }
        self.ended = false;
        let Some(start) = self.open.take() else {
            return;
        };
        let totals = &mut self.totals;
        if counts.pipelines_made != start.counts.pipelines_made {
            totals.compiling_steps += 1;
            return;
        }
        totals.steps += 1;
        let before = start.counts;
        totals.dispatches += counts.dispatches - before.dispatches;
        totals.submits += counts.submits - before.submits;
        totals.bind_groups_made += counts.bind_groups_made - before.bind_groups_made;
        totals.recording_ns += counts.recording_ns - before.recording_ns;
        totals.submitting_ns += counts.submitting_ns - before.submitting_ns;
        totals.wall_ns += start.wall.elapsed().as_nanos() as u64;
        totals.cpu_ns = match (totals.steps, totals.cpu_ns, start.cpu_ns, thread_cpu_ns()) {
            (1, _, Some(from), Some(to)) => Some(to.saturating_sub(from)),
            (_, Some(sum), Some(from), Some(to)) => Some(sum + to.saturating_sub(from)),
            _ => None,
        };
    }
}

/// Adds the recording thread's CPU time from its start to its drop to `total`, in
/// nanoseconds, when `on` (the backend's `RUNIT_WGPU_COUNTS=1`): the clock costs a system
/// call each end (about 0.2 µs here), so it is read only when measuring.
pub(crate) struct Timer<'a> {
    total: &'a AtomicU64,
    start: Option<u64>,
}

impl<'a> Timer<'a> {
    pub fn start(total: &'a AtomicU64, on: bool) -> Timer<'a> {
        Timer {
            total,
            start: on.then(thread_cpu_ns).flatten(),
        }
    }
}

impl Drop for Timer<'_> {
    fn drop(&mut self) {
        // The clock is read again only where it was read at the start.
        let Some(start) = self.start else {
            return;
        };
        if let Some(end) = thread_cpu_ns() {
            self.total
                .fetch_add(end.saturating_sub(start), Ordering::Relaxed);
        }
    }
}
