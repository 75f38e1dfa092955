//! Elementwise ops: residual `add`, `scale`, `add_bias` and the gated activations (SiLU,
//! GELU: `vector::gated`).
//!
//! `add` and `scale` are exact in any order, so plain loops (which the compiler vectorises)
//! serve every SIMD level. SiLU is ggml's `ggml_vec_swiglu_f32` (see `vector::silu_mul`); its
//! 16-value groups are counted from the start of the buffer, which equals ggml's per-row
//! grouping whenever the row width (the FFN width) is a multiple of 16. GELU is ggml's table
//! lookup (`runit_backend::gelu`).

use runit_backend::{Activation, BackendError, Buffer, Weight};

use crate::storage::{at_least, data, data_mut, product, weight_f32};
use crate::vector;
use crate::CpuBackend;

/// Elements per parallel chunk of the elementwise ops.
const CHUNK: usize = 1 << 14;

/// `dst[i] += src[i]` for `i < len`.
pub fn add(
    backend: &CpuBackend,
    dst: &mut Buffer,
    src: &Buffer,
    len: usize,
) -> Result<(), BackendError> {
    const OP: &str = "add";
    let src = data(src, OP, "src")?;
    at_least(OP, "src elements", len, src.len())?;
    let dst = data_mut(dst, OP, "dst")?;
    at_least(OP, "dst elements", len, dst.len())?;
    let body_len = len / CHUNK * CHUNK;
    let (body, tail) = dst[..len].split_at_mut(body_len);
    backend.for_rows(body, CHUNK, len / CHUNK, |chunk, out| {
        add_slices(out, &src[chunk * CHUNK..]);
    });
    add_slices(tail, &src[body_len..]);
    Ok(())
}

fn add_slices(dst: &mut [f32], src: &[f32]) {
    for (d, s) in dst.iter_mut().zip(src) {
        *d += s;
    }
}

/// `x[i] *= factor` for `i < len`.
pub fn scale(
    backend: &CpuBackend,
    x: &mut Buffer,
    factor: f32,
    len: usize,
) -> Result<(), BackendError> {
    const OP: &str = "scale";
    let x = data_mut(x, OP, "x")?;
    at_least(OP, "x elements", len, x.len())?;
    let body_len = len / CHUNK * CHUNK;
    let (body, tail) = x[..len].split_at_mut(body_len);
    backend.for_rows(body, CHUNK, len / CHUNK, |_, out| {
        vector::scale_f32(out, factor)
    });
    vector::scale_f32(tail, factor);
    Ok(())
}

/// `gate[i] = activation(gate[i]) * up[i]` for `i < len`.
pub fn gated_activation(
    backend: &CpuBackend,
    activation: Activation,
    gate: &mut Buffer,
    up: &Buffer,
    len: usize,
) -> Result<(), BackendError> {
    const OP: &str = "gated_activation";
    let up = data(up, OP, "up")?;
    at_least(OP, "up elements", len, up.len())?;
    let gate = data_mut(gate, OP, "gate")?;
    at_least(OP, "gate elements", len, gate.len())?;
    let isa = backend.isa;
    let body_len = len / CHUNK * CHUNK;
    let (body, tail) = gate[..len].split_at_mut(body_len);
    backend.for_rows(body, CHUNK, len / CHUNK, |chunk, out| {
        vector::gated(
            isa,
            activation,
            out,
            &up[chunk * CHUNK..(chunk + 1) * CHUNK],
        );
    });
    vector::gated(isa, activation, tail, &up[body_len..len]);
    Ok(())
}

/// `x[t] += bias` for the first `tokens` rows of width `bias.shape[0]`.
pub fn add_bias(
    backend: &CpuBackend,
    x: &mut Buffer,
    bias: &Weight,
    tokens: usize,
) -> Result<(), BackendError> {
    const OP: &str = "add_bias";
    let width = bias.row_len();
    let len = product(OP, "tokens × width", tokens, width)?;
    let b = weight_f32(bias, OP)?;
    at_least(OP, "bias elements", width, b.len())?;
    let x = data_mut(x, OP, "x")?;
    at_least(OP, "x elements", len, x.len())?;
    backend.for_rows(x, width, tokens, |_, row| add_slices(row, &b[..width]));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use runit_backend::Device;

    #[test]
    fn silu_of_known_values() {
        let backend = CpuBackend::new(1).unwrap();
        let mut gate = backend.alloc(3).unwrap();
        let mut up = backend.alloc(3).unwrap();
        backend.upload(&mut gate, &[0.0, 1.0, -2.0]).unwrap();
        backend.upload(&mut up, &[3.0, 2.0, 1.0]).unwrap();
        gated_activation(&backend, Activation::Silu, &mut gate, &up, 3).unwrap();
        let mut out = [0.0f32; 3];
        backend.download(&gate, &mut out).unwrap();
        let sig = |x: f64| x / (1.0 + (-x).exp());
        assert_eq!(out[0], 0.0);
        assert!((f64::from(out[1]) - 2.0 * sig(1.0)).abs() < 1e-6);
        assert!((f64::from(out[2]) - sig(-2.0)).abs() < 1e-6);
    }
}
