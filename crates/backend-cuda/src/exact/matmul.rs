//! The exact matmul: the CPU backend's choice among ggml's orders (`backend-cpu`
//! `matmul::matmul`), then that order's kernel. ggml-cpu repacks the weights of some types
//! (`Weight::ggml_layout`; never the token embedding) and multiplies them in the
//! repack gemm order four activation rows at a time and the gemv order for the rest (every
//! row of one expert of a 3-D weight); takes llamafile's tinyBLAS for two or more rows of
//! the types it accepts; and the type's `vec_dot` otherwise. A pass whose rows must each get
//! the numbers of a pass of their own (`CudaBackend::rows_alone`: speculative verification)
//! takes neither batched order, as the CPU's `Parallelism::rows_alone` does: every row in the
//! gemv or `vec_dot` order a one-row call takes, so verification equals one-token steps.

use cudarc::driver::CudaSlice;
use runit_backend::{BackendError, Buffer, Device, GgmlLayout, Weight};
use runit_quant::dot::{activation_format, activation_row_bytes, tinyblas, ActivationFormat};
use runit_quant::GgmlType;

use crate::matmul::{launch_kernel, operands, Operands};
use crate::{device_address, grid_for, CudaBackend};

/// The kernel `$prefix<type>` of weight type `$ty` (a `&'static str`), or `None` for a type
/// without exact kernels.
macro_rules! kernel {
    ($prefix:literal, $ty:expr) => {{
        use GgmlType::*;
        match $ty {
            F32 => Some(concat!($prefix, "f32")),
            F16 => Some(concat!($prefix, "f16")),
            BF16 => Some(concat!($prefix, "bf16")),
            Q4_0 => Some(concat!($prefix, "q4_0")),
            Q4_1 => Some(concat!($prefix, "q4_1")),
            Q5_0 => Some(concat!($prefix, "q5_0")),
            Q5_1 => Some(concat!($prefix, "q5_1")),
            Q8_0 => Some(concat!($prefix, "q8_0")),
            IQ4_NL => Some(concat!($prefix, "iq4_nl")),
            Q2_K => Some(concat!($prefix, "q2_k")),
            Q3_K => Some(concat!($prefix, "q3_k")),
            Q4_K => Some(concat!($prefix, "q4_k")),
            Q5_K => Some(concat!($prefix, "q5_k")),
            Q6_K => Some(concat!($prefix, "q6_k")),
            IQ4_XS => Some(concat!($prefix, "iq4_xs")),
            _ => None,
        }
    }};
}

const OP: &str = "matmul";
const PLAIN: &str = "exact_matmul.cu";
const ORDERS: &str = "exact_gemm.cu";

/// The order a matmul's arithmetic follows on the CPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Order {
    /// ggml's repack kernels: for a 2-D weight the leading whole groups of four activation
    /// rows in the gemm order and the rest in the gemv order; with `gemv_only` (one expert
    /// of a 3-D weight, MUL_MAT_ID, or rows computed as if alone) every row in the gemv order.
    Repacked { gemv_only: bool },
    /// llamafile's sgemm.
    TinyBlas,
    /// The type's `vec_dot` on quantized (or converted) activations.
    VecDot,
}

/// The CPU's order for `tokens` activation rows; with `rows_alone`, the order of one row
/// (backend-cpu `repacked::gemm_rows` and `tinyblas::kernel_for` under `rows_alone`).
fn order(weight: &Weight, tokens: usize, rows_alone: bool) -> Order {
    match weight.ggml_layout() {
        GgmlLayout::Repacked => Order::Repacked {
            gemv_only: rows_alone,
        },
        GgmlLayout::RepackedExpert => Order::Repacked { gemv_only: true },
        GgmlLayout::Plain
            if !rows_alone
                && tinyblas::accepts(weight.ty, weight.row_len(), weight.rows(), tokens) =>
        {
            Order::TinyBlas
        }
        GgmlLayout::Plain => Order::VecDot,
    }
}

/// `out[t][o] = W[o] · x[t]` for `t < tokens`, bit for bit as the CPU backend computes it.
pub(crate) fn matmul(
    backend: &CudaBackend,
    weight: &Weight,
    x: &Buffer,
    tokens: usize,
    out: &mut Buffer,
) -> Result<(), BackendError> {
    let Some((_, operands)) = operands(backend, weight, x, tokens, out, 0)? else {
        return Ok(());
    };
    let ty = weight.ty;
    let unsupported = || BackendError::Unsupported {
        backend: backend.name(),
        op: OP,
        ty,
        tensor: weight.name.clone(),
    };
    match order(weight, tokens, backend.rows_alone()) {
        Order::VecDot => {
            let kernel = kernel!("exact_matmul_", ty).ok_or_else(unsupported)?;
            vec_dot(backend, ty, kernel, &operands)
        }
        Order::TinyBlas => tinyblas(backend, ty, &operands),
        Order::Repacked { gemv_only } => repacked(backend, ty, &operands, gemv_only),
    }
}

/// The quantizer kernel of an activation format.
fn quantizer(format: ActivationFormat) -> &'static str {
    match format {
        ActivationFormat::F32 => "exact_quantize_f32",
        ActivationFormat::F16 => "exact_quantize_f16",
        ActivationFormat::BF16 => "exact_quantize_bf16",
        ActivationFormat::Q8_0 => "exact_quantize_q8_0",
        ActivationFormat::Q8_1 => "exact_quantize_q8_1",
        ActivationFormat::Q8K => "exact_quantize_q8_k",
    }
}

