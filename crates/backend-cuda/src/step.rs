//! Per-step inputs in device memory, and CUDA graphs of whole forward passes.
//!
//! A forward pass has a few host-side inputs (token ids, positions, the block tables of its
//! sequences, the rows whose logits are wanted). [`StepState::begin`] packs them into one i32
//! array laid out as `StepHeader` in `kernels/common.cuh` describes and copies it to a device
//! buffer that keeps its address, so every op of the pass reads them there and a captured
//! graph of the pass stays valid when they change. A pass whose windowed layers have block
//! tables of their own (rings of their windows) gets a second buffer packed with those, which
//! the ops given the window spans read. An op called with host inputs that are not the active
//! step's (the parity tests, MoE routing) gets a private copy uploaded for it.

use std::collections::HashMap;

use cudarc::driver::{CudaGraph, CudaSlice, CudaStream};
use runit_backend::{SequenceSpan, StepInputs, StepKey};

/// i32 slots of the header (`StepHeader` in common.cuh).
pub const HEADER_LEN: usize = 16;

/// The host side of a packed step: the i32 array and the table stride used.
pub struct PackedStep {
    pub data: Vec<i32>,
    pub table_stride: usize,
}

/// Packs the step inputs. Absent parts are derived where they can be: positions from the
/// spans, and one span covering all rows when there are none.
pub fn pack(
    tokens: Option<&[u32]>,
    positions: Option<&[u32]>,
    spans: Option<&[SequenceSpan]>,
    logit_rows: Option<&[u32]>,
) -> PackedStep {
    let spans = spans.unwrap_or(&[]);
    let n_tokens = tokens
        .map(|t| t.len())
        .or(positions.map(|p| p.len()))
        .unwrap_or_else(|| {
            spans
                .iter()
                .map(|s| s.first_row + s.rows)
                .max()
                .unwrap_or(0)
        });
    let longest_table = spans.iter().map(|s| s.block_table.len()).max().unwrap_or(0);
    let table_stride = longest_table.max(1).next_power_of_two().max(64);
    let block_size = spans.first().map(|s| s.block_size).unwrap_or(1).max(1);
    let logit_rows = logit_rows.unwrap_or(&[]);

    let ids_at = HEADER_LEN;
    let positions_at = ids_at + n_tokens;
    let row_span_at = positions_at + n_tokens;
    let span_info_at = row_span_at + n_tokens;
    let logit_at = span_info_at + spans.len() * 4;
    let tables_at = logit_at + logit_rows.len();
    let total = tables_at + spans.len() * table_stride;

    let mut data = vec![0i32; total];
    let header = [
        n_tokens,
        spans.len(),
        logit_rows.len(),
        block_size,
        table_stride,
        ids_at,
        positions_at,
        row_span_at,
        span_info_at,
        logit_at,
        tables_at,
    ];
    for (slot, value) in data.iter_mut().zip(header) {
        *slot = value as i32;
    }
    if let Some(ids) = tokens {
        for (slot, &id) in data[ids_at..].iter_mut().zip(ids) {
            *slot = id as i32;
        }
    }
    if let Some(positions) = positions {
        for (slot, &p) in data[positions_at..].iter_mut().zip(positions) {
            *slot = p as i32;
        }
    }
    for (index, span) in spans.iter().enumerate() {
        for row in span.first_row..(span.first_row + span.rows).min(n_tokens) {
            data[row_span_at + row] = index as i32;
            if positions.is_none() {
                data[positions_at + row] = (span.start_position + row - span.first_row) as i32;
            }
        }
        let info = span_info_at + index * 4;
        data[info] = span.first_row as i32;
        data[info + 1] = span.rows as i32;
        data[info + 2] = span.start_position as i32;
        let table = tables_at + index * table_stride;
        for (slot, &block) in data[table..].iter_mut().zip(&span.block_table) {
            *slot = block as i32;
        }
    }
    for (slot, &row) in data[logit_at..].iter_mut().zip(logit_rows) {
        *slot = row as i32;
    }
    PackedStep { data, table_stride }
}

