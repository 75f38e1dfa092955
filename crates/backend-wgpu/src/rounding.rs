//! A matmul's activations rounded as the CPU's dot products see them (`quantize_x.wgsl`), in
//! one scratch buffer that consecutive matmuls of one input share, and the ops that leave
//! that rounding for the next matmul: the gated activation (`gated_quantize.wgsl`) and the
//! residual add with the next norm (`add_rms_norm_quantize.wgsl`).

use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::atomic::Ordering;

use runit_backend::{Activation, BackendError, Buffer, OpResult, Weight};
use runit_quant::GgmlType;

use crate::backend::{grid, rows_grid};
use crate::bind_groups::FxBuild;
use crate::device::{at_least, buffer};
use crate::matmul::{exact_kernel, int8_bytes};
use crate::WgpuBackend;

/// The scratch buffer of rounded activations and what it holds, and what the norms have
/// learned of the matmuls that read their results.
#[derive(Default)]
pub(crate) struct RoundedX {
    buffer: Option<wgpu::Buffer>,
    of: Option<Rounded>,
    /// The last norm recorded (`add_rms_norm_rows`): its output, until a matmul rounds it.
    last_norm: Option<NormOutput>,
    /// By norm weight (the hash of its buffer): the rounding mode and values a block that
    /// the matmul reading that norm's results took last. A stale or colliding entry costs a
    /// rounding the matmul does not use, never a result: the matmul checks what it gets.
    norm_modes: HashMap<u64, (u32, usize), FxBuild>,
}

/// A norm's output as `activations_as_cpu` recognises it: `len` values of `out` normalized
/// by the weight hashed `weight`, current while the backend's epoch is `epoch`.
struct NormOutput {
    out: wgpu::Buffer,
    len: usize,
    weight: u64,
    epoch: u64,
}

/// Norm weights remembered at most (a model has about two a layer); past it the table
/// starts again, so that a backend serving model after model does not grow it without end.
const MAX_NORM_MODES: usize = 4096;