/// A device scratch of `len` bytes for this call (freed in stream order when dropped).
fn scratch(backend: &CudaBackend, len: usize) -> Result<(CudaSlice<u8>, u64), BackendError> {
    let slice = backend
        .stream()
        .alloc_zeros::<u8>(len.max(1))
        .map_err(|e| backend.driver_error(OP, e))?;
    let ptr = device_address(&slice, backend.stream());
    Ok((slice, ptr))
}

/// The activations in `format`, as the CPU's `quantize_activation` writes them.
fn quantize(
    backend: &CudaBackend,
    format: ActivationFormat,
    operands: &Operands,
) -> Result<(CudaSlice<u8>, u64, usize), BackendError> {
    let row_bytes = activation_row_bytes(format, operands.n_in);
    let (slice, ptr) = scratch(backend, operands.tokens * row_bytes)?;
    launch_kernel!(
        backend,
        OP,
        PLAIN,
        quantizer(format),
        grid_for(operands.tokens * operands.n_in),
        operands.x,
        ptr,
        operands.tokens as u32,
        operands.n_in as u32
    )?;
    Ok((slice, ptr, row_bytes))
}

/// Launches matmul kernel `kernel` of `file` on activation rows `a` (`a_row_bytes` apart; for
/// tinyBLAS's two-row units, the bytes between units), with `gemv_only` appended for the
/// kernels that take it.
fn launch_order(
    backend: &CudaBackend,
    file: &'static str,
    kernel: &'static str,
    operands: &Operands,
    a: u64,
    a_row_bytes: usize,
    gemv_only: Option<bool>,
) -> Result<(), BackendError> {
    let grid = grid_for(operands.tokens * operands.n_out);
    let (w, out) = (operands.weight, operands.out);
    let (n, n_out, tokens) = (
        operands.n_in as u32,
        operands.n_out as u32,
        operands.tokens as u32,
    );
    let (w_row_bytes, a_row_bytes) = (operands.row_bytes as u64, a_row_bytes as u64);
    match gemv_only {
        None => launch_kernel!(
            backend,
            OP,
            file,
            kernel,
            grid,
            w,
            a,
            out,
            n,
            n_out,
            tokens,
            w_row_bytes,
            a_row_bytes
        ),
        Some(gemv_only) => launch_kernel!(
            backend,
            OP,
            file,
            kernel,
            grid,
            w,
            a,
            out,
            n,
            n_out,
            tokens,
            w_row_bytes,
            a_row_bytes,
            u32::from(gemv_only)
        ),
    }
}

fn vec_dot(
    backend: &CudaBackend,
    ty: GgmlType,
    kernel: &'static str,
    operands: &Operands,
) -> Result<(), BackendError> {
    let format =
        activation_format(ty).expect("every type with exact kernels has an activation format");
    let (_activations, a, a_row_bytes) = quantize(backend, format, operands)?;
    launch_order(backend, PLAIN, kernel, operands, a, a_row_bytes, None)
}

fn tinyblas(backend: &CudaBackend, ty: GgmlType, operands: &Operands) -> Result<(), BackendError> {
    let (n_in, tokens) = (operands.n_in, operands.tokens);
    let kernel =
        kernel!("exact_tinyblas_", ty).expect("tinyBLAS takes only types with exact kernels");
    match ty {
        GgmlType::F32 => launch_order(
            backend,
            ORDERS,
            kernel,
            operands,
            operands.x,
            4 * n_in,
            None,
        ),
        GgmlType::BF16 => {
            let (_rows, a, a_row_bytes) = quantize(backend, ActivationFormat::BF16, operands)?;
            launch_order(backend, ORDERS, kernel, operands, a, a_row_bytes, None)
        }
        GgmlType::F16 => {
            // Each value rounded to f16 and widened back, as f32 rows.
            let (_prepared, a) = scratch(backend, tokens * n_in * 4)?;
            launch_kernel!(
                backend,
                OP,
                ORDERS,
                "exact_tinyblas_prepare_f16",
                grid_for(tokens * n_in),
                operands.x,
                a,
                tokens as u32,
                n_in as u32
            )?;
            launch_order(backend, ORDERS, kernel, operands, a, 4 * n_in, None)
        }
        _ => {
            // The Q8_0-paired types: Q8_0 rows, then tinyBLAS's units of two rows.
            let (_q8_0, q8_0, _) = quantize(backend, ActivationFormat::Q8_0, operands)?;
            let unit_bytes = tinyblas::prepared_unit_bytes(ty, n_in);
            let units = tokens.div_ceil(tinyblas::unit_tokens(ty));
            let (_prepared, a) = scratch(backend, units * unit_bytes)?;
            launch_kernel!(
                backend,
                OP,
                ORDERS,
                "exact_tinyblas_prepare_q8_0",
                grid_for(tokens * n_in / 32),
                q8_0,
                a,
                tokens as u32,
                n_in as u32
            )?;
            launch_order(backend, ORDERS, kernel, operands, a, unit_bytes, None)
        }
    }
}

fn repacked(
    backend: &CudaBackend,
    ty: GgmlType,
    operands: &Operands,
    gemv_only: bool,
) -> Result<(), BackendError> {
    let kernel = kernel!("exact_repack_", ty).expect("repacked types have exact kernels");
    let (format, split) = match ty {
        // The kernel splits the rows between the gemm and gemv orders itself.
        GgmlType::Q4_K | GgmlType::Q2_K => (ActivationFormat::Q8K, Some(gemv_only)),
        // Q4_0 and IQ4_NL: the two orders are the same arithmetic.
        _ => (ActivationFormat::Q8_0, None),
    };
    let (_activations, a, a_row_bytes) = quantize(backend, format, operands)?;
    launch_order(backend, ORDERS, kernel, operands, a, a_row_bytes, split)
}
