//! The mixture-of-experts FFN with its routing on the device (kernels/moe.cu, and the expert
//! matvecs of [`crate::matmul::experts`]).
//!
//! The router's logits come from the usual matmul; `moe_route` turns each token's row into
//! its experts and weights (`[tokens, used]` ids, then weights, in a table kept by the
//! backend), computed as the host's `route_tokens` computes them and ordered by expert index.
//! Then:
//! - up to [`DEVICE_MAX_TOKENS`] rows (decode): one gate-and-up (SwiGLU) and one down matvec
//!   over every (token, slot) pair, each reading its expert from the table, and `moe_combine`
//!   adding each token's slots in order. Nothing is read back, so a decode step is captured;
//! - more rows (prompts): only the table is read back (tokens × used ids and weights, not the
//!   logits), the rows are grouped per expert on the host and run through the trait default's
//!   gather / matmul (tensor cores) / scatter sequence, as llama.cpp's MUL_MAT_ID does for
//!   large batches.
//!
//! Both equal [`runit_backend::unfused::moe_ffn`] on this backend value for value, except
//! where the device's exponential differs from the host's in the last bit.

use cudarc::driver::LaunchConfig;
use runit_backend::{
    moe, unfused, BackendError, Buffer, Device, MoeFfn, MoeFfnRun, PrimitiveOps, Weight,
};

use super::elementwise::{product, threads_for, to_u32};
use crate::matmul::experts::{expert_matvec, ExpertRows};
use crate::memory::{buffer_ptr, check_len};
use crate::{grid_for, launch, CudaBackend};

/// Token rows up to which the experts run on the device from the routing table (the
/// decode matvecs' bound); larger batches group their rows per expert on the host.
pub const DEVICE_MAX_TOKENS: usize = crate::matmul::MATVEC_MAX_TOKENS;

/// Experts a router may have (the routing kernel keeps a token's probabilities in shared
/// memory).
const MAX_EXPERTS: usize = 4096;

const OP: &str = "moe_ffn";

/// [`runit_backend::FusedOps::moe_ffn`] on the device.
pub fn moe_ffn(
    backend: &CudaBackend,
    run: MoeFfnRun<'_>,
    out: &mut Buffer,
) -> Result<(), BackendError> {
    let (ffn, x, tokens) = (run.ffn, run.x, run.tokens);
    let (embd, ff) = check_shapes(&ffn)?;
    let rows_len = product(OP, "tokens × embd", tokens, embd)?;
    check_len(OP, "x", x, rows_len)?;
    check_len(OP, "out", out, rows_len)?;
    if tokens == 0 {
        return Ok(());
    }
    backend.matmul(ffn.router, x, tokens, &mut *run.scratch.router)?;
    let pairs = product(OP, "tokens × experts used", tokens, ffn.used)?;
    let table = backend.moe_routes(OP, 2 * pairs)?;
    let (ids, weights) = (table, table + 4 * pairs as u64);
    let route = LaunchConfig {
        grid_dim: (to_u32(OP, "tokens", tokens)?, 1, 1),
        block_dim: (32, 1, 1),
        shared_mem_bytes: (ffn.experts * 5).next_multiple_of(4) as u32,
    };
    launch!(
        backend,
        "moe_route",
        "moe.cu",
        "moe_route",
        route,
        buffer_ptr(OP, "router logits", run.scratch.router)?,
        ids,
        weights,
        ffn.experts as u32,
        ffn.used as u32,
        u32::from(ffn.renormalise)
    )?;
    if tokens > DEVICE_MAX_TOKENS {
        return grouped_on_host(backend, run, out);
    }
    let x = buffer_ptr(OP, "x", x)?;
    let out = buffer_ptr(OP, "out", out)?;
    let used = ffn.used;
    // [pairs, ff] SwiGLU activations (and [pairs, ff] up rows when gate and up differ in type
    // or shape, combined by silu_mul), then [pairs, embd] down outputs.
    let fused = ffn.gate.ty == ffn.up.ty && ffn.gate.shape == ffn.up.shape;
    let hidden_len = (pairs * ff).next_multiple_of(64);
    let hidden_rows = if fused { 1 } else { 2 };
    let base = backend.moe_activations(OP, hidden_len * hidden_rows + pairs * embd)?;
    let hidden = base;
    let up_rows = base + 4 * hidden_len as u64;
    let expert_out = base + 4 * (hidden_len * hidden_rows) as u64;
    let gate_up = |out: u64| ExpertRows {
        x,
        x_rows: tokens,
        x_group: used,
        pairs,
        ids,
        out,
    };
    if fused {
        expert_matvec(
            backend,
            "moe_gate_up",
            ffn.gate,
            Some(ffn.up),
            &gate_up(hidden),
        )?;
    } else {
        expert_matvec(backend, "moe_gate_up", ffn.gate, None, &gate_up(hidden))?;
        expert_matvec(backend, "moe_gate_up", ffn.up, None, &gate_up(up_rows))?;
        let len = pairs * ff;
        launch!(
            backend,
            "moe_gate_up",
            "elementwise.cu",
            "silu_mul_f32",
            grid_for(len),
            hidden,
            up_rows,
            len as u64
        )?;
    }
    let down = ExpertRows {
        x: hidden,
        x_rows: pairs,
        x_group: 1,
        pairs,
        ids,
        out: expert_out,
    };
    expert_matvec(backend, "moe_down", ffn.down, None, &down)?;
    let combine = LaunchConfig {
        grid_dim: (tokens as u32, 1, 1),
        block_dim: (threads_for(embd, 256), 1, 1),
        shared_mem_bytes: 0,
    };
    launch!(
        backend,
        "moe_combine",
        "moe.cu",
        "moe_combine",
        combine,
        out,
        expert_out,
        weights,
        used as u32,
        to_u32(OP, "embd", embd)?
    )
}

