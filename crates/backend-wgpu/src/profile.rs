//! `RUNIT_WGPU_PROFILE=1`: the device time of every dispatch, from timestamp queries written
//! at the start and end of a compute pass of its own, summed per (kernel, workgroups) and
//! printed to standard error when the backend closes, largest first; for finding which
//! kernels hold a step on an adapter with no profiler at hand. Needs the adapter's
//! `TIMESTAMP_QUERY` feature (a notice says when it is missing). Each submit then waits for
//! its timestamps, and a pass per dispatch adds the adapter's cost of a pass, so use it for
//! shares, not for speed.

use std::sync::Mutex;

use runit_backend::profile::KernelTimes;

use crate::batch::MAX_BATCH;

/// Queries of a batch: a start and an end per dispatch.
const QUERIES: u32 = 2 * MAX_BATCH as u32;

/// Per-kernel device times (see the module documentation).
pub(crate) struct Profiler {
    queries: wgpu::QuerySet,
    resolved: wgpu::Buffer,
    readback: wgpu::Buffer,
    /// Nanoseconds per timestamp tick.
    period: f64,
    /// The labels of the current batch's dispatches, in query order.
    labels: Mutex<Vec<String>>,
    totals: Mutex<KernelTimes>,
}

/// True when `RUNIT_WGPU_PROFILE=1`.
pub(crate) fn wanted() -> bool {
    std::env::var("RUNIT_WGPU_PROFILE").is_ok_and(|v| v == "1")
}

impl Profiler {
    /// A profiler on `device`, which was opened with `TIMESTAMP_QUERY`.
    pub(crate) fn new(device: &wgpu::Device, queue: &wgpu::Queue) -> Profiler {
        let bytes = u64::from(QUERIES) * 8;
        Profiler {
            queries: device.create_query_set(&wgpu::QuerySetDescriptor {
                label: Some("runit profile"),
                ty: wgpu::QueryType::Timestamp,
                count: QUERIES,
            }),
            resolved: device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("runit profile resolved"),
                size: bytes,
                usage: wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
                mapped_at_creation: false,
            }),
            readback: device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("runit profile readback"),
                size: bytes,
                usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            }),
            period: f64::from(queue.get_timestamp_period()),
            labels: Mutex::default(),
            totals: Mutex::default(),
        }
    }

    /// The timestamp writes of the next dispatch's pass, labelled `label` and with `groups`
    /// workgroups, or None when the batch's queries are used up (the dispatch goes untimed).
    pub(crate) fn next_pass(
        &self,
        label: String,
        groups: [u32; 3],
    ) -> Option<wgpu::ComputePassTimestampWrites<'_>> {
        let mut labels = self.labels.lock().unwrap_or_else(|p| p.into_inner());
        let index = labels.len() as u32;
        if 2 * index + 2 > QUERIES {
            return None;
        }
        labels.push(format!(
            "{label} [{}x{}x{}]",
            groups[0], groups[1], groups[2]
        ));
        Some(wgpu::ComputePassTimestampWrites {
            query_set: &self.queries,
            beginning_of_pass_write_index: Some(2 * index),
            end_of_pass_write_index: Some(2 * index + 1),
        })
    }

    /// Records the copy of the batch's timestamps to the host-readable buffer into
    /// `encoder` (the batch's last commands); returns how many dispatches were timed.
    pub(crate) fn resolve(&self, encoder: &mut wgpu::CommandEncoder) -> usize {
        let count = self.labels.lock().unwrap_or_else(|p| p.into_inner()).len();
        if count > 0 {
            let queries = 2 * count as u32;
            encoder.resolve_query_set(&self.queries, 0..queries, &self.resolved, 0);
            encoder.copy_buffer_to_buffer(
                &self.resolved,
                0,
                &self.readback,
                0,
                u64::from(queries) * 8,
            );
        }
        count
    }

    /// After the batch's submit: waits for its timestamps and adds them to the totals.
    pub(crate) fn collect(&self, device: &wgpu::Device, count: usize) {
        let labels = std::mem::take(&mut *self.labels.lock().unwrap_or_else(|p| p.into_inner()));
        if count == 0 {
            return;
        }
        let bytes = count as u64 * 16;
        self.readback
            .map_async(wgpu::MapMode::Read, 0..bytes, |_| {});
        if device.poll(wgpu::PollType::wait_indefinitely()).is_err() {
            return;
        }
        if let Ok(data) = self.readback.get_mapped_range(0..bytes) {
            let stamps: &[u64] = bytemuck::cast_slice(&data);
            let mut totals = self.totals.lock().unwrap_or_else(|p| p.into_inner());
            for (label, pair) in labels.into_iter().zip(stamps.chunks_exact(2)) {
                let nanoseconds = pair[1].saturating_sub(pair[0]) as f64 * self.period;
                totals.add(label, nanoseconds / 1e6);
            }
        }
        self.readback.unmap();
    }

    /// The table of dispatch times (`KernelTimes::report`).
    pub(crate) fn report(&self) -> String {
        let totals = self.totals.lock().unwrap_or_else(|p| p.into_inner());
        totals.report("RUNIT_WGPU_PROFILE", "passes", "kernel [workgroups]")
    }
}
