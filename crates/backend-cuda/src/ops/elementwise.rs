//! Element-wise ops on f32 activations: the gated activations (SiLU: `silu_mul`, GELU:
//! `gelu_mul`), `scale` and `add_bias` (kernels/elementwise.cu; `add` and `copy` launch from
//! the backend itself), plus the argument checks the other ops of this crate share.

use runit_backend::{Activation, BackendError, Buffer, Device, Weight};
use runit_quant::GgmlType;

use crate::memory::{buffer_ptr, check_len, weight_ptr};
use crate::{grid_for, launch, CudaBackend};

/// `gate[i] = activation(gate[i]) * up[i]` for `i < len`. GELU goes through the backend's
/// copy of ggml's f16 table (`runit_backend::gelu`): exact, so both modes run its kernel.
pub fn gated_activation(
    backend: &CudaBackend,
    activation: Activation,
    gate: &mut Buffer,
    up: &Buffer,
    len: usize,
) -> Result<(), BackendError> {
    let op = match activation {
        Activation::Silu => "silu_mul",
        Activation::GeluTanh => "gelu_mul",
    };
    check_len(op, "up", up, len)?;
    check_len(op, "gate", gate, len)?;
    if len == 0 {
        return Ok(());
    }
    let gate = buffer_ptr(op, "gate", gate)?;
    let up = buffer_ptr(op, "up", up)?;
    match activation {
        Activation::Silu if backend.exact_numerics() => {
            crate::exact::ops::silu_mul(backend, gate, up, len)
        }
        Activation::Silu => launch!(
            backend,
            op,
            "elementwise.cu",
            "silu_mul_f32",
            grid_for(len),
            gate,
            up,
            len as u64
        ),
        Activation::GeluTanh => launch!(
            backend,
            op,
            "elementwise.cu",
            "gelu_mul_f32",
            grid_for(len),
            gate,
            up,
            backend.gelu_table(),
            len as u64
        ),
    }
}

/// `x[i] *= factor` for `i < len` (one rounded product: exact, so both modes run it).
pub fn scale(
    backend: &CudaBackend,
    x: &mut Buffer,
    factor: f32,
    len: usize,
) -> Result<(), BackendError> {
    const OP: &str = "scale";
    check_len(OP, "x", x, len)?;
    if len == 0 {
        return Ok(());
    }
    let x = buffer_ptr(OP, "x", x)?;
    launch!(
        backend,
        OP,
        "elementwise.cu",
        "scale_f32",
        grid_for(len),
        x,
        factor,
        len as u64
    )
}

/// `x[t] += bias` for the first `tokens` rows of width `bias.shape[0]` (an F32 bias).
pub fn add_bias(
    backend: &CudaBackend,
    x: &mut Buffer,
    bias: &Weight,
    tokens: usize,
) -> Result<(), BackendError> {
    const OP: &str = "add_bias";
    let width = bias.row_len();
    let len = product(OP, "tokens × width", tokens, width)?;
    let bias = f32_weight(backend, OP, "bias", bias, width)?;
    check_len(OP, "x", x, len)?;
    if len == 0 {
        return Ok(());
    }
    let x = buffer_ptr(OP, "x", x)?;
    launch!(
        backend,
        OP,
        "elementwise.cu",
        "add_bias_f32",
        grid_for(len),
        x,
        bias,
        width as u64,
        len as u64
    )
}

/// The device address of an F32 weight holding at least `needed` values; other types are
/// unsupported (norm, bias and rope-frequency tensors are F32 in GGUF files).
pub(crate) fn f32_weight(
    backend: &CudaBackend,
    op: &'static str,
    what: &'static str,
    weight: &Weight,
    needed: usize,
) -> Result<u64, BackendError> {
    if weight.ty != GgmlType::F32 {
        return Err(BackendError::Unsupported {
            backend: backend.name(),
            op,
            ty: weight.ty,
            tensor: weight.name.clone(),
        });
    }
    if weight.n_elements() < needed {
        return Err(BackendError::Shape {
            op,
            what,
            expected: needed,
            found: weight.n_elements(),
        });
    }
    weight_ptr(op, what, weight)
}

/// `a × b`, or a shape error naming `what` when it overflows.
pub(crate) fn product(
    op: &'static str,
    what: &'static str,
    a: usize,
    b: usize,
) -> Result<usize, BackendError> {
    a.checked_mul(b).ok_or(BackendError::Shape {
        op,
        what,
        expected: usize::MAX,
        found: a.saturating_mul(b),
    })
}

/// `value` as a kernel's `u32` argument, or a shape error naming `what`.
pub(crate) fn to_u32(
    op: &'static str,
    what: &'static str,
    value: usize,
) -> Result<u32, BackendError> {
    u32::try_from(value).map_err(|_| BackendError::Shape {
        op,
        what,
        expected: u32::MAX as usize,
        found: value,
    })
}

/// Threads for a block looping over `n` values: a multiple of 32 in `32 ..= max`.
pub(crate) fn threads_for(n: usize, max: u32) -> u32 {
    (n.div_ceil(32) * 32).clamp(32, max as usize) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thread_counts_are_whole_warps_within_bounds() {
        assert_eq!(threads_for(0, 256), 32);
        assert_eq!(threads_for(1, 256), 32);
        assert_eq!(threads_for(33, 256), 64);
        assert_eq!(threads_for(96, 256), 96);
        assert_eq!(threads_for(100_000, 256), 256);
    }

    #[test]
    fn oversized_arguments_are_shape_errors() {
        assert!(matches!(
            to_u32("op", "rows", 1 << 33),
            Err(BackendError::Shape { found, .. }) if found == 1 << 33
        ));
        assert_eq!(to_u32("op", "rows", 7).ok(), Some(7));
        assert!(product("op", "rows × width", usize::MAX, 2).is_err());
        assert_eq!(product("op", "rows × width", 3, 4).ok(), Some(12));
    }
}
