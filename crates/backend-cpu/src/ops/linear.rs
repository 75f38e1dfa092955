//! Matrix multiplication `out[t] = W · x[t]` of a packed weight with f32 activations: shape
//! checks here, the kernels in [`crate::matmul`] (activations converted to the weight type's
//! `vec_dot_type` as ggml-cpu does, then SIMD block dot products).

use runit_backend::{
    Activation, AttentionOutput, BackendError, Buffer, GatedFfnRun, Projection, Weight,
};

use crate::matmul::{self, PackedWeight, Parallelism, Prepared};
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
    let packed = packed(weight)?;
    let x = input(x, tokens, packed.n_in)?;
    let out = output(out, tokens, packed.n_out)?;
    with_scratch(backend, |scratch, parallelism| {
        matmul::matmul(&packed, x, tokens, out, scratch, parallelism)
    });
    Ok(())
}

/// [`FusedOps::matmul_qkv`](runit_backend::FusedOps::matmul_qkv): the three projections in
/// one dispatch with the activations converted once when their weights share a type and take
/// the plain kernels (the same numbers as three [`matmul`]s), else one after another.
pub fn matmul_qkv(
    backend: &CpuBackend,
    projections: [Projection<'_>; 3],
    x: &Buffer,
    tokens: usize,
    outs: [&mut Buffer; 3],
) -> Result<(), BackendError> {
    let [q, k, v] = outs;
    let fused = {
        let packed = [
            packed(projections[0].weight)?,
            packed(projections[1].weight)?,
            packed(projections[2].weight)?,
        ];
        let input = input(x, tokens, packed[0].n_in)?;
        let mut parts = Vec::with_capacity(3);
        for (weight, out) in packed.into_iter().zip([&mut *q, &mut *k, &mut *v]) {
            let y = output(out, tokens, weight.n_out)?;
            parts.push(matmul::Part { weight, y });
        }
        with_scratch(backend, |scratch, parallelism| {
            matmul::matmul_fused(
                &mut parts,
                input,
                tokens,
                scratch,
                parallelism,
                matmul::Epilogue::None,
            )
        })
    };
    if !fused {
        return runit_backend::unfused::matmul_qkv(backend, projections, x, tokens, [q, k, v]);
    }
    for (projection, out) in projections.into_iter().zip([q, k, v]) {
        if let Some(bias) = projection.bias {
            super::elementwise::add_bias(backend, out, bias, tokens)?;
        }
    }
    Ok(())
}

/// The matmul epilogue that applies `activation` to the gate's columns and multiplies them
/// by the up projection's (as the separate [`super::elementwise::gated_activation`]).
fn gated_epilogue(backend: &CpuBackend, activation: Activation) -> matmul::Epilogue {
    matmul::Epilogue::Gated(activation, backend.isa)
}

/// [`FusedOps::gated_ffn_hidden`](runit_backend::FusedOps::gated_ffn_hidden): the gate and
/// up projections in one dispatch, each task applying the activation to its columns (the
/// same numbers as two [`matmul`]s and the separate activation), when the two weights can
/// share a dispatch; else the three ops one after another.
pub fn gated_ffn_hidden(backend: &CpuBackend, run: GatedFfnRun<'_>) -> Result<(), BackendError> {
    let tokens = run.tokens;
    let fused = {
        let (gate, up) = (packed(run.ffn.gate)?, packed(run.ffn.up)?);
        let input = input(run.x, tokens, gate.n_in)?;
        let mut parts = [
            matmul::Part {
                weight: gate,
                y: output(run.hidden, tokens, gate.n_out)?,
            },
            matmul::Part {
                weight: up,
                y: output(run.up, tokens, up.n_out)?,
            },
        ];
        with_scratch(backend, |scratch, parallelism| {
            matmul::matmul_fused(
                &mut parts,
                input,
                tokens,
                scratch,
                parallelism,
                gated_epilogue(backend, run.ffn.activation),
            )
        })
    };
    if fused {
        return Ok(());
    }
    runit_backend::unfused::gated_ffn_hidden(backend, run)
}

/// [`FusedOps::gated_ffn`](runit_backend::FusedOps::gated_ffn): the gate and up projections
/// in one dispatch as [`gated_ffn_hidden`], whose tasks also convert their columns of the
/// activation's output for the down projection where it is a decode batch's
/// (`matmul::matmul_gated_down`: the same numbers as the separate ops); else
/// [`gated_ffn_hidden`] and [`matmul`].
pub fn gated_ffn(
    backend: &CpuBackend,
    mut run: GatedFfnRun<'_>,
    out: &mut Buffer,
) -> Result<(), BackendError> {
    if gated_down(backend, run.reborrow(), out)? {
        return Ok(());
    }
    let (down, tokens) = (run.ffn.down, run.tokens);
    gated_ffn_hidden(backend, run.reborrow())?;
    matmul(backend, down, run.hidden, tokens, out)
}

/// The gated FFN in the dispatch of `matmul::matmul_gated_down`; false where that does not
/// take it (nothing computed).
fn gated_down(
    backend: &CpuBackend,
    run: GatedFfnRun<'_>,
    out: &mut Buffer,
) -> Result<bool, BackendError> {
    let ffn = run.ffn;
    let (gate, up, down) = (packed(ffn.gate)?, packed(ffn.up)?, packed(ffn.down)?);
    let input = input(run.x, run.tokens, gate.n_in)?;
    let y = output(out, run.tokens, down.n_out)?;
    if down.n_in != gate.n_out {
        return Err(BackendError::Shape {
            op: OP,
            what: "down projection's input width (the gate's rows)",
            expected: gate.n_out,
            found: down.n_in,
        });
    }
    let mut parts = [
        matmul::Part {
            weight: gate,
            y: output(run.hidden, run.tokens, gate.n_out)?,
        },
        matmul::Part {
            weight: up,
            y: output(run.up, run.tokens, up.n_out)?,
        },
    ];
    Ok(with_scratches(backend, |scratch, tables, parallelism| {
        matmul::matmul_gated_down(
            &mut parts,
            &down,
            y,
            input,
            run.tokens,
            scratch,
            tables,
            parallelism,
            ffn.activation,
            backend.isa,
        )
    }))
}

/// [`FusedOps::attention_output`](runit_backend::FusedOps::attention_output): the
/// attention, whose threads also convert each row they finish for the output projection's
/// tile kernels where that is a decode batch's (`matmul::Prepared`: the same numbers as the
/// separate ops, without the calling thread converting every row after the attention);
/// then the projection.
pub fn attention_output(backend: &CpuBackend, op: AttentionOutput<'_>) -> Result<(), BackendError> {
    let AttentionOutput {
        attention,
        attn,
        projection,
        tokens,
        out,
    } = op;
    let packed = packed(projection)?;
    let width = attention.width();
    let done = with_scratches(backend, |scratch, tables, parallelism| {
        let prepared =
            Prepared::begin(&packed, tokens, tables, parallelism).filter(|_| width == packed.n_in);
        let Some(prepared) = prepared else {
            return Ok(false);
        };
        let convert = |row: usize, values: &[f32]| {
            if row < tokens {
                // SAFETY: `convert_row` needs that no other thread converts row `row`
                // meanwhile: the attention reports each row once, from the thread that
                // finished it.
                unsafe { prepared.convert_row(row, values) };
            }
        };
        let reported =
            super::attention::attention_reporting(backend, &attention, attn, Some(&convert))?;
        let x = input(attn, tokens, packed.n_in)?;
        let y = output(out, tokens, packed.n_out)?;
        if reported >= tokens {
            prepared.matmul(&packed, x, tokens, y, scratch, parallelism);
        } else {
            matmul::matmul(&packed, x, tokens, y, scratch, parallelism);
        }
        Ok::<_, BackendError>(true)
    })?;
    if !done {
        super::attention::attention(backend, &attention, attn)?;
        matmul(backend, projection, attn, tokens, out)?;
    }
    Ok(())
}

/// The packed view of a 2-D weight, in the layout whose order llama.cpp's CPU backend
/// would use for it.
fn packed(weight: &Weight) -> Result<PackedWeight<'_>, BackendError> {
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
    Ok(PackedWeight::new(weight.ty, bytes, n_in, n_out).with_layout(weight.ggml_layout()))
}

