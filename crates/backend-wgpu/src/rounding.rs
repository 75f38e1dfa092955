//! A matmul's activations rounded as the CPU's dot products see them (`quantize_x.wgsl`), in
//! one scratch buffer that consecutive matmuls of one input share, and the gated activation
//! that leaves that rounding for the next matmul (`gated_quantize.wgsl`).

use std::sync::atomic::Ordering;

use runit_backend::{Activation, BackendError, Buffer, Weight};
use runit_quant::GgmlType;

use crate::backend::grid;
use crate::device::{at_least, buffer};
use crate::matmul::exact_kernel;
use crate::WgpuBackend;

/// The scratch buffer of rounded activations and what it holds.
#[derive(Default)]
pub(crate) struct RoundedX {
    buffer: Option<wgpu::Buffer>,
    of: Option<Rounded>,
}

/// The rounding a [`RoundedX`] holds: of `len` values of `source` in `mode`, current while
/// the backend's epoch is `epoch`.
struct Rounded {
    source: wgpu::Buffer,
    len: usize,
    mode: u32,
    epoch: u64,
}

impl WgpuBackend {
    /// The first `len` values of `x` rounded as the CPU rounds a matmul's activations for
    /// weights `w` (`shaders/quantize_x.wgsl`: 8-bit blocks of 32 for the legacy types
    /// and IQ4_NL, f16 for F16, bf16 for BF16, Q8_K blocks of 256 for the K-quants and
    /// IQ4_XS; kept as packed Q8_0 or Q8_K blocks for an exact kernel), or `None` where
    /// the CPU keeps them (F32).
    ///
    /// Consecutive matmuls of one activation buffer (the Q, K and V projections; gate and
    /// up) round it once: the rounding is reused while nothing has been recorded or uploaded
    /// since the matmul that made it (`WgpuBackend::epoch`).
    pub(crate) fn activations_as_cpu(
        &self,
        w: &Weight,
        x: &Buffer,
        len: usize,
    ) -> Result<Option<wgpu::Buffer>, BackendError> {
        let Some((mode, block)) = self.rounding(w, len) else {
            return Ok(None);
        };
        let source = buffer(x, "matmul", "x")?;
        let mut scratch = self.rounded_x.lock().unwrap_or_else(|p| p.into_inner());
        let epoch = self.epoch.load(Ordering::Relaxed);
        if let (Some(rounded), Some(of)) = (&scratch.buffer, &scratch.of) {
            if of.source == *source && of.len == len && of.mode == mode && of.epoch == epoch {
                return Ok(Some(rounded.clone()));
            }
        }
        let rounded = self.rounded_buffer(&mut scratch, len)?;
        let blocks = len / block;
        let params = [blocks as u32, mode];
        let kernel = Self::plain("quantize_x");
        self.dispatch("matmul", kernel, &params, &[source, &rounded], grid(blocks))?;
        // Marked as current once the matmul's own dispatches are recorded (`matmul_rows`).
        scratch.of = Some(Rounded {
            source: source.clone(),
            len,
            mode,
            epoch: u64::MAX,
        });
        Ok(Some(rounded))
    }

    /// How the CPU rounds `len` activations for its dot products with `w`: the mode of
    /// `quantize_x.wgsl` and the values a block, or `None` where it keeps them (F32) or `len`
    /// is not whole blocks.
    fn rounding(&self, w: &Weight, len: usize) -> Option<(u32, usize)> {
        use GgmlType::*;
        let exact = exact_kernel(self.exact_matmul, w).is_some();
        let (mode, block) = match w.ty {
            Q8_0 | Q5_0 | Q4_0 | IQ4_NL if exact => (4, 32),
            Q4_1 | Q5_1 if exact => (6, 32),
            Q2_K | Q3_K | Q4_K | Q5_K | Q6_K | IQ4_XS if exact => (5, 256),
            Q4_0 | Q4_1 | Q5_0 | Q5_1 | Q8_0 | IQ4_NL => (0, 32),
            F16 => (1, 32),
            BF16 => (2, 32),
            Q2_K | Q3_K | Q4_K | Q5_K | Q6_K | IQ4_XS => (3, 256),
            _ => return None,
        };
        (len.is_multiple_of(block) && len > 0).then_some((mode, block))
    }

    /// The scratch buffer of rounded activations, large enough for `len` values.
    fn rounded_buffer(
        &self,
        scratch: &mut RoundedX,
        len: usize,
    ) -> Result<wgpu::Buffer, BackendError> {
        let bytes = len as u64 * 4;
        match &scratch.buffer {
            Some(buffer) if buffer.size() >= bytes => Ok(buffer.clone()),
            _ => {
                // Earlier recorded dispatches keep the smaller buffer alive.
                let buffer = self.new_buffer("matmul", bytes)?;
                scratch.buffer = Some(buffer.clone());
                Ok(buffer)
            }
        }
    }

    /// The gated activation of `len` values (`gate` becomes the hidden layer) and the
    /// rounding of its results for a matmul by `next` in one dispatch (`gated_quantize.wgsl`),
    /// left for that matmul as `activations_as_cpu` leaves its own. Returns `false`, having
    /// recorded nothing, where `next` takes no rounding of `len` values: the caller then runs
    /// `gated_activation`.
    pub(crate) fn gated_activation_rounded(
        &self,
        activation: Activation,
        gate: &mut Buffer,
        up: &Buffer,
        len: usize,
        next: &Weight,
    ) -> Result<bool, BackendError> {
        const OP: &str = "gated_activation";
        at_least(OP, "up elements", len, up.len())?;
        at_least(OP, "gate elements", len, gate.len())?;
        let Some((mode, block)) = self.rounding(next, len) else {
            return Ok(false);
        };
        let (up, gate) = (buffer(up, OP, "up")?, buffer(gate, OP, "gate")?);
        let mut scratch = self.rounded_x.lock().unwrap_or_else(|p| p.into_inner());
        let rounded = self.rounded_buffer(&mut scratch, len)?;
        let blocks = len / block;
        let params = [
            blocks as u32,
            mode,
            0,
            len as u32,
            crate::ops::activation_kind(activation),
            block as u32,
        ];
        let buffers = [gate, &rounded, up, &self.gelu_table];
        let kernel = Self::plain("gated_quantize");
        self.dispatch(OP, kernel, &params, &buffers, grid(blocks))?;
        scratch.of = Some(Rounded {
            source: gate.clone(),
            len,
            mode,
            epoch: self.epoch.load(Ordering::Relaxed),
        });
        Ok(true)
    }

    /// Marks the rounding `activations_as_cpu` made last as current, once the matmul's own
    /// dispatches are recorded.
    pub(crate) fn mark_rounding_current(&self) {
        let mut scratch = self.rounded_x.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(of) = scratch.of.as_mut() {
            of.epoch = self.epoch.load(Ordering::Relaxed);
        }
    }
}
