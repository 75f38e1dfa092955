//! The cuBLAS handle of the GEMM path: created at first use (after checking that the library
//! loads, since `cudarc` panics on a missing one), bound to the backend's stream, with its own
//! workspace so that no call allocates (which a graph capture would refuse). The handle is
//! destroyed without checking the result: after a kernel fault the context is poisoned and
//! the destruction may fail, which must not panic (as `cudarc`'s `CudaBlas` would) while the
//! backend is dropped on the way out of an error.

use std::ffi::c_void;

use std::sync::Arc;

use cudarc::cublas::{result, sys};
use cudarc::driver::{CudaSlice, CudaStream};
use runit_backend::{BackendError, Device};

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

/// A cuBLAS handle and its workspace (dropped in this order: the handle first).
pub struct Blas {
    handle: Handle,
    _workspace: CudaSlice<u8>,
}

/// A raw cuBLAS handle bound to a stream, which it keeps alive.
struct Handle {
    raw: sys::cublasHandle_t,
    _stream: Arc<CudaStream>,
}

// SAFETY: the handle is used only through `&mut` access under the matmul scratch lock, never
// from two threads at once; cuBLAS handles may move between threads.
unsafe impl Send for Handle {}

impl Drop for Handle {
    fn drop(&mut self) {
        // SAFETY: `raw` was created by cublasCreate and is destroyed once, here. The result is
        // ignored (see the module documentation).
        let _ = unsafe { result::destroy_handle(self.raw) };
    }
}

impl Blas {
    /// Loads cuBLAS and creates a handle on the backend's stream.
    pub fn new(backend: &CudaBackend, op: &'static str) -> Result<Blas, BackendError> {
        library::ensure_cublas().map_err(|e| e.into_backend(&backend.name(), op))?;
        let error = |what: &str, e: result::CublasError| BackendError::Device {
            backend: backend.name(),
            op,
            message: format!("{what}: {e:?}"),
        };
        let context = backend.stream().context();
        context
            .bind_to_thread()
            .map_err(|e| backend.driver_error(op, e))?;
        let handle = Handle {
            raw: result::create_handle().map_err(|e| error("creating a cuBLAS handle", e))?,
            _stream: Arc::clone(backend.stream()),
        };
        // SAFETY: the handle is live and the stream belongs to the handle's context.
        unsafe { result::set_stream(handle.raw, backend.stream().cu_stream() as _) }
            .map_err(|e| error("binding the cuBLAS handle to the stream", e))?;
        let workspace = backend
            .stream()
            .alloc_zeros::<u8>(WORKSPACE_BYTES)
            .map_err(|e| backend.driver_error(op, e))?;
        let pointer = device_address(&workspace, backend.stream());
        // SAFETY: the handle is live and the workspace (owned by the returned value, which
        // also owns the handle) stays allocated for as long as the handle is used.
        let status = unsafe {
            sys::cublasSetWorkspace_v2(handle.raw, pointer as *mut c_void, WORKSPACE_BYTES)
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
            self.handle.raw,
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
        status.map_err(|e| {
            let error = BackendError::Device {
                backend: backend.name(),
                op,
                message: format!("cublasGemmEx ({rows}x{depth} by {tokens}): {e:?}"),
            };
            backend.fault_or(op, error)
        })?;
        backend.after_launch(op)
    }
}