impl RoundedX {
    /// Marks the buffer as holding the first `len` values of `source` rounded in `mode`,
    /// current at `epoch`.
    fn holds(&mut self, source: &wgpu::Buffer, len: usize, mode: u32, epoch: u64) {
        self.of = Some(Rounded {
            source: source.clone(),
            len,
            mode,
            epoch,
        });
    }
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
        // A norm's results rounded here: the norm rounds them itself from the next step on.
        if let Some(norm) = scratch
            .last_norm
            .take_if(|norm| norm.out == *source && norm.len == len && norm.epoch == epoch)
        {
            if scratch.norm_modes.len() >= MAX_NORM_MODES {
                scratch.norm_modes.clear();
            }
            scratch.norm_modes.insert(norm.weight, (mode, block));
        }
        let rounded = self.rounded_buffer(&mut scratch, len)?;
        let blocks = len / block;
        let params = [blocks as u32, mode];
        let kernel = Self::plain("quantize_x");
        // A workgroup per 256 values (quantize_coop.wgsl): an invocation per four.
        self.dispatch(
            "matmul",
            kernel,
            &params,
            &[source, &rounded],
            grid(len.div_ceil(4)),
        )?;
        // Marked as current once the matmul's own dispatches are recorded (`matmul_rows`).
        scratch.holds(source, len, mode, u64::MAX);
        Ok(Some(rounded))
    }

    /// How the CPU rounds `len` activations for its dot products with `w`: the mode of
    /// `quantize_x.wgsl` and the values a block, or `None` where it keeps them (F32) or `len`
    /// is not whole blocks. The int8 matrix-vector kernel takes the same roundings kept as
    /// integers and scales (modes 7 and 8).
    pub(crate) fn rounding(&self, w: &Weight, len: usize) -> Option<(u32, usize)> {
        use GgmlType::*;
        let exact = exact_kernel(self.exact_matmul, w).is_some();
        let n = w.row_len();
        let int8 = n > 0 && len.is_multiple_of(n) && self.int8_matvec(w, len / n).is_some();
        let (mode, block) = match w.ty {
            Q8_0 | Q5_0 | Q4_0 | Q4_1 if int8 => (7, 32),
            Q4_K | Q5_K | Q6_K if int8 => (8, 256),
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
        // f32 values, or the int8 layout's groups (larger for fewer than 72 values).
        let bytes = (len as u64 * 4).max(int8_bytes(len));
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
        self.dispatch(OP, kernel, &params, &buffers, grid(len.div_ceil(4)))?;
        scratch.holds(gate, len, mode, self.epoch.load(Ordering::Relaxed));
        Ok(true)
    }

    /// `x += delta`, then `out` = the RMS norm of `x` by `w` (`eps`), for `rows` rows of
    /// `width` (`FusedOps::add_rms_norm`), in one dispatch; with, in that dispatch, the
    /// rounding of `out` that the matmul which read this norm's results last took
    /// (`add_rms_norm_quantize.wgsl`), left for the next matmul as `activations_as_cpu`
    /// leaves its own. When the norm records, the matmul that will read it is not known; a
    /// decode step repeats the last step's ops, so the last step's rounding is the guess,
    /// and a wrong one only costs the rounding's time (the matmul rounds again).
    pub(crate) fn add_rms_norm_rows(
        &self,
        [x, w, out, delta]: [&wgpu::Buffer; 4],
        width: usize,
        rows: usize,
        eps: f32,
    ) -> OpResult {
        const OP: &str = "add_rms_norm";
        let len = rows * width;
        let weight = FxBuild::default().hash_one(w);
        let [gx, gy, _] = rows_grid(rows);
        let held = self.norm_held(width);
        let mut scratch = self.rounded_x.lock().unwrap_or_else(|p| p.into_inner());
        let guess = scratch.norm_modes.get(&weight).copied();
        match guess.filter(|&(_, block)| width.is_multiple_of(block)) {
            Some((mode, _)) => {
                let rounded = self.rounded_buffer(&mut scratch, len)?;
                let params = [width as u32, rows as u32, eps.to_bits(), gx, 0, mode, held];
                let buffers = [x, w, out, delta, &rounded];
                let kernel = self.norm_kernel("add_rms_norm_quantize", width);
                self.dispatch(OP, kernel, &params, &buffers, [gx, gy, 1])?;
                scratch.holds(out, len, mode, self.epoch.load(Ordering::Relaxed));
            }
            None => {
                let params = [width as u32, rows as u32, eps.to_bits(), gx, 0, 0, held];
                let buffers = [x, w, out, delta];
                self.dispatch(
                    OP,
                    self.norm_kernel(OP, width),
                    &params,
                    &buffers,
                    [gx, gy, 1],
                )?;
            }
        }
        scratch.last_norm = Some(NormOutput {
            out: out.clone(),
            len,
            weight,
            epoch: self.epoch.load(Ordering::Relaxed),
        });
        Ok(())
    }

    /// quantize_x.wgsl's mode for rounding `len` activations of a matmul by `next` from the
    /// outputs of heads of `head_dim` values, and the heads a block spans: 1 where blocks
    /// fall within heads (attention_chunk_quantize.wgsl, attention_merge_quantize.wgsl), n
    /// where a block is n whole heads (attention_merge_quantize.wgsl's groups of heads: a
    /// Q8_K block of 256 values is two heads of 128); `None` where the matmul takes no
    /// rounding or blocks and heads cut across each other.
    pub(crate) fn head_rounding(
        &self,
        next: &Weight,
        len: usize,
        head_dim: usize,
    ) -> Option<(u32, usize)> {
        let (mode, block) = self.rounding(next, len)?;
        if head_dim.is_multiple_of(block) {
            return Some((mode, 1));
        }
        (head_dim > 0 && block.is_multiple_of(head_dim)).then_some((mode, block / head_dim))
    }

    /// The scratch buffer, large enough for `len` rounded values, for a kernel that rounds
    /// its own output ([`WgpuBackend::leave_rounding`] then marks what it holds).
    pub(crate) fn rounding_target(&self, len: usize) -> Result<wgpu::Buffer, BackendError> {
        let mut scratch = self.rounded_x.lock().unwrap_or_else(|p| p.into_inner());
        self.rounded_buffer(&mut scratch, len)
    }

    /// Marks the scratch buffer as holding the first `len` values of `source` rounded in
    /// `mode` by the dispatch just recorded, for the next matmul of `source`.
    pub(crate) fn leave_rounding(&self, source: &wgpu::Buffer, len: usize, mode: u32) {
        let mut scratch = self.rounded_x.lock().unwrap_or_else(|p| p.into_inner());
        scratch.holds(source, len, mode, self.epoch.load(Ordering::Relaxed));
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