/// The prompt path: the routing table read back and grouped per expert, then the default's
/// expert sequence ([`unfused::moe_experts`]).
fn grouped_on_host(
    backend: &CudaBackend,
    run: MoeFfnRun<'_>,
    out: &mut Buffer,
) -> Result<(), BackendError> {
    let ffn = run.ffn;
    let pairs = run.tokens * ffn.used;
    let mut table = vec![0u32; 2 * pairs];
    backend.read_moe_routes(OP, &mut table)?;
    let (ids, weight_bits) = table.split_at(pairs);
    if let Some(id) = ids.iter().find(|&&id| id as usize >= ffn.experts) {
        return Err(BackendError::Device {
            backend: backend.name(),
            op: "moe_route",
            message: format!("routed a token to expert {id} of {}", ffn.experts),
        });
    }
    let weights: Vec<f32> = weight_bits
        .iter()
        .map(|&bits| f32::from_bits(bits))
        .collect();
    let routes = moe::group_by_expert(ids, &weights, ffn.used, ffn.experts);
    unfused::moe_experts(backend, run, &routes, out)
}

/// Checks the weights against each other and the routing rule; returns `(embd, ff)`.
fn check_shapes(ffn: &MoeFfn<'_>) -> Result<(usize, usize), BackendError> {
    let shape_error = |what: &'static str, expected: usize, found: usize| BackendError::Shape {
        op: OP,
        what,
        expected,
        found,
    };
    let (embd, ff, experts) = (ffn.gate.row_len(), ffn.gate.rows(), ffn.experts);
    if !(1..=MAX_EXPERTS).contains(&experts) {
        return Err(shape_error("experts (at most 4096)", MAX_EXPERTS, experts));
    }
    if !(1..=experts).contains(&ffn.used) {
        return Err(shape_error(
            "experts used (1 ..= experts)",
            experts,
            ffn.used,
        ));
    }
    let stacked = |w: &Weight| w.shape.get(2).copied().unwrap_or(1);
    let expect = [
        ("router row length (embd)", ffn.router.row_len(), embd),
        ("router rows (experts)", ffn.router.rows(), experts),
        ("up row length (embd)", ffn.up.row_len(), embd),
        ("up rows (ff)", ffn.up.rows(), ff),
        ("down row length (ff)", ffn.down.row_len(), ff),
        ("down rows (embd)", ffn.down.rows(), embd),
        ("gate matrices (experts)", stacked(ffn.gate), experts),
        ("up matrices (experts)", stacked(ffn.up), experts),
        ("down matrices (experts)", stacked(ffn.down), experts),
    ];
    for (what, found, expected) in expect {
        if found != expected {
            return Err(shape_error(what, expected, found));
        }
    }
    Ok((embd, ff))
}
