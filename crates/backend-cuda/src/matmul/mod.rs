//! Matrix multiplication `out[t] = W · x[t]` on weights kept in their packed GGUF formats.
//!
//! Three paths, chosen by the number of token rows:
//! - decode matvecs (one row of quantized weights, up to `MATVEC_MAX_TOKENS` of float
//!   weights, see [`matvec`]): fused dequantize + dot kernels that read each weight byte once
//!   for all rows; quantized weights are dotted with the activations quantized to q8_1 by
//!   `dp4a` (llama.cpp's MMVQ scheme), float weights with f32 activations;
//! - decode batches ([`mmq`]): tensor-core kernels reading each packed weight block once per
//!   tile of token rows (quantized weights from 2 rows, float weights beyond the matvecs);
//! - prompt processing ([`gemm`]): the weight dequantized to an f16 staging matrix (F16 used
//!   as is, F32 as f32) and the activations converted to f16, multiplied by cuBLAS on the
//!   tensor cores with f32 accumulation.
//!
//! Decode kernels also fuse two epilogues: a bias added to every output row
//! ([`matmul_bias`]) and, for a SwiGLU FFN, both the gate and up rows' dots combined as
//! `silu(gate) * up` ([`gated_ffn_hidden`]). Their expert-indexed twins ([`experts`]) run the
//! experts of a mixture-of-experts FFN with the expert of each row read from device memory.
//!
//! [`MatmulState`] owns the scratch memory both paths reuse between calls: the q8_1
//! activations, the f16 staging buffers and the cuBLAS handle. Scratch is allocated on first
//! use and grown when a larger shape arrives, never while a graph is being captured (call
//! [`prepare`] before a capture so that decode needs no allocation).

mod cublas;
pub(crate) mod experts;
mod gemm;
mod matvec;
pub(crate) mod mmq;

pub(crate) mod names;

use std::sync::{Mutex, MutexGuard};

use cudarc::driver::{CudaSlice, DeviceRepr, ValidAsZeroBits};
use runit_backend::{
    Activation, BackendError, Buffer, Device, GatedFfnRun, PrimitiveOps, Projection, Weight,
};
use runit_quant::GgmlType;

use crate::memory::{buffer_ptr, check_len, weight_ptr};
use crate::{device_address, CudaBackend};

/// Token rows up to which the decode matvec kernels are used (their largest variant).
pub const MATVEC_MAX_TOKENS: usize = 8;

const OP: &str = "matmul";

/// Launches kernel `$name` of `$file` (both `&'static str` values, not only literals) with
/// the given arguments: the crate's `launch!`.
macro_rules! launch_kernel {
    ($($tokens:tt)*) => {
        $crate::launch!($($tokens)*)
    };
}
pub(crate) use launch_kernel;

/// Scratch memory of the matmul kernels, kept between calls (one stream orders all work, so
/// reusing it in the next call is safe).
#[derive(Default)]
pub struct MatmulState {
    scratch: Mutex<Scratch>,
}

#[derive(Default)]
struct Scratch {
    /// q8_1 activations of the decode path: int8 values, then (d, d·sum) pairs.
    q8_1: Option<CudaSlice<u8>>,
    /// f16 copy of the activations (batched and GEMM paths).
    half_x: Option<CudaSlice<u16>>,
    /// Partial sums of the batched kernels' ranges of the row length.
    partial: Option<CudaSlice<f32>>,
    /// The up projection's partial sums while the gate's wait in `partial` (a batched SwiGLU
    /// merges both in its activation kernel).
    partial_second: Option<CudaSlice<f32>>,
    /// V's partial sums while Q's and K's wait in the two above (a batched Q/K/V projection
    /// merges the three in one launch).
    partial_third: Option<CudaSlice<f32>>,
    /// f16 dequantized weight rows (GEMM path).
    half_weight: Option<CudaSlice<u16>>,
    blas: Option<cublas::Blas>,
    /// What `q8_1` holds. Q, K and V (and gate and up) read one input, so the second and
    /// third matmul reuse its quantization.
    quantized: Option<Converted>,
    /// What `half_x` holds.
    halved: Option<Converted>,
    /// Blocks of each pipelined kernel the device holds at once (`mmq::run`).
    resident: std::collections::HashMap<&'static str, usize>,
    /// The q8 rounding mode (0-2) of the last f16 conversion of rows of each length: an add +
    /// norm writes its output's conversion in that mode ([`half_target`]).
    modes: std::collections::HashMap<usize, u32>,
}

