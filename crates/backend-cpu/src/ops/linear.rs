//! Matrix multiplication `out[t] = W · x[t]` of a packed weight with f32 activations: shape
//! checks here, the kernels in [`crate::matmul`] (activations converted to the weight type's
//! `vec_dot_type` as ggml-cpu does, then SIMD block dot products).

use runit_backend::{BackendError, Buffer, Weight};

use crate::matmul::{self, Layout, PackedWeight, Parallelism};
use crate::storage::{at_least, data, data_mut, exactly, product, weight_bytes};
use crate::CpuBackend;

const OP: &str = "matmul";

/// True when [`matmul`] handles weights of type `ty`.
pub fn supports(ty: runit_quant::GgmlType) -> bool {
    matmul::supports(ty)
}

/// `out[t][o] = sum_i W[o][i] * x[t][i]` for `t < tokens`.
pub fn matmul(
    backend: &CpuBackend,
    weight: &Weight,
    x: &Buffer,
    tokens: usize,
    out: &mut Buffer,
) -> Result<(), BackendError> {
    if !supports(weight.ty) {
        return Err(BackendError::Unsupported {
            backend: "cpu".to_string(),
            op: OP,
            ty: weight.ty,
            tensor: weight.name.clone(),
        });
    }
    let matrices: usize = weight.shape.iter().skip(2).product();
    exactly(
        OP,
        "matrices in the weight (use Weight::matrix)",
        1,
        matrices,
    )?;
    let n_in = weight.row_len();
    let n_out = weight.rows();
    let bytes = weight_bytes(weight, OP)?;
    let x = data(x, OP, "x")?;
    let x_len = product(OP, "x", tokens, n_in)?;
    at_least(OP, "x elements (tokens × row length)", x_len, x.len())?;
    let out = data_mut(out, OP, "out")?;
    let out_len = product(OP, "out", tokens, n_out)?;
    at_least(OP, "out elements (tokens × rows)", out_len, out.len())?;
    // ggml-cpu keeps the token embedding out of its REPACK buffer (GET_ROWS reads it), so a
    // tied output matmul stays in `vec_dot` order.
    // One expert of a 3-D tensor (`Weight::matrix` names it `name[index]`) goes through
    // MUL_MAT_ID there.
    let layout =
        if weight.name == "token_embd.weight" || !runit_quant::dot::is_repacked(weight.ty, n_out) {
            Layout::Plain
        } else if weight.name.ends_with(']') {
            Layout::RepackedExpert
        } else {
            Layout::Repacked
        };
    let packed = PackedWeight::new(weight.ty, bytes, n_in, n_out).with_layout(layout);
    let parallelism = Parallelism {
        pool: (backend.threads > 1).then_some(&backend.pool),
        level: backend.simd,
    };
    // The activation scratch is reused between calls; a concurrent caller gets its own.
    let mut fresh = Vec::new();
    let mut shared = backend.matmul_scratch.try_lock();
    let scratch = match shared.as_deref_mut() {
        Ok(scratch) => scratch,
        Err(_) => &mut fresh,
    };
    matmul::matmul(
        &packed,
        &x[..x_len],
        tokens,
        &mut out[..out_len],
        scratch,
        &parallelism,
    );
    Ok(())
}