/// The first `tokens` rows of `n_in` values of `x`.
fn input(x: &Buffer, tokens: usize, n_in: usize) -> Result<&[f32], BackendError> {
    let x = data(x, OP, "x")?;
    let len = product(OP, "x", tokens, n_in)?;
    at_least(OP, "x elements (tokens × row length)", len, x.len())?;
    Ok(&x[..len])
}

/// The first `tokens` rows of `n_out` values of `out`.
fn output(out: &mut Buffer, tokens: usize, n_out: usize) -> Result<&mut [f32], BackendError> {
    let out = data_mut(out, OP, "out")?;
    let len = product(OP, "out", tokens, n_out)?;
    at_least(OP, "out elements (tokens × rows)", len, out.len())?;
    Ok(&mut out[..len])
}

/// Runs `f` with the backend's activation scratch (a fresh one when another caller holds
/// it) and its threads.
fn with_scratch<T>(backend: &CpuBackend, f: impl FnOnce(&mut Vec<u8>, &Parallelism) -> T) -> T {
    let parallelism = Parallelism {
        pool: (backend.threads > 1).then_some(&backend.pool),
        level: backend.simd,
        rows_alone: backend.rows_alone(),
    };
    held(&backend.matmul_scratch, |scratch| f(scratch, &parallelism))
}

/// [`with_scratch`], with the backend's scratch for prepared conversions too
/// (`matmul::Prepared`).
fn with_scratches<T>(
    backend: &CpuBackend,
    f: impl FnOnce(&mut Vec<u8>, &mut Vec<u8>, &Parallelism) -> T,
) -> T {
    with_scratch(backend, |scratch, parallelism| {
        held(&backend.prepared_scratch, |tables| {
            f(scratch, tables, parallelism)
        })
    })
}

/// Runs `f` with the scratch in `shared`, or with a fresh one when another caller holds it.
fn held<T>(shared: &std::sync::Mutex<Vec<u8>>, f: impl FnOnce(&mut Vec<u8>) -> T) -> T {
    let mut fresh = Vec::new();
    let mut guard = shared.try_lock();
    match guard.as_deref_mut() {
        Ok(scratch) => f(scratch),
        Err(_) => f(&mut fresh),
    }
}