/// A conversion of a matmul input held in scratch memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Converted {
    /// Address of the f32 input.
    x: u64,
    tokens: usize,
    row_len: usize,
    /// The backend's write generation when it was converted.
    generation: u64,
    /// Address of the scratch holding the conversion.
    scratch: u64,
    /// The rounding mode (see [`activation_mode`]).
    mode: u32,
}

impl Converted {
    /// True when a write to `out` may have changed the converted input.
    fn overlaps(&self, out: std::ops::Range<u64>) -> bool {
        let input = self.x..self.x + (self.tokens * self.row_len * 4) as u64;
        input.start < out.end && out.start < input.end
    }
}

impl Scratch {
    /// Records that `half` holds the mode-`mode` f16 conversion of the `rows` × `width` values
    /// at `x`, written by the launch just made. Called after that launch, which counts as a
    /// write of activations (so every other conversion held is stale).
    fn hold_half(
        &mut self,
        backend: &CudaBackend,
        x: u64,
        rows: usize,
        width: usize,
        half: u64,
        mode: u32,
    ) {
        self.halved = Some(Converted {
            x,
            tokens: rows,
            row_len: width,
            generation: backend.write_generation(),
            scratch: half,
            mode,
        });
    }
}

impl MatmulState {
    fn lock(&self) -> MutexGuard<'_, Scratch> {
        self.scratch.lock().expect("matmul scratch lock")
    }
}

/// Returns the device address of `slot`, (re)allocating it to hold at least `len` elements.
/// Allocation is refused during a graph capture.
fn ensure<T: DeviceRepr + ValidAsZeroBits>(
    backend: &CudaBackend,
    slot: &mut Option<CudaSlice<T>>,
    len: usize,
    what: &str,
) -> Result<u64, BackendError> {
    if let Some(slice) = slot.as_ref().filter(|s| s.len() >= len) {
        return Ok(device_address(slice, backend.stream()));
    }
    if backend.capturing() {
        return Err(BackendError::Device {
            backend: backend.name(),
            op: OP,
            message: format!(
                "the {what} scratch must grow to {len} elements while a graph is captured; \
                 run one uncaptured step (or matmul::prepare) first"
            ),
        });
    }
    if slot.take().is_some() {
        // Captured graphs hold the old address, which is freed now.
        backend.forget_graphs();
    }
    let slice = backend
        .stream()
        .alloc_zeros::<T>(len.max(1))
        .map_err(|e| backend.driver_error(OP, e))?;
    let ptr = device_address(&slice, backend.stream());
    *slot = Some(slice);
    Ok(ptr)
}

/// Row length the decode scratch is first allocated for (it grows for longer rows).
pub const PREPARED_ROW_LEN: usize = 1 << 16;

/// Allocates the decode scratch for rows of up to `max_row_len` elements, so that decode
/// matmuls (and a capture of them) never allocate. Without this call the first decode
/// matmul allocates it (for rows up to [`PREPARED_ROW_LEN`]), so only a capture that is the
/// very first use needs it.
#[allow(dead_code)] // for CudaBackend::new / warm_up
pub fn prepare(backend: &CudaBackend, max_row_len: usize) -> Result<(), BackendError> {
    let mut scratch = backend.matmul_state().lock();
    let len = matvec::q8_1_bytes(MATVEC_MAX_TOKENS, max_row_len.next_multiple_of(32));
    ensure(backend, &mut scratch.q8_1, len, "q8_1 activation").map(|_| ())
}

/// True when [`matmul`] handles weights of type `ty`.
pub fn supports(ty: GgmlType) -> bool {
    names::kernels(ty).is_some()
}

/// `out[t][o] = sum_i W[o][i] * x[t][i]` for `t < tokens`.
pub fn matmul(
    backend: &CudaBackend,
    weight: &Weight,
    x: &Buffer,
    tokens: usize,
    out: &mut Buffer,
) -> Result<(), BackendError> {
    let projection = Projection { weight, bias: None };
    matmul_bias(backend, projection, x, tokens, out)
}

