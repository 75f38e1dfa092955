//! The prompt-processing path: cuBLAS GEMM on the tensor cores with f32 accumulation.
//!
//! F32 weights multiply the f32 activations directly. Otherwise the activations are converted
//! to f16 carrying the CPU's rounding (`activation_f16_cpu`) and the weight is used as is
//! (F16) or dequantized to f16
//! (`dequant_f16_<type>`) into a staging matrix, in chunks of rows so the staging stays below
//! [`STAGING_ELEMENTS`] (a 152064-row vocabulary projection takes a few chunks).

use cudarc::driver::LaunchConfig;
use runit_backend::BackendError;
use runit_quant::GgmlType;

use super::cublas::{Blas, Element, GemmShape};
use super::names::TypeKernels;
use super::{ensure, launch_kernel, Operands, Scratch, OP};
use crate::{grid_for, CudaBackend};

/// Most f16 elements of dequantized weight staged at once (256 MiB).
pub const STAGING_ELEMENTS: usize = 1 << 27;

/// Rows of an `n_in`-wide weight dequantized per chunk.
pub fn chunk_rows(n_in: usize, n_out: usize) -> usize {
    (STAGING_ELEMENTS / n_in.max(1)).clamp(1, n_out.max(1))
}

/// Runs the GEMM path for `op.tokens` rows.
pub(super) fn run(
    backend: &CudaBackend,
    ty: GgmlType,
    kernels: &TypeKernels,
    op: &Operands,
    scratch: &mut Scratch,
) -> Result<(), BackendError> {
    if scratch.blas.is_none() {
        if backend.capturing() {
            return Err(BackendError::Device {
                backend: runit_backend::Device::name(backend),
                op: OP,
                message: "cuBLAS cannot be set up while a graph is captured".into(),
            });
        }
        scratch.blas = Some(Blas::new(backend, OP)?);
    }
    let shape = |rows: usize, element: Element, a: u64, b: u64, out: u64| GemmShape {
        rows,
        tokens: op.tokens,
        depth: op.n_in,
        element,
        a,
        b,
        out,
        out_stride: op.n_out,
    };
    if ty == GgmlType::F32 {
        let blas = scratch.blas.as_ref().expect("created above");
        let gemm = shape(op.n_out, Element::F32, op.weight, op.x, op.out);
        // SAFETY: the weight, activations and output hold n_out × n_in, tokens × n_in and
        // tokens × n_out f32 values (checked by the caller).
        return unsafe { blas.gemm(backend, OP, &gemm) };
    }

    // The values the CPU's matmul multiplies: q8 activations for quantized weights, f16 or
    // bf16 rounding for float weights (see activation_f16_cpu in convert.cu).
    let half_x = super::mmq::half_input(backend, op, scratch)?;

    let Some(dequant) = kernels.dequant_f16 else {
        // F16: the packed weight already is the f16 matrix.
        let blas = scratch.blas.as_ref().expect("created above");
        let gemm = shape(op.n_out, Element::F16, op.weight, half_x, op.out);
        // SAFETY: the weight holds n_out × n_in f16 values, the staging tokens × n_in, the
        // output tokens × n_out f32 values.
        return unsafe { blas.gemm(backend, OP, &gemm) };
    };

    let chunk = chunk_rows(op.n_in, op.n_out);
    let staging = ensure(
        backend,
        &mut scratch.half_weight,
        chunk * op.n_in,
        "f16 weight",
    )?;
    let blas = scratch.blas.as_ref().expect("created above");
    let mut first = 0;
    while first < op.n_out {
        let rows = chunk.min(op.n_out - first);
        launch_kernel!(
            backend,
            OP,
            "convert.cu",
            dequant,
            grid_for(rows * op.n_in / 8),
            op.weight + (first * op.row_bytes) as u64,
            op.row_bytes as u64,
            op.n_in as u64,
            rows as u64,
            staging
        )?;
        let out = op.out + 4 * first as u64;
        let gemm = shape(rows, Element::F16, staging, half_x, out);
        // SAFETY: the staging holds rows × n_in f16 values (sized above), the activations
        // tokens × n_in, and the output's column `first` onwards has rows columns left in
        // each of its tokens rows of stride n_out.
        unsafe { blas.gemm(backend, OP, &gemm)? };
        first += rows;
    }
    Ok(())
}

/// The launch shape of `activation_f16_cpu` for `values` values in rounding `mode`: a warp
/// per 32 values (per 256 for Q8_K's) in the q8 modes, a thread per value otherwise.
pub(super) fn convert_grid(values: usize, mode: u32) -> LaunchConfig {
    if mode < 3 {
        let warps_needed = values / if mode == 2 { 256 } else { 32 };
        LaunchConfig {
            grid_dim: (warps_needed.div_ceil(8).clamp(1, 65_535) as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        }
    } else {
        grid_for(values)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_cover_the_rows_within_the_staging() {
        for (n_in, n_out) in [(3584, 152064), (18944, 3584), (896, 896), (1 << 28, 4)] {
            let rows = chunk_rows(n_in, n_out);
            assert!(rows >= 1 && rows <= n_out);
            assert!(rows * n_in <= STAGING_ELEMENTS || rows == 1);
        }
        assert_eq!(chunk_rows(3584, 18944), 18944);
    }
}
