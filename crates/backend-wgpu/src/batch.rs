//! Recording work for the device in batches: every dispatch and copy goes into one pending
//! command encoder, dispatches into one open compute pass (wgpu places the barriers between
//! them), and each dispatch's parameters (a uniform slot) and the small tables the host makes
//! for it (token ids, cache cells, RoPE angles: storage, past the slots) into one ring
//! buffer, written with a single queue write when the batch is submitted. A batch is submitted when the host needs
//! its results (a read-back, a wait, an upload that must land after it), when it holds
//! [`MAX_BATCH`] dispatches or copies, when its ring has no room for a dispatch's tables, or,
//! on a GPU, early (`WgpuBackend::early_submit`): so that the device runs the first layers of a
//! decode step while the host records the rest.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use runit_backend::OpResult;
use wgpu::util::DeviceExt;

use crate::bind_groups::BindKey;
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

/// What a dispatch binds at one of bindings 1, 2, ...: a range of a buffer, or a small
/// read-only table the host makes for it (token ids, cache cells, RoPE angles, query lists),
/// which the dispatch places in the batch's table ring.
#[derive(Clone, Copy)]
pub(crate) enum Binding<'a> {
    Range(Range<'a>),
    Table(&'a [u8]),
}

impl<'a> From<&'a wgpu::Buffer> for Binding<'a> {
    fn from(buffer: &'a wgpu::Buffer) -> Binding<'a> {
        Binding::Range(Range::whole(buffer))
    }
}

impl<'a> From<Range<'a>> for Binding<'a> {
    fn from(range: Range<'a>) -> Binding<'a> {
        Binding::Range(range)
    }
}

/// A table of `data` to bind (see [`Binding::Table`]).
pub(crate) fn table<T: bytemuck::Pod>(data: &[T]) -> Binding<'_> {
    Binding::Table(bytemuck::cast_slice(data))
}

/// Most bindings past the parameters one dispatch takes (the matrix-vector kernel of three
/// weights binds seven, eleven with the biases and the RoPE epilogue's angles and caches).
pub(crate) const MAX_BINDINGS: usize = 12;

/// Bytes of the ring for tables, past its parameter slots. The tables of a dispatch that
/// outgrow it get buffers of their own.
const TABLE_RING_BYTES: u64 = 1 << 20;

/// Bytes of the ring's parameter slots, `params_slot` bytes each: a full batch's. Tables
/// start past them, so a table's place does not depend on the slots before it (and the
/// slots' on the tables).
fn slots_bytes(params_slot: u64) -> u64 {
    params_slot * MAX_BATCH as u64
}

/// Bytes of the ring: its parameter slots and [`TABLE_RING_BYTES`] of tables.
pub(crate) fn ring_bytes(params_slot: u64) -> u64 {
    slots_bytes(params_slot) + TABLE_RING_BYTES
}

/// Tables start at multiples of this many bytes (and of the adapter's offset alignment), and
/// are bound to the next multiple: a table that grows by a few bytes a step (attention's
/// cells) keeps its place and binding, and so its bind group, for many steps.
const TABLE_ALIGN: u64 = 256;

/// Where `data` is in the batch's ring, placed there past the `slots` bytes of parameter
/// slots (`bound` bytes, room the caller made) unless an equal table is already.
fn place_table(pending: &mut Pending, data: &[u8], bound: u64, slots: u64) -> u64 {
    let tables = &pending.ring;
    let found = pending
        .placed
        .iter()
        .find(|(at, len)| *len == data.len() && tables[*at as usize..*at as usize + len] == *data);
    if let Some((at, _)) = found {
        return *at;
    }
    let at = pending.ring.len().max(slots as usize);
    pending.ring.resize(at, 0);
    pending.ring.extend_from_slice(data);
    pending.ring.resize(at + bound as usize, 0);
    pending.placed.push((at as u64, data.len()));
    at as u64
}

