//! The error type of the CUDA backend.

use runit_backend::BackendError;

/// Why the CUDA backend could not start or an operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CudaError {
    /// No CUDA driver library (libcuda) could be loaded.
    #[error("no CUDA driver found (could not load any of: {tried}); install the NVIDIA driver or use --device cpu")]
    NoDriver { tried: String },
    /// The NVRTC library, which compiles the kernels at run time, could not be loaded.
    #[error("NVRTC not found (could not load any of: {tried}); install the CUDA toolkit or the `nvidia-cuda-nvrtc` Python package, or set RUNIT_NVRTC_LIB to the library's path")]
    NoNvrtc { tried: String },
    /// The requested device ordinal does not exist.
    #[error("CUDA device {ordinal} not found ({count} device(s) present)")]
    NoDevice { ordinal: usize, count: usize },
    /// The device is older than the kernels support.
    #[error("CUDA device {ordinal} ({name}) has compute capability {major}.{minor}; RunIT needs 8.0 or newer")]
    TooOld {
        ordinal: usize,
        name: String,
        major: i32,
        minor: i32,
    },
    /// NVRTC rejected a kernel source.
    #[error("NVRTC failed to compile kernels/{file} for {arch}:\n{log}")]
    Compile {
        file: String,
        arch: String,
        log: String,
    },
    /// A driver call failed.
    #[error("CUDA {op} failed: {message}")]
    Driver { op: String, message: String },
}

impl CudaError {
    /// The error as the backend trait reports it, naming the op that failed.
    pub fn into_backend(self, backend: &str, op: &'static str) -> BackendError {
        BackendError::Device {
            backend: backend.to_string(),
            op,
            message: self.to_string(),
        }
    }
}