/// [`matmul`] plus `bias[o]` (an F32 vector of the weight's row count) on every output row:
/// added in the decode kernels' epilogue, or by `add_bias_f32` after a GEMM. A bias of another
/// length is added as [`PrimitiveOps::add_bias`] adds it, after the matmul.
pub fn matmul_bias(
    backend: &CudaBackend,
    projection: Projection<'_>,
    x: &Buffer,
    tokens: usize,
    out: &mut Buffer,
) -> Result<(), BackendError> {
    let Projection { weight, bias } = projection;
    if let Some(bias) = bias.filter(|b| b.row_len() != weight.rows()) {
        matmul(backend, weight, x, tokens, out)?;
        return backend.add_bias(out, bias, tokens);
    }
    let bias = match bias {
        Some(bias) => {
            crate::ops::elementwise::f32_weight(backend, OP, "bias", bias, weight.rows())?
        }
        None => 0,
    };
    let Some((kernels, operands)) = operands(backend, weight, x, tokens, out, bias)? else {
        return Ok(());
    };
    let mut scratch = backend.matmul_state().lock();
    forget_overwritten(&mut scratch, &operands);
    let batched = batched_path(weight.ty, &kernels, tokens, operands.n_in);
    if takes_matvec(tokens, batched) {
        matvec::run(backend, &kernels, &operands, &mut scratch)
    } else if let Some(path) = batched {
        mmq::run(backend, path, &operands, &mut scratch)
    } else if matvec_only() {
        // Diagnostics: every row through the decode kernels, 8 rows at a time.
        for first in (0..tokens).step_by(MATVEC_MAX_TOKENS) {
            let rows = MATVEC_MAX_TOKENS.min(tokens - first);
            let part = Operands {
                x: operands.x + (first * operands.n_in * 4) as u64,
                out: operands.out + (first * operands.n_out * 4) as u64,
                tokens: rows,
                ..operands
            };
            matvec::run(backend, &kernels, &part, &mut scratch)?;
        }
        Ok(())
    } else {
        gemm::run(backend, weight.ty, &kernels, &operands, &mut scratch)?;
        if operands.bias == 0 {
            return Ok(());
        }
        // Launched as part of the matmul (no new write generation): it changes only `out`,
        // which `forget_overwritten` already accounted for, so a quantized input stays valid.
        let len = tokens * operands.n_out;
        launch_kernel!(
            backend,
            OP,
            "elementwise.cu",
            "add_bias_f32",
            crate::grid_for(len),
            operands.out,
            operands.bias,
            operands.n_out as u64,
            len as u64
        )
    }
}

