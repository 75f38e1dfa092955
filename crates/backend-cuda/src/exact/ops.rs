//! The exact twins of the non-matmul ops (kernels/exact_ops.cu): RMSNorm, SwiGLU, RoPE and
//! attention. The ops that are exact in every mode (adds, copies, the KV write's f16
//! rounding, dequantizing embedding lookups, the MoE gather and combine) keep their kernels.

use std::sync::Mutex;

use cudarc::driver::{CudaSlice, LaunchConfig};
use runit_backend::{BackendError, RopeParams, RopeStyle};

use crate::{grid_for, launch, CudaBackend, StepView};

/// Threads per block of the warp-per-row kernels (four warps).
const WARP_BLOCK: u32 = 128;

/// A launch of one warp per item for `items` items.
fn warps_for(items: usize) -> LaunchConfig {
    let blocks = items.div_ceil((WARP_BLOCK / 32) as usize).clamp(1, 65_535) as u32;
    LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: (WARP_BLOCK, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// `out = x / rms(x) * weight` per row (`out_ptr == x_ptr`: in place).
pub(crate) fn rms_norm(
    backend: &CudaBackend,
    x_ptr: u64,
    weight: u64,
    width: u32,
    eps: f32,
    rows: u32,
    out_ptr: u64,
) -> Result<(), BackendError> {
    const OP: &str = "rms_norm";
    let config = warps_for(rows as usize);
    if x_ptr == out_ptr {
        launch!(
            backend,
            OP,
            "exact_ops.cu",
            "exact_rms_norm_in_place",
            config,
            x_ptr,
            weight,
            width,
            eps,
            rows
        )
    } else {
        launch!(
            backend,
            OP,
            "exact_ops.cu",
            "exact_rms_norm",
            config,
            out_ptr,
            x_ptr,
            weight,
            width,
            eps,
            rows
        )
    }
}

/// `gate = silu(gate) * up` over the first `len` values.
pub(crate) fn silu_mul(
    backend: &CudaBackend,
    gate: u64,
    up: u64,
    len: usize,
) -> Result<(), BackendError> {
    launch!(
        backend,
        "silu_mul",
        "exact_ops.cu",
        "exact_silu_mul",
        grid_for(len),
        gate,
        up,
        len as u64
    )
}

/// The host-computed RoPE angles on the device, for one parameter set and positions
/// `0..positions` ([`RopeParams::angles`]: libm's `powf`, `cosf`, `sinf`, as the CPU).
#[derive(Default)]
pub(crate) struct AngleTable {
    table: Mutex<Option<Angles>>,
}

struct Angles {
    /// theta and freq_scale bits, rotary_dim, the device address of the frequency factors
    /// (0 without; a weight's values never change), and YaRN's corrections.
    key: (u32, u32, usize, u64, Option<[u32; 5]>),
    positions: usize,
    /// The table's device memory (`ptr` points into it; dropped when the table is rebuilt).
    _memory: CudaSlice<f32>,
    ptr: u64,
}

/// Rotates the first `rotary_dim` dims of every head of the step's tokens (positions from
/// `step`, `max_position` their largest; `factors`: the device address of `rope_freqs`).
pub(crate) fn rope(
    backend: &CudaBackend,
    x: u64,
    step: &StepView,
    tokens: usize,
    max_position: u32,
    params: &RopeParams,
    factors: Option<u64>,
) -> Result<(), BackendError> {
    const OP: &str = "rope";
    let pairs = params.rotary_dim / 2;
    let key = (
        params.theta.to_bits(),
        params.freq_scale.to_bits(),
        params.rotary_dim,
        factors.unwrap_or(0),
        params.yarn.map(|yarn| {
            [
                yarn.ext_factor.to_bits(),
                yarn.attn_factor.to_bits(),
                yarn.beta_fast.to_bits(),
                yarn.beta_slow.to_bits(),
                yarn.original_context,
            ]
        }),
    );
    let positions = max_position as usize + 1;
    let mut table = backend
        .exact_angles()
        .table
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    if !table
        .as_ref()
        .is_some_and(|t| t.key == key && t.positions >= positions)
    {
        let factors = match factors {
            Some(ptr) => Some(download_f32(backend, OP, ptr, pairs)?),
            None => None,
        };
        // Room for positions beyond these, so that decoding does not rebuild it every step.
        let positions = positions.next_power_of_two().max(64);
        let mut values = vec![0.0f32; positions * pairs * 2];
        let mut cache = vec![(0.0f32, 0.0f32); pairs];
        for (p, row) in values.chunks_exact_mut(pairs * 2).enumerate() {
            params.angles(p as u32, factors.as_deref(), &mut cache);
            for (slot, &(cos, sin)) in row.chunks_exact_mut(2).zip(&cache) {
                slot[0] = cos;
                slot[1] = sin;
            }
        }
        let (memory, ptr) = backend.upload_small(OP, &values)?;
        *table = Some(Angles {
            key,
            positions,
            _memory: memory,
            ptr,
        });
    }
    let angles = table.as_ref().expect("filled above");
    launch!(
        backend,
        OP,
        "exact_ops.cu",
        "exact_rope",
        grid_for(tokens * params.heads * pairs),
        x,
        step.ptr,
        angles.ptr,
        angles.positions as u32,
        params.heads as u32,
        params.head_dim as u32,
        params.rotary_dim as u32,
        u32::from(params.style == RopeStyle::Neox)
    )
}

/// `len` f32 values at device address `ptr`, copied to the host.
fn download_f32(
    backend: &CudaBackend,
    op: &'static str,
    ptr: u64,
    len: usize,
) -> Result<Vec<f32>, BackendError> {
    let mut values = vec![0.0f32; len];
    backend
        .stream()
        .synchronize()
        .map_err(|e| backend.driver_error(op, e))?;
    // SAFETY: `ptr` is the start of a live device weight of at least `len` f32 values (the
    // caller checked its element count); the stream was synchronized, so it is written.
    unsafe { cudarc::driver::result::memcpy_dtoh_sync(&mut values, ptr) }
        .map_err(|e| backend.driver_error(op, e))?;
    Ok(values)
}

/// Attention of every span's rows, each span by the CPU's path for it (the one-chunk path
/// throughout in a pass whose rows are computed as if alone, as the CPU's).
#[allow(clippy::too_many_arguments)]
pub(crate) fn attention(
    backend: &CudaBackend,
    f16: bool,
    q: u64,
    k: u64,
    v: u64,
    step: &StepView,
    out: u64,
    end_row: usize,
    heads: u32,
    kv_heads: u32,
    head_dim: u32,
    scale: f32,
    window: u32,
) -> Result<(), BackendError> {
    let kernel = if f16 {
        "exact_attention_f16"
    } else {
        "exact_attention_f32"
    };
    launch!(
        backend,
        "attention",
        "exact_ops.cu",
        kernel,
        warps_for(end_row * heads as usize),
        q,
        k,
        v,
        step.ptr,
        out,
        heads,
        kv_heads,
        head_dim,
        scale,
        window,
        u32::from(backend.rows_alone())
    )
}
