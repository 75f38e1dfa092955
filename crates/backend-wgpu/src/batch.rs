//! Recording work for the device in batches: every dispatch and copy goes into one pending
//! command encoder, dispatches into one open compute pass (wgpu places the barriers between
//! them), and each dispatch's parameters into a slot of one uniform ring buffer, written
//! with a single queue write when the batch is submitted. A batch is submitted when the host
//! needs its results (a read-back, a wait, an upload that must land after it) or when it
//! holds [`MAX_BATCH`] dispatches or copies.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use runit_backend::OpResult;

use crate::clock::Timer;
use crate::kernels::KernelSource;
use crate::WgpuBackend;

/// Most commands (and parameter slots) in one batch: bounds the memory a long prompt's
/// temporary buffers hold and lets the device start early.
pub(crate) const MAX_BATCH: usize = 512;

/// Bytes `offset .. offset + bytes` of a buffer, bound to one binding of a dispatch.
#[derive(Clone, Copy)]
pub(crate) struct Range<'a> {
    pub buffer: &'a wgpu::Buffer,
    pub offset: u64,
    pub bytes: u64,
}

impl<'a> Range<'a> {
    /// All of `buffer`.
    pub fn whole(buffer: &'a wgpu::Buffer) -> Range<'a> {
        Range {
            buffer,
            offset: 0,
            bytes: buffer.size(),
        }
    }
}

/// Bind groups kept per generation: beyond it the older generation is dropped (a decode
/// step records about 650 dispatches, so a step's bind groups stay while tokens repeat it).
const BIND_GROUPS_KEPT: usize = 4096;

/// What a dispatch binds: its pipeline (by address: pipelines are never dropped), its
/// parameter slot in the ring (offset, bytes) and each buffer range (buffer, offset, bytes).
#[derive(PartialEq, Eq, Hash)]
struct BindKey {
    pipeline: usize,
    params: (u64, u64),
    ranges: Vec<(wgpu::Buffer, u64, u64)>,
}

/// Bind groups by what they bind, reused across batches: a decode step records the same
/// dispatches, over the same buffers and the same parameter slots, token after token, so
/// only the tables that change (cache cells, RoPE angles) need new ones. Two generations,
/// the older dropped when the newer is full: a bind group keeps its buffers alive, so one
/// not used for a generation goes.
#[derive(Default)]
pub(crate) struct BindGroups {
    current: HashMap<BindKey, wgpu::BindGroup>,
    previous: HashMap<BindKey, wgpu::BindGroup>,
}

impl BindGroups {
    /// The bind group of `key`, made by `make` where none is kept.
    fn get(&mut self, key: BindKey, make: impl FnOnce() -> wgpu::BindGroup) -> wgpu::BindGroup {
        if let Some(group) = self.current.get(&key) {
            return group.clone();
        }
        let group = self.previous.remove(&key).unwrap_or_else(make);
        if self.current.len() >= BIND_GROUPS_KEPT {
            self.previous = std::mem::take(&mut self.current);
        }
        self.current.insert(key, group.clone());
        group
    }
}

/// The commands recorded since the last submit.
#[derive(Default)]
pub(crate) struct Pending {
    /// The open compute pass (ended before a copy and before the encoder finishes).
    pass: Option<wgpu::ComputePass<'static>>,
    encoder: Option<wgpu::CommandEncoder>,
    /// The batch's parameter slots, as the ring buffer will hold them.
    params: Vec<u8>,
    commands: usize,
}

impl WgpuBackend {
    fn encoder<'a>(&self, pending: &'a mut Pending) -> &'a mut wgpu::CommandEncoder {
        pending.encoder.get_or_insert_with(|| {
            self.device
                .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                    label: Some("runit batch"),
                })
        })
    }

    fn lock_pending(&self) -> std::sync::MutexGuard<'_, Pending> {
        self.pending.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn submit_pending(&self, pending: &mut Pending) {
        {
            let _timer = Timer::start(&self.counts.submitting_ns, self.timed);
            pending.pass = None;
            pending.commands = 0;
            if !pending.params.is_empty() {
                self.queue
                    .write_buffer(&self.params_ring, 0, &pending.params);
                pending.params.clear();
            }
            if let Some(encoder) = pending.encoder.take() {
                self.queue.submit([encoder.finish()]);
                self.counts.submits.fetch_add(1, Ordering::Relaxed);
            }
        }
        let counts = self.counts();
        let mut clock = self.step_clock.lock().unwrap_or_else(|p| p.into_inner());
        clock.submitted(counts);
    }

    fn count_command(&self, pending: &mut Pending) {
        self.epoch.fetch_add(1, Ordering::Relaxed);
        pending.commands += 1;
        if pending.commands >= MAX_BATCH {
            self.submit_pending(pending);
        }
    }

    /// Submits the commands recorded so far (before a queue write or a wait must see them).
    pub(crate) fn flush(&self) {
        self.submit_pending(&mut self.lock_pending());
    }

    /// Records `kernel` over `groups` workgroups with `params` (words, f32 bit-cast) at
    /// binding 0 and the whole of `buffers` at bindings 1, 2, ... A buffer larger than the
    /// adapter's storage binding limit is refused: only ops that bind ranges
    /// ([`WgpuBackend::dispatch_ranges`]) take those.
    pub(crate) fn dispatch(
        &self,
        op: &'static str,
        kernel: KernelSource,
        params: &[u32],
        buffers: &[&wgpu::Buffer],
        groups: [u32; 3],
    ) -> OpResult {
        let ranges: Vec<Range<'_>> = buffers.iter().map(|b| Range::whole(b)).collect();
        self.dispatch_ranges(op, kernel, params, &ranges, groups)
    }

    /// [`WgpuBackend::dispatch`] with `ranges` of buffers at bindings 1, 2, ... (each at
    /// most the storage binding limit, at an offset aligned as the adapter requires).
    pub(crate) fn dispatch_ranges(
        &self,
        op: &'static str,
        kernel: KernelSource,
        params: &[u32],
        ranges: &[Range<'_>],
        groups: [u32; 3],
    ) -> OpResult {
        let timer = Timer::start(&self.counts.recording_ns, self.timed);
        if let Some(range) = ranges.iter().find(|r| r.bytes > self.max_binding) {
            return Err(self.device_error(
                op,
                format!(
                    "a binding of {} bytes exceeds the adapter's storage binding limit of {}                      bytes (this op does not split its buffers; matmul splits its tokens,                      weights are split by rows)",
                    range.bytes, self.max_binding
                ),
            ));
        }
        let pipeline = self.pipeline(op, kernel)?;
        let bytes = (params.len().next_multiple_of(4).max(4) * 4) as u64;
        if bytes > self.params_slot {
            return Err(self.device_error(op, format!("{bytes} bytes of parameters")));
        }
        let mut pending = self.lock_pending();
        let offset = pending.params.len() as u64;
        pending
            .params
            .extend_from_slice(bytemuck::cast_slice(params));
        let slot_end = (offset + self.params_slot) as usize;
        pending.params.resize(slot_end, 0);
        let make = || {
            self.counts.bind_groups_made.fetch_add(1, Ordering::Relaxed);
            let mut entries = vec![wgpu::BindGroupEntry {
                binding: 0,
                resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                    buffer: &self.params_ring,
                    offset,
                    size: wgpu::BufferSize::new(bytes),
                }),
            }];
            for (index, range) in ranges.iter().enumerate() {
                entries.push(wgpu::BindGroupEntry {
                    binding: index as u32 + 1,
                    resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                        buffer: range.buffer,
                        offset: range.offset,
                        size: wgpu::BufferSize::new(range.bytes),
                    }),
                });
            }
            self.device.create_bind_group(&wgpu::BindGroupDescriptor {
                label: Some(op),
                layout: &pipeline.get_bind_group_layout(0),
                entries: &entries,
            })
        };
        let bind_group = match self.reuse_bind_groups {
            true => {
                let key = BindKey {
                    pipeline: Arc::as_ptr(&pipeline) as usize,
                    params: (offset, bytes),
                    ranges: ranges
                        .iter()
                        .map(|r| (r.buffer.clone(), r.offset, r.bytes))
                        .collect(),
                };
                let mut groups = self.bind_groups.lock().unwrap_or_else(|p| p.into_inner());
                groups.get(key, make)
            }
            false => make(),
        };
        if pending.pass.is_none() {
            let pass = self
                .encoder(&mut pending)
                .begin_compute_pass(&wgpu::ComputePassDescriptor {
                    label: Some("runit batch"),
                    timestamp_writes: None,
                })
                .forget_lifetime();
            pending.pass = Some(pass);
        }
        if let Some(pass) = pending.pass.as_mut() {
            pass.set_pipeline(&pipeline);
            pass.set_bind_group(0, &bind_group, &[]);
            pass.dispatch_workgroups(groups[0], groups[1], groups[2]);
        }
        self.counts.dispatches.fetch_add(1, Ordering::Relaxed);
        // A full batch submits: that time counts as submitting.
        drop(timer);
        self.count_command(&mut pending);
        Ok(())
    }

    /// Records a copy of `bytes` bytes between buffers (offsets and length multiples of 4).
    pub(crate) fn copy_bytes(
        &self,
        src: &wgpu::Buffer,
        src_offset: u64,
        dst: &wgpu::Buffer,
        dst_offset: u64,
        bytes: u64,
    ) {
        if bytes == 0 {
            return;
        }
        let timer = Timer::start(&self.counts.recording_ns, self.timed);
        let mut pending = self.lock_pending();
        pending.pass = None;
        self.encoder(&mut pending)
            .copy_buffer_to_buffer(src, src_offset, dst, dst_offset, bytes);
        drop(timer);
        self.count_command(&mut pending);
    }
}
