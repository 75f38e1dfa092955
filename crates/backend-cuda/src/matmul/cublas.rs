//! The cuBLAS handle of the GEMM path: created at first use (after checking that the library
//! loads, since `cudarc` panics on a missing one), bound to the backend's stream, with its own
//! workspace so that no call allocates (which a graph capture would refuse).

use std::ffi::c_void;

use cudarc::cublas::{result, sys, CudaBlas};
use cudarc::driver::CudaSlice;
use runit_backend::{Backend, BackendError};

use crate::{device_address, library, CudaBackend};

/// Workspace handed to cuBLAS (NVIDIA recommends 32 MiB on Hopper).
const WORKSPACE_BYTES: usize = 32 << 20;

/// Element type of a GEMM operand.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Element {
    F16,
    F32,
}

impl Element {
    fn data_type(self) -> sys::cudaDataType {
        match self {
            Element::F16 => sys::cudaDataType::CUDA_R_16F,
            Element::F32 => sys::cudaDataType::CUDA_R_32F,
        }
    }
}

/// `out[t][o] = sum_i a[o][i] * b[t][i]` for `o < rows`, `t < tokens`, `i < depth`: row-major
/// `a` [rows][depth] and `b` [tokens][depth] of one element type, f32 `out` with rows
/// `out_stride` apart.
pub struct GemmShape {
    pub rows: usize,
    pub tokens: usize,
    pub depth: usize,
    pub element: Element,
    pub a: u64,
    pub b: u64,
    pub out: u64,
    pub out_stride: usize,
}

/// A cuBLAS handle and its workspace.
pub struct Blas {
    handle: CudaBlas,
    _workspace: CudaSlice<u8>,
}

impl Blas {
    /// Loads cuBLAS and creates a handle on the backend's stream.
    pub fn new(backend: &CudaBackend, op: &'static str) -> Result<Blas, BackendError> {
        library::ensure_cublas().map_err(|e| e.into_backend(&backend.name(), op))?;
        let handle = CudaBlas::new(backend.stream().clone()).map_err(|e| BackendError::Device {
            backend: backend.name(),
            op,
            message: format!("creating a cuBLAS handle: {e:?}"),
        })?;
        let workspace = backend
            .stream()
            .alloc_zeros::<u8>(WORKSPACE_BYTES)
            .map_err(|e| backend.driver_error(op, e))?;
        let pointer = device_address(&workspace, backend.stream());
        // SAFETY: the handle is live and the workspace (owned by the returned value, which
        // also owns the handle) stays allocated for as long as the handle is used.
        let status = unsafe {
            sys::cublasSetWorkspace_v2(*handle.handle(), pointer as *mut c_void, WORKSPACE_BYTES)
        };
        status.result().map_err(|e| BackendError::Device {
            backend: backend.name(),
            op,
            message: format!("setting the cuBLAS workspace: {e:?}"),
        })?;
        Ok(Blas {
            handle,
            _workspace: workspace,
        })
    }

    /// Enqueues the GEMM described by `shape` on the backend's stream.
    ///
    /// # Safety
    /// `a`, `b` and `out` must address live device memory holding the operands of `shape`.
    pub unsafe fn gemm(
        &self,
        backend: &CudaBackend,
        op: &'static str,
        shape: &GemmShape,
    ) -> Result<(), BackendError> {
        let int = |value: usize, what: &'static str| {
            i32::try_from(value).map_err(|_| BackendError::Shape {
                op,
                what,
                expected: i32::MAX as usize,
                found: value,
            })
        };
        let (rows, tokens) = (
            int(shape.rows, "GEMM rows")?,
            int(shape.tokens, "GEMM tokens")?,
        );
        let depth = int(shape.depth, "GEMM depth")?;
        let out_stride = int(shape.out_stride, "GEMM output stride")?;
        let (alpha, beta) = (1.0f32, 0.0f32);
        let data_type = shape.element.data_type();
        // Column-major view: C (rows x tokens, ld out_stride) = A^T B, where A is `a` seen as
        // depth x rows and B is `b` seen as depth x tokens.
        let status = result::gemm_ex(
            *self.handle.handle(),
            sys::cublasOperation_t::CUBLAS_OP_T,
            sys::cublasOperation_t::CUBLAS_OP_N,
            rows,
            tokens,
            depth,
            (&alpha as *const f32).cast(),
            shape.a as *const c_void,
            data_type,
            depth,
            shape.b as *const c_void,
            data_type,
            depth,
            (&beta as *const f32).cast(),
            shape.out as *mut c_void,
            sys::cudaDataType::CUDA_R_32F,
            out_stride,
            sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
            sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
        );
        status.map_err(|e| BackendError::Device {
            backend: backend.name(),
            op,
            message: format!("cublasGemmEx ({rows}x{depth} by {tokens}): {e:?}"),
        })?;
        backend.after_launch(op)
    }
}