/// The commands recorded since the last submit.
#[derive(Default)]
pub(crate) struct Pending {
    /// The open compute pass (ended before a copy and before the encoder finishes).
    pass: Option<wgpu::ComputePass<'static>>,
    encoder: Option<wgpu::CommandEncoder>,
    /// The batch's parameter slots and, past all the slots, its tables, as the ring buffer
    /// will hold them; the end of the slots used; where each table starts and its length: a
    /// table repeated in a batch (every layer's RoPE angles) is placed once.
    ring: Vec<u8>,
    slots_end: usize,
    placed: Vec<(u64, usize)>,
    commands: usize,
    /// Commands submitted since the host last flushed (a read-back, a wait, an upload): the
    /// early submits' batches grow with it.
    since_flush: usize,
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
            pending.since_flush += pending.commands;
            pending.commands = 0;
            if !pending.ring.is_empty() {
                self.queue.write_buffer(&self.ring, 0, &pending.ring);
                pending.ring.clear();
                pending.slots_end = 0;
                pending.placed.clear();
            }
            if let Some(mut encoder) = pending.encoder.take() {
                let timed = self.profiler.as_ref().map(|p| p.resolve(&mut encoder));
                self.queue.submit([encoder.finish()]);
                self.counts.submits.fetch_add(1, Ordering::Relaxed);
                if let (Some(profiler), Some(count)) = (&self.profiler, timed) {
                    profiler.collect(&self.device, count);
                }
            }
        }
        let counts = self.counts();
        let mut clock = self.step_clock.lock().unwrap_or_else(|p| p.into_inner());
        clock.submitted(counts);
    }

    fn count_command(&self, pending: &mut Pending) {
        self.epoch.fetch_add(1, Ordering::Relaxed);
        pending.commands += 1;
        if pending.commands >= MAX_BATCH || self.submits_early(pending) {
            self.submit_pending(pending);
        }
    }

    /// Whether the batch is submitted now, before the host needs its results: where early
    /// submits are on (`early_submit` commands, the first batch after a flush), once it holds
    /// half as many commands as were submitted since the flush (and at least
    /// `early_submit`). A decode step recorded as one batch left the device idle while the
    /// host recorded it (on an H100, session 35: 1.4 ms of a 6.1 ms step of qwen2.5-0.5b,
    /// 2.5 ms of the 7B's 30.4); submitted in batches growing by half (16, 16, 16, 24, 36,
    /// 54, 81, ... commands: 8 submits for 246 dispatches), the device runs each batch while
    /// the host records the next, and waits only for the first. Batches end at the same
    /// commands step after step, so a step's parameter slots, and so its bind groups, repeat.
    fn submits_early(&self, pending: &Pending) -> bool {
        self.early_submit > 0 && pending.commands >= self.early_submit.max(pending.since_flush / 2)
    }

    /// Submits the commands recorded so far (before a queue write or a wait must see them).
    pub(crate) fn flush(&self) {
        let mut pending = self.lock_pending();
        self.submit_pending(&mut pending);
        pending.since_flush = 0;
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
        if buffers.len() > MAX_BINDINGS {
            return Err(self.device_error(op, format!("{} bindings", buffers.len())));
        }
        let mut bindings = [Binding::Table(&[]); MAX_BINDINGS];
        let count = buffers.len();
        for (binding, buffer) in bindings.iter_mut().zip(buffers) {
            *binding = Binding::from(*buffer);
        }
        self.dispatch_ranges(op, kernel, params, &bindings[..count], groups)
    }

    /// [`WgpuBackend::dispatch`] with `bindings` at bindings 1, 2, ...: ranges of buffers
    /// (each at most the storage binding limit, at an offset aligned as the adapter
    /// requires) and tables.
    pub(crate) fn dispatch_ranges(
        &self,
        op: &'static str,
        kernel: KernelSource,
        params: &[u32],
        bindings: &[Binding<'_>],
        groups: [u32; 3],
    ) -> OpResult {
        let timer = Timer::start(&self.counts.recording_ns, self.timed);
        if bindings.len() > MAX_BINDINGS {
            return Err(self.device_error(op, format!("{} bindings", bindings.len())));
        }
        let too_large = bindings.iter().find_map(|binding| match binding {
            Binding::Range(range) if range.bytes > self.max_binding => Some(range.bytes),
            _ => None,
        });
        if let Some(bytes) = too_large {
            return Err(self.device_error(
                op,
                format!(
                    "a binding of {bytes} bytes exceeds the adapter's storage binding limit of {} \
                     bytes (this op does not split its buffers; matmul splits its tokens, \
                     weights are split by rows)",
                    self.max_binding
                ),
            ));
        }
        let pipeline = self.pipeline(op, kernel)?;
        let bytes = (params.len().next_multiple_of(4).max(4) * 4) as u64;
        if bytes > self.params_slot {
            return Err(self.device_error(op, format!("{bytes} bytes of parameters")));
        }
        let mut pending = self.lock_pending();
        // Tables first: where the ring has no room left for them, the batch is submitted.
        let align = TABLE_ALIGN.max(self.binding_alignment);
        let bound = |data: &[u8]| (data.len() as u64).max(4).next_multiple_of(align);
        let needed: u64 = bindings
            .iter()
            .map(|binding| match binding {
                Binding::Table(data) => bound(data),
                Binding::Range(_) => 0,
            })
            .sum();
        let in_ring = needed <= TABLE_RING_BYTES;
        let slots = slots_bytes(self.params_slot);
        if in_ring && pending.ring.len() as u64 + needed > ring_bytes(self.params_slot) {
            self.submit_pending(&mut pending);
        }
        let mut own: [Option<wgpu::Buffer>; MAX_BINDINGS] = Default::default();
        let mut places = [(0, 0); MAX_BINDINGS];
        for (index, binding) in bindings.iter().enumerate() {
            if let Binding::Table(data) = binding {
                match in_ring {
                    true => {
                        places[index] = (
                            place_table(&mut pending, data, bound(data), slots),
                            bound(data),
                        )
                    }
                    false => own[index] = Some(self.own_table(op, data)),
                }
            }
        }
        let mut ranges: [(&wgpu::Buffer, u64, u64); MAX_BINDINGS] =
            [(&self.ring, 0, 0); MAX_BINDINGS];
        for (index, binding) in bindings.iter().enumerate() {
            ranges[index] = match (binding, &own[index]) {
                (Binding::Range(r), _) => (r.buffer, r.offset, r.bytes),
                (Binding::Table(_), Some(buffer)) => (buffer, 0, buffer.size()),
                (Binding::Table(_), None) => (&self.ring, places[index].0, places[index].1),
            };
        }
        let ranges = &ranges[..bindings.len()];
        // A batch holds at most MAX_BATCH dispatches, so its slots fit.
        let offset = pending.slots_end as u64;
        let slot_end = (offset + self.params_slot) as usize;
        if pending.ring.len() < slot_end {
            pending.ring.resize(slot_end, 0);
        }
        let words: &[u8] = bytemuck::cast_slice(params);
        pending.ring[offset as usize..offset as usize + words.len()].copy_from_slice(words);
        pending.ring[offset as usize + words.len()..slot_end].fill(0);
        pending.slots_end = slot_end;
        let make = || {
            self.counts.bind_groups_made.fetch_add(1, Ordering::Relaxed);
            let mut entries = vec![wgpu::BindGroupEntry {
                binding: 0,
                resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                    buffer: &self.ring,
                    offset,
                    size: wgpu::BufferSize::new(bytes),
                }),
            }];
            for (index, (buffer, offset, bytes)) in ranges.iter().enumerate() {
                entries.push(wgpu::BindGroupEntry {
                    binding: index as u32 + 1,
                    resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                        buffer,
                        offset: *offset,
                        size: wgpu::BufferSize::new(*bytes),
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
                    ranges,
                };
                let mut groups = self.bind_groups.lock().unwrap_or_else(|p| p.into_inner());
                groups.get(&key, make)
            }
            false => make(),
        };
        // Profiling gives each dispatch a pass of its own, timed at both ends.
        let timestamps = self.profiler.as_ref().and_then(|profiler| {
            pending.pass = None;
            profiler.next_pass(kernel.name(), groups)
        });
        if pending.pass.is_none() {
            let pass = self
                .encoder(&mut pending)
                .begin_compute_pass(&wgpu::ComputePassDescriptor {
                    label: Some("runit batch"),
                    timestamp_writes: timestamps,
                })
                .forget_lifetime();
            pending.pass = Some(pass);
        }
        if let Some(pass) = pending.pass.as_mut() {
            pass.set_pipeline(&pipeline);
            pass.set_bind_group(0, &bind_group, &[]);
            pass.dispatch_workgroups(groups[0], groups[1], groups[2]);
        }
        if self.profiler.is_some() {
            pending.pass = None;
        }
        self.counts.dispatches.fetch_add(1, Ordering::Relaxed);
        // A full batch submits: that time counts as submitting.
        drop(timer);
        self.count_command(&mut pending);
        Ok(())
    }

    /// A buffer of its own for a table larger than the ring (at least one word, so that it
    /// can be bound).
    fn own_table(&self, op: &'static str, data: &[u8]) -> wgpu::Buffer {
        let mut padded = data.to_vec();
        padded.resize(data.len().next_multiple_of(4).max(4), 0);
        self.device
            .create_buffer_init(&wgpu::util::BufferInitDescriptor {
                label: Some(op),
                contents: &padded,
                usage: wgpu::BufferUsages::STORAGE,
            })
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