/// Q, K and V projections of one input (`biases` all or none): one decode kernel for all
/// three when they share the type, row length and K/V shape (quantized types, up to
/// [`MATVEC_MAX_TOKENS`] rows, biases of the weights' row counts), else three [`matmul_bias`].
/// Each output equals its [`matmul_bias`] bit for bit.
pub fn matmul_qkv(
    backend: &CudaBackend,
    projections: [Projection<'_>; 3],
    x: &Buffer,
    tokens: usize,
    outs: [&mut Buffer; 3],
) -> Result<(), BackendError> {
    let [q, k, v] = projections.map(|projection| projection.weight);
    let biases = projections.map(|projection| projection.bias);
    let fits = |w: &Weight, b: Option<&Weight>| b.is_none_or(|b| b.row_len() == w.rows());
    let same = q.ty == k.ty
        && q.ty == v.ty
        && q.row_len() == k.row_len()
        && q.row_len() == v.row_len()
        && k.shape == v.shape
        && biases.iter().all(|b| b.is_some()) == biases.iter().any(|b| b.is_some())
        && fits(q, biases[0])
        && fits(k, biases[1])
        && fits(v, biases[2]);
    if same && !matvec_only() && takes_matvec_rows(q, tokens) {
        let bias = |b: Option<&Weight>, w: &Weight| match b {
            Some(b) => crate::ops::elementwise::f32_weight(backend, OP, "bias", b, w.rows()),
            None => Ok(0),
        };
        let (bq, bk, bv) = (
            bias(biases[0], q)?,
            bias(biases[1], k)?,
            bias(biases[2], v)?,
        );
        if let (Some((kernels, oq)), Some((_, ok)), Some((_, ov))) = (
            operands(backend, q, x, tokens, outs[0], bq)?,
            operands(backend, k, x, tokens, outs[1], bk)?,
            operands(backend, v, x, tokens, outs[2], bv)?,
        ) {
            let mut scratch = backend.matmul_state().lock();
            for op in [&oq, &ok, &ov] {
                forget_overwritten(&mut scratch, op);
            }
            if matvec::run_qkv(backend, &kernels, &oq, &ok, &ov, &mut scratch)? {
                return Ok(());
            }
        }
    }
    if qkv_over_unmerged(backend, projections, x, tokens, &outs)? {
        return Ok(());
    }
    runit_backend::unfused::matmul_qkv(backend, projections, x, tokens, outs)
}

/// The batched Q/K/V projections when all three take the pipelined kernels: the three
/// launched without their merges, then one `mmqp_merge3` for the row blocks cut in any of
/// them (two merge launches fewer than three [`matmul_bias`], the same sums in the same
/// order). False (nothing launched) when a projection takes another path or a bias is not of
/// its weight's row count, or with `RUNIT_CUDA_QKV_MERGE=0` (a measuring knob).
fn qkv_over_unmerged(
    backend: &CudaBackend,
    projections: [Projection<'_>; 3],
    x: &Buffer,
    tokens: usize,
    outs: &[&mut Buffer; 3],
) -> Result<bool, BackendError> {
    static ENABLED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let enabled =
        *ENABLED.get_or_init(|| std::env::var("RUNIT_CUDA_QKV_MERGE").map_or(true, |v| v != "0"));
    if !enabled {
        return Ok(false);
    }
    let mut paths = [None; 3];
    for (path, projection) in paths.iter_mut().zip(&projections) {
        let weight = projection.weight;
        if projection
            .bias
            .is_some_and(|b| b.row_len() != weight.rows())
        {
            return Ok(false);
        }
        let Some(kernels) = names::kernels(weight.ty) else {
            return Ok(false);
        };
        let batched = batched_path(weight.ty, &kernels, tokens, weight.row_len());
        match batched {
            Some(found @ mmq::Path::Pipe { .. }) if !takes_matvec(tokens, batched) => {
                *path = Some(found)
            }
            _ => return Ok(false),
        }
    }
    let mut ops = Vec::with_capacity(3);
    for (projection, out) in projections.iter().zip(outs) {
        let bias = match projection.bias {
            Some(bias) => crate::ops::elementwise::f32_weight(
                backend,
                OP,
                "bias",
                bias,
                projection.weight.rows(),
            )?,
            None => 0,
        };
        // The outputs are written through their addresses only (`operands` reads `out`'s).
        match operands(backend, projection.weight, x, tokens, out, bias)? {
            Some((_, op)) => ops.push(op),
            None => return Ok(false),
        }
    }
    let mut scratch = backend.matmul_state().lock();
    for op in &ops {
        forget_overwritten(&mut scratch, op);
    }
    let slots = [
        mmq::Partials::First,
        mmq::Partials::Second,
        mmq::Partials::Third,
    ];
    let mut runs = Vec::with_capacity(3);
    for ((op, path), partials) in ops.iter().zip(paths).zip(slots) {
        let path = path.expect("every projection has its pipelined path");
        let unmerged = mmq::run_unmerged(backend, path, op, &mut scratch, partials)?.ok_or(
            BackendError::Device {
                backend: backend.name(),
                op: OP,
                message: "a batched Q/K/V matmul is not a pipelined one".into(),
            },
        )?;
        runs.push(unmerged);
    }
    drop(scratch);
    mmq::merge3(
        backend,
        tokens,
        [(&ops[0], runs[0]), (&ops[1], runs[1]), (&ops[2], runs[2])],
    )?;
    Ok(true)
}

/// `hidden[t] = silu(gate · x[t]) * (up · x[t])`: up to [`MATVEC_MAX_TOKENS`] rows in one
/// decode kernel per weight type (the same sums as two matmuls, then `silu_mul`), more rows
/// (or gate and up of different types or shapes) as the two matmuls and the activation,
/// with `up · x` in `up`.
pub fn gated_ffn_hidden(backend: &CudaBackend, run: GatedFfnRun<'_>) -> Result<(), BackendError> {
    let GatedFfnRun {
        ffn,
        x,
        tokens,
        up,
        hidden,
    } = run;
    let (gate, activation) = (ffn.gate, ffn.activation);
    let fits = match activation {
        Activation::Silu => gate.ty == ffn.up.ty && gate.shape == ffn.up.shape,
        // The fused decode kernel computes SwiGLU only.
        Activation::GeluTanh => false,
    };
    if !fits || !takes_matvec_rows(gate, tokens) {
        if matches!(activation, Activation::Silu)
            && takes_half_input(ffn.down, tokens, gate.rows())
            && silu_over_unmerged(backend, &ffn, x, tokens, hidden, up)?
        {
            return Ok(());
        }
        matmul(backend, gate, x, tokens, hidden)?;
        matmul(backend, ffn.up, x, tokens, up)?;
        if matches!(activation, Activation::Silu) && takes_half_input(ffn.down, tokens, gate.rows())
        {
            return silu_mul_half(backend, ffn.down, hidden, up, tokens, gate.rows());
        }
        return backend.gated_activation(activation, hidden, up, tokens * gate.rows());
    }
    let Some((kernels, operands)) = operands(backend, gate, x, tokens, hidden, 0)? else {
        return Ok(());
    };
    let up = weight_ptr(OP, "up weight", ffn.up)?;
    let mut scratch = backend.matmul_state().lock();
    forget_overwritten(&mut scratch, &operands);
    matvec::run_swiglu(backend, &kernels, &operands, up, &mut scratch)
}

/// Where an add + norm (`ops::fused::add_rms_norm`) over `rows` rows of `width` values writes
/// the f16 conversion of its output for the next batched matmul, and in which mode: batches
/// of at least [`pipe_min_rows`] rows (quantized weights take the batched kernels from there),
/// when the last conversion of rows of `width` values took q8 mode 0, 1 or 2 (the next matmul
/// over the output is then most likely of the same weight type: Q, K, V and gate, up share
/// one; O likewise in a model of one type). `None` otherwise. The matmul that reads the
/// output skips its own conversion when [`record_half`] recorded it and the mode matches;
/// else it converts as ever, so a wrong guess costs one f16 write.
///
/// Until session 44 only batches past the matvecs' 8 rows took it, so 2-8 rows converted the
/// norms' outputs in launches of their own (7B Q8_0, 8 rows, H100: 4.998 -> 4.894 ms a step).
/// Off with `RUNIT_CUDA_NORM_F16=0` (a measuring knob).
pub(crate) fn half_target(
    backend: &CudaBackend,
    rows: usize,
    width: usize,
) -> Result<Option<(u64, u32)>, BackendError> {
    static ENABLED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let enabled =
        *ENABLED.get_or_init(|| std::env::var("RUNIT_CUDA_NORM_F16").map_or(true, |v| v != "0"));
    if !enabled || rows < pipe_min_rows() || matvec_only() {
        return Ok(None);
    }
    let mut scratch = backend.matmul_state().lock();
    let Some(&mode) = scratch.modes.get(&width) else {
        return Ok(None);
    };
    let unit = if mode == 2 { 256 } else { 32 };
    if mode >= 3 || !width.is_multiple_of(unit) {
        return Ok(None);
    }
    let base = ensure(backend, &mut scratch.half_x, rows * width, "f16 activation")?;
    Ok(Some((base, mode)))
}

/// Records that `half` holds the mode-`mode` f16 conversion of the `rows` × `width` values at
/// `x`, written by the launch just made (as [`mmq::half_input`] records its own).
pub(crate) fn record_half(
    backend: &CudaBackend,
    x: u64,
    rows: usize,
    width: usize,
    half: u64,
    mode: u32,
) {
    let mut scratch = backend.matmul_state().lock();
    scratch.hold_half(backend, x, rows, width, half, mode);
}

/// The batched SwiGLU when gate and up take the pipelined kernels with one plan: both
/// launched without their merges (`mmqp_merge`), whose sums the activation kernel
/// (`silu_mul_merge_f16_cpu` in mmqp.cu) adds itself, in the same order, before SiLU, the
/// product and the down projection's f16 copy: `hidden` and `up` then hold what the two
/// matmuls and [`silu_mul_half`] leave. False (nothing launched) when the kernels or shapes
/// differ, or with `RUNIT_CUDA_SILU_MERGE=0` (a measuring knob).
fn silu_over_unmerged(
    backend: &CudaBackend,
    ffn: &runit_backend::GatedFfn<'_>,
    x: &Buffer,
    tokens: usize,
    hidden: &mut Buffer,
    up: &mut Buffer,
) -> Result<bool, BackendError> {
    static ENABLED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let enabled =
        *ENABLED.get_or_init(|| std::env::var("RUNIT_CUDA_SILU_MERGE").map_or(true, |v| v != "0"));
    let (gate, up_weight) = (ffn.gate, ffn.up);
    if !enabled || gate.ty != up_weight.ty || gate.shape != up_weight.shape {
        return Ok(false);
    }
    let width = gate.rows();
    let mode = activation_mode(ffn.down.ty);
    let Some(kernels) = names::kernels(gate.ty) else {
        return Ok(false);
    };
    let Some(path) = batched_path(gate.ty, &kernels, tokens, gate.row_len())
        .filter(|path| matches!(path, mmq::Path::Pipe { .. }))
    else {
        return Ok(false);
    };
    if takes_matvec(tokens, Some(path)) || mode >= 3 || !width.is_multiple_of(256) {
        return Ok(false);
    }
    let (Some((_, gate_op)), Some((_, up_op))) = (
        operands(backend, gate, x, tokens, hidden, 0)?,
        operands(backend, up_weight, x, tokens, up, 0)?,
    ) else {
        return Ok(true); // nothing to compute
    };
    if gate_op.out % 16 != 0 || up_op.out % 16 != 0 {
        return Ok(false); // the kernel reads and writes float4s
    }
    let mut scratch = backend.matmul_state().lock();
    forget_overwritten(&mut scratch, &gate_op);
    forget_overwritten(&mut scratch, &up_op);
    let launch = |scratch: &mut Scratch, op: &Operands, partials| {
        mmq::run_unmerged(backend, path, op, scratch, partials)?.ok_or(BackendError::Device {
            backend: backend.name(),
            op: OP,
            message: "the batched SwiGLU's matmul is not a pipelined one".into(),
        })
    };
    let g = launch(&mut scratch, &gate_op, mmq::Partials::First)?;
    let u = launch(&mut scratch, &up_op, mmq::Partials::Second)?;
    if (g.n_stages, g.share) != (u.n_stages, u.share) {
        // Same weights' shape and type, same rows: the plans cannot differ.
        return Err(BackendError::Device {
            backend: backend.name(),
            op: OP,
            message: format!("gate and up took different plans ({g:?}, {u:?})"),
        });
    }
    let values = tokens * width;
    let base = ensure(backend, &mut scratch.half_x, values, "f16 activation")?;
    launch_kernel!(
        backend,
        OP,
        "mmqp.cu",
        "silu_mul_merge_f16_cpu",
        // A warp per 256 values in every mode (activation_f16_cpu's grid in mode 2).
        gemm::convert_grid(values, 2),
        gate_op.out,
        up_op.out,
        base,
        values as u64,
        mode,
        width as u32,
        g.partial,
        u.partial,
        g.n_stages,
        g.share
    )?;
    scratch.hold_half(backend, gate_op.out, tokens, width, base, mode);
    Ok(true)
}

/// True when a matmul of `tokens` rows of `weight` over rows of `row_len` values reads its
/// input as f16 converted in a q8 rounding mode (`mmq::half_input`): the pipelined kernels and
/// the GEMM path of quantized weights (not the matvecs or the int8 kernels). Off with
/// `RUNIT_CUDA_SILU_F16=0` (the activation and the conversion as two kernels, for measuring).
fn takes_half_input(weight: &Weight, tokens: usize, row_len: usize) -> bool {
    static FUSED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let fused =
        *FUSED.get_or_init(|| std::env::var("RUNIT_CUDA_SILU_F16").map_or(true, |v| v != "0"));
    let Some(kernels) = names::kernels(weight.ty).filter(|_| fused) else {
        return false;
    };
    let batched = batched_path(weight.ty, &kernels, tokens, weight.row_len());
    weight.row_len() == row_len
        && activation_mode(weight.ty) < 3
        && !takes_matvec(tokens, batched)
        && !matvec_only()
        && !matches!(batched, Some(mmq::Path::Int8 { .. }))
}

/// `hidden = silu(hidden) * up` (`gated_activation`'s values) for `tokens` rows of `width`,
/// writing also the f16 conversion that `down`'s matmul reads (`silu_mul_f16_cpu`), recorded
/// in the scratch as `mmq::half_input` records its own, so that matmul skips its conversion.
fn silu_mul_half(
    backend: &CudaBackend,
    down: &Weight,
    hidden: &mut Buffer,
    up: &Buffer,
    tokens: usize,
    width: usize,
) -> Result<(), BackendError> {
    const ACTIVATION: &str = "silu_mul";
    let values = tokens * width;
    check_len(ACTIVATION, "up", up, values)?;
    check_len(ACTIVATION, "gate", hidden, values)?;
    let (gate, up) = (
        buffer_ptr(ACTIVATION, "gate", hidden)?,
        buffer_ptr(ACTIVATION, "up", up)?,
    );
    let mode = activation_mode(down.ty);
    let mut scratch = backend.matmul_state().lock();
    let base = ensure(backend, &mut scratch.half_x, values, "f16 activation")?;
    crate::launch!(
        backend,
        ACTIVATION,
        "convert.cu",
        "silu_mul_f16_cpu",
        gemm::convert_grid(values, mode),
        gate,
        up,
        base,
        values as u64,
        mode
    )?;
    scratch.hold_half(backend, gate, tokens, width, base, mode);
    Ok(())
}

/// Checks a matmul's shapes and gathers its device operands; `None` when there is nothing
/// to compute.
pub(crate) fn operands(
    backend: &CudaBackend,
    weight: &Weight,
    x: &Buffer,
    tokens: usize,
    out: &Buffer,
    bias: u64,
) -> Result<Option<(names::TypeKernels, Operands)>, BackendError> {
    let kernels = names::kernels(weight.ty).ok_or_else(|| BackendError::Unsupported {
        backend: backend.name(),
        op: OP,
        ty: weight.ty,
        tensor: weight.name.clone(),
    })?;
    let matrices: usize = weight.shape.iter().skip(2).product();
    if matrices != 1 {
        return Err(BackendError::Shape {
            op: OP,
            what: "matrices in the weight (use Weight::matrix)",
            expected: 1,
            found: matrices,
        });
    }
    let (n_in, n_out) = (weight.row_len(), weight.rows());
    let block = weight.ty.block_size();
    if n_in % block != 0 {
        return Err(BackendError::Shape {
            op: OP,
            what: "row length (a whole number of blocks)",
            expected: n_in.next_multiple_of(block),
            found: n_in,
        });
    }
    check_len(OP, "x (tokens × row length)", x, tokens * n_in)?;
    check_len(OP, "out (tokens × rows)", out, tokens * n_out)?;
    if u32::try_from(n_in.max(n_out)).is_err() {
        return Err(BackendError::Shape {
            op: OP,
            what: "weight dimension (below 2^32)",
            expected: u32::MAX as usize,
            found: n_in.max(n_out),
        });
    }
    if tokens == 0 || n_out == 0 {
        return Ok(None);
    }
    let operands = Operands {
        weight: weight_ptr(OP, "weight", weight)?,
        row_bytes: weight.row_bytes(),
        n_in,
        n_out,
        x: buffer_ptr(OP, "x", x)?,
        out: buffer_ptr(OP, "out", out)?,
        tokens,
        activation_mode: activation_mode(weight.ty),
        bias,
    };
    Ok(Some((kernels, operands)))
}

/// This matmul overwrites `out`: a converted copy of an input overlapping it is stale.
fn forget_overwritten(scratch: &mut Scratch, operands: &Operands) {
    let output = operands.out..operands.out + (operands.tokens * operands.n_out * 4) as u64;
    for slot in [&mut scratch.quantized, &mut scratch.halved] {
        if slot.is_some_and(|c| c.overlaps(output.clone())) {
            *slot = None;
        }
    }
}

/// How activations are rounded for weights of type `ty`, as the CPU backend (and ggml-cpu)
/// rounds them: 0 = Q8_0, 1 = Q8_1, 2 = Q8_K (the modes of `quantize_q8_cpu` and
/// `activation_f16_cpu` in convert.cu), 3 = f16, 4 = bf16, 5 = none (f32).
pub(crate) fn activation_mode(ty: GgmlType) -> u32 {
    use runit_quant::dot::ActivationFormat;
    match runit_quant::dot::activation_format(ty) {
        Some(ActivationFormat::Q8_0) => 0,
        Some(ActivationFormat::Q8_1) => 1,
        Some(ActivationFormat::Q8K) => 2,
        Some(ActivationFormat::F16) => 3,
        Some(ActivationFormat::BF16) => 4,
        _ => 5,
    }
}

/// Most token rows a matmul sends to the decode matvecs: [`MATVEC_MAX_TOKENS`], or fewer
/// with `RUNIT_CUDA_MATVEC_MAX` (for measuring the batched kernels on 2-8 rows).
fn matvec_rows() -> usize {
    static ROWS: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    crate::env_count(&ROWS, "RUNIT_CUDA_MATVEC_MAX", MATVEC_MAX_TOKENS).clamp(1, MATVEC_MAX_TOKENS)
}

/// Fewest token rows the pipelined batched kernels take from the matvecs (quantized
/// weights), or `RUNIT_CUDA_MMQP_MIN` (up to 9: never before the matvecs' limit). On an H200
/// (docs/perf-cuda.md, session 29) they decoded 4 and 8 rows of qwen2.5-7b Q4_K_M 1.37x and
/// 2.24x faster than the matvecs (Q8_0: 8 rows 1.76x; qwen2.5-0.5b Q8_0 1.10x): the matvecs
/// read each weight once per step too, but their dot products per row grow with the rows.
fn pipe_min_rows() -> usize {
    static ROWS: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    crate::env_count(&ROWS, "RUNIT_CUDA_MMQP_MIN", 2).clamp(2, MATVEC_MAX_TOKENS + 1)
}

/// The batched kernel a matmul of `tokens` rows of a `ty` weight would take, if any.
fn batched_path(
    ty: GgmlType,
    kernels: &names::TypeKernels,
    tokens: usize,
    n_in: usize,
) -> Option<mmq::Path> {
    mmq::path(ty, kernels, tokens, n_in).filter(|_| mmq_enabled() && !matvec_only())
}

/// True when a matmul of `tokens` rows whose batched kernel is `batched` takes the decode
/// matvecs: up to [`matvec_rows`] rows, unless the pipelined kernels take them.
fn takes_matvec(tokens: usize, batched: Option<mmq::Path>) -> bool {
    let pipe = matches!(batched, Some(mmq::Path::Pipe { .. })) && tokens >= pipe_min_rows();
    tokens <= matvec_rows() && !pipe
}

/// [`takes_matvec`] for `weight` (the fused Q/K/V and gate/up decode kernels are matvecs).
fn takes_matvec_rows(weight: &Weight, tokens: usize) -> bool {
    let batched = names::kernels(weight.ty)
        .and_then(|kernels| batched_path(weight.ty, &kernels, tokens, weight.row_len()));
    takes_matvec(tokens, batched)
}

/// `RUNIT_CUDA_MMQ=0`: decode batches beyond the matvecs take the GEMM path instead of the
/// batched kernels (for measuring one against the other).
fn mmq_enabled() -> bool {
    static ENABLED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ENABLED.get_or_init(|| std::env::var("RUNIT_CUDA_MMQ").map_or(true, |v| v != "0"))
}

/// `RUNIT_CUDA_MATVEC_ONLY=1`: prompts also use the decode kernels (slow; for checking
/// which path a numerical difference comes from).
fn matvec_only() -> bool {
    static ONLY: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ONLY.get_or_init(|| std::env::var("RUNIT_CUDA_MATVEC_ONLY").is_ok_and(|v| v == "1"))
}

/// The device operands of one matmul.
#[derive(Clone, Copy)]
pub(crate) struct Operands {
    pub(crate) weight: u64,
    pub(crate) row_bytes: usize,
    pub(crate) n_in: usize,
    pub(crate) n_out: usize,
    pub(crate) x: u64,
    pub(crate) out: u64,
    pub(crate) tokens: usize,
    /// How the activations are rounded (see [`activation_mode`]).
    activation_mode: u32,
    /// Device address of an f32 bias of `n_out` values added to every output row (0: none).
    bias: u64,
}
