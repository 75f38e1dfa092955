//! Rotary position embedding in place (kernels/rope.cu), with the positions read from the
//! step buffer; the angle follows the CPU reference's f32 recurrence exactly (see the kernel).

use cudarc::driver::LaunchConfig;
use runit_backend::{BackendError, Buffer, RopeParams, RopeStyle, Weight};

use super::elementwise::{f32_weight, product, threads_for, to_u32};
use crate::memory::{buffer_ptr, check_len};
use crate::{launch, CudaBackend};

const OP: &str = "rope";

/// Rotates the first `rotary_dim` dims of every head of the `positions.len()` rows of `x`.
pub fn rope(
    backend: &CudaBackend,
    x: &mut Buffer,
    positions: &[u32],
    params: &RopeParams,
    freq_factors: Option<&Weight>,
) -> Result<(), BackendError> {
    let (head_dim, rotary_dim) = (params.head_dim, params.rotary_dim);
    if !rotary_dim.is_multiple_of(2) || rotary_dim > head_dim {
        return Err(BackendError::Shape {
            op: OP,
            what: "rotary_dim (even, at most head_dim)",
            expected: head_dim,
            found: rotary_dim,
        });
    }
    let width = product(OP, "heads × head_dim", params.heads, head_dim)?;
    let len = product(OP, "tokens × width", positions.len(), width)?;
    check_len(OP, "x", x, len)?;
    let factors = freq_factors_address(backend, OP, freq_factors, rotary_dim)?;
    let x = buffer_ptr(OP, "x", x)?;
    if rotary_dim == 0 || len == 0 {
        return Ok(());
    }
    let tokens = to_u32(OP, "tokens", positions.len())?;
    let pairs = product(OP, "heads × rotary pairs", params.heads, rotary_dim / 2)?;
    let config = LaunchConfig {
        grid_dim: (tokens, 1, 1),
        block_dim: (threads_for(pairs, 256), 1, 1),
        shared_mem_bytes: to_u32(OP, "rotary_dim", rotary_dim * 4)?,
    };
    let theta_scale = theta_scale(params);
    let step = backend.step_inputs(OP, None, Some(positions), None, None)?;
    if backend.exact_numerics() {
        let max_position = positions.iter().copied().max().unwrap_or(0);
        return crate::exact::ops::rope(
            backend,
            x,
            &step,
            positions.len(),
            max_position,
            params,
            factors,
        );
    }
    let corrections = params.corrections();
    launch!(
        backend,
        OP,
        "rope.cu",
        "rope_f32",
        config,
        x,
        step.ptr,
        factors.unwrap_or(0),
        u32::from(factors.is_some()),
        to_u32(OP, "heads", params.heads)?,
        to_u32(OP, "head_dim", head_dim)?,
        to_u32(OP, "rotary_dim", rotary_dim)?,
        theta_scale,
        params.freq_scale,
        corrections.ext_factor,
        corrections.magnitude,
        corrections.ramp[0],
        corrections.ramp[1],
        u32::from(params.style == RopeStyle::Neox),
        tokens
    )
}

/// The per-pair frequency ratio `θ^(-2/rotary_dim)`, in f32 as the CPU reference computes it.
fn theta_scale(params: &RopeParams) -> f32 {
    params.theta.powf(-2.0 / params.rotary_dim as f32)
}

/// The device address of RoPE's frequency factors (`rotary_dim / 2` F32 values), checked
/// against the rotation; `None` without factors.
pub(super) fn freq_factors_address(
    backend: &CudaBackend,
    op: &'static str,
    freq_factors: Option<&Weight>,
    rotary_dim: usize,
) -> Result<Option<u64>, BackendError> {
    let Some(weight) = freq_factors else {
        return Ok(None);
    };
    if weight.n_elements() != rotary_dim / 2 {
        return Err(BackendError::Shape {
            op,
            what: "rope_freqs elements",
            expected: rotary_dim / 2,
            found: weight.n_elements(),
        });
    }
    f32_weight(backend, op, "rope_freqs", weight, rotary_dim / 2).map(Some)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn theta_scale_is_the_pair_ratio() {
        let params = RopeParams {
            style: RopeStyle::Normal,
            heads: 1,
            head_dim: 4,
            rotary_dim: 4,
            theta: 100.0,
            freq_scale: 1.0,
            yarn: None,
        };
        // base 100 over 4 dims: each pair turns 10 times slower than the one before.
        assert!((theta_scale(&params) - 0.1).abs() < 1e-7);
    }
}