/// Identity of the host slices of the active step (pointer and length of each).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct HostIdentity {
    pub tokens: (usize, usize),
    pub positions: (usize, usize),
    pub spans: (usize, usize),
    /// The window spans' slice; `None` without.
    pub window_spans: Option<(usize, usize)>,
    pub logit_rows: (usize, usize),
}

impl HostIdentity {
    /// The identity of `inputs`.
    pub fn of(inputs: &StepInputs<'_>) -> HostIdentity {
        HostIdentity {
            tokens: (inputs.tokens.as_ptr() as usize, inputs.tokens.len()),
            positions: (inputs.positions.as_ptr() as usize, inputs.positions.len()),
            spans: (inputs.spans.as_ptr() as usize, inputs.spans.len()),
            window_spans: inputs
                .window_spans
                .map(|spans| (spans.as_ptr() as usize, spans.len())),
            logit_rows: (inputs.logit_rows.as_ptr() as usize, inputs.logit_rows.len()),
        }
    }
}

/// A captured forward pass; graphs are only touched under the backend's step lock.
pub struct Graph(pub CudaGraph);

// SAFETY: a CudaGraph is only launched or dropped while the backend's `step` mutex is held,
// so no two threads touch it at once.
unsafe impl Send for Graph {}

/// A device buffer of packed step inputs whose address stays put while its capacity
/// suffices.
#[derive(Default)]
pub struct StepBuffer {
    pub buffer: Option<CudaSlice<i32>>,
    pub ptr: u64,
    /// The table stride of what it holds.
    pub table_stride: usize,
}

impl StepBuffer {
    /// Copies `packed` in, growing the buffer when it is too small; true when it grew (its
    /// address changed).
    fn upload(
        &mut self,
        stream: &std::sync::Arc<CudaStream>,
        packed: &PackedStep,
    ) -> Result<bool, cudarc::driver::DriverError> {
        let needed = packed.data.len();
        let grows = self.buffer.as_ref().is_none_or(|b| b.len() < needed);
        if grows {
            let capacity = needed.next_power_of_two().max(4096);
            let buffer = stream.alloc_zeros::<i32>(capacity)?;
            self.ptr = crate::device_address(&buffer, stream);
            self.buffer = Some(buffer);
        }
        let buffer = self.buffer.as_mut().expect("step buffer allocated above");
        let mut view = buffer.slice_mut(..needed);
        stream.memcpy_htod(&packed.data, &mut view)?;
        self.table_stride = packed.table_stride;
        Ok(grows)
    }
}

/// A graph's key: the pass's key and the table strides of its step and window buffers.
pub type GraphKey = (StepKey, usize, usize);

/// The step buffers, the active step and the graph cache.
#[derive(Default)]
pub struct StepState {
    /// Device copy of the active step.
    pub step: StepBuffer,
    /// Device copy of the active step with the windowed layers' block tables.
    pub window: StepBuffer,
    /// Set between `begin_step` and `end_step`.
    pub active: Option<HostIdentity>,
    /// True while a stream capture is in progress.
    pub capturing: bool,
    pub graphs: HashMap<GraphKey, Graph>,
    /// Keys that ran once uncaptured (the next pass of such a key is captured).
    pub seen: std::collections::HashSet<GraphKey>,
}

impl StepState {
    /// Copies `packed` (and `window`, the same step with the windowed layers' tables) into
    /// the step buffers, dropping every graph when a buffer grows (their addresses would be
    /// stale).
    pub fn upload(
        &mut self,
        stream: &std::sync::Arc<CudaStream>,
        packed: &PackedStep,
        window: Option<&PackedStep>,
    ) -> Result<(), cudarc::driver::DriverError> {
        let mut grew = self.step.upload(stream, packed)?;
        if let Some(window) = window {
            grew |= self.window.upload(stream, window)?;
        }
        if grew {
            self.graphs.clear();
            self.seen.clear();
        }
        Ok(())
    }

    /// The active graph key of a pass keyed `key`.
    pub fn graph_key(&self, key: StepKey) -> GraphKey {
        let window_stride = match self.active.and_then(|active| active.window_spans) {
            Some(_) => self.window.table_stride,
            None => 0,
        };
        (key, self.step.table_stride, window_stride)
    }
}
