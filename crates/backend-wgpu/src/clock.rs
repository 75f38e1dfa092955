//! The host's cost of decode steps: dispatches, submits, wall time and the recording thread's
//! CPU time from `begin_step` to the step's last submit (the one its read-back makes), summed
//! over the passes of one row a sequence. On a GPU the device runs meanwhile; on lavapipe its
//! threads compete for the cores, so the thread's CPU time is the figure to compare there.

use std::time::Instant;

pub use runit_backend::clock::thread_cpu_ns;

/// Totals over the decode steps measured since the backend opened
/// ([`crate::WgpuBackend::step_costs`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StepCosts {
    /// Decode steps measured.
    pub steps: u64,
    pub dispatches: u64,
    pub submits: u64,
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
            "{} decode steps, each {:.1} dispatches, {:.1} submits, {:.0} µs wall",
            self.steps,
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
        Ok(())
    }
}

/// Where a step's measurement started.
struct Start {
    wall: Instant,
    cpu_ns: Option<u64>,
    dispatches: u64,
    submits: u64,
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
    pub fn begin(&mut self, dispatches: u64, submits: u64) {
        self.open = Some(Start {
            wall: Instant::now(),
            cpu_ns: thread_cpu_ns(),
            dispatches,
            submits,
        });
        self.ended = false;
    }

    /// Marks the open step's ops as recorded.
    pub fn end(&mut self) {
        self.ended = self.open.is_some();
    }

    /// After a submit: ends the open step if its ops are all recorded.
    pub fn submitted(&mut self, dispatches: u64, submits: u64) {
        if !self.ended {
            return;
        }
        self.ended = false;
        let Some(start) = self.open.take() else {
            return;
        };
        let totals = &mut self.totals;
        totals.steps += 1;
        totals.dispatches += dispatches - start.dispatches;
        totals.submits += submits - start.submits;
        totals.wall_ns += start.wall.elapsed().as_nanos() as u64;
        totals.cpu_ns = match (totals.steps, totals.cpu_ns, start.cpu_ns, thread_cpu_ns()) {
            (1, _, Some(from), Some(to)) => Some(to.saturating_sub(from)),
            (_, Some(sum), Some(from), Some(to)) => Some(sum + to.saturating_sub(from)),
            _ => None,
        };
    }
}
