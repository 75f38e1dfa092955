//! Finding the CUDA driver and NVRTC shared libraries before `cudarc` touches them.
//!
//! `cudarc` (dynamic loading) panics when a library is missing. We load each library first
//! ourselves — by its usual names, then from well-known install folders and the paths named by
//! `RUNIT_NVRTC_LIB` / `CUDA_PATH` — and keep it loaded for the life of the process, so that
//! `cudarc`'s own lookup by name finds the already-loaded library and a missing one becomes a
//! [`CudaError`] instead of a panic.

use std::path::PathBuf;
use std::sync::OnceLock;

use crate::error::CudaError;

/// Loads the CUDA driver library once; later calls return the first result.
pub fn ensure_driver() -> Result<(), CudaError> {
    static DRIVER: OnceLock<Result<(), String>> = OnceLock::new();
    DRIVER
        .get_or_init(|| load_any(&candidates("cuda", &[])))
        .clone()
        .map_err(|tried| CudaError::NoDriver { tried })
}

/// Loads the NVRTC library once; later calls return the first result.
pub fn ensure_nvrtc() -> Result<(), CudaError> {
    static NVRTC: OnceLock<Result<(), String>> = OnceLock::new();
    NVRTC
        .get_or_init(|| {
            let mut extra: Vec<PathBuf> = Vec::new();
            if let Some(path) = std::env::var_os("RUNIT_NVRTC_LIB") {
                extra.push(PathBuf::from(path));
            }
            for root in cuda_roots() {
                for lib in ["lib64", "lib", "targets/x86_64-linux/lib"] {
                    extra.push(root.join(lib).join("libnvrtc.so.13"));
                    extra.push(root.join(lib).join("libnvrtc.so.12"));
                }
            }
            load_any(&candidates("nvrtc", &extra))
        })
        .clone()
        .map_err(|tried| CudaError::NoNvrtc { tried })
}

/// CUDA install folders: `CUDA_PATH`, `CUDA_HOME`, then `/usr/local/cuda`.
pub fn cuda_roots() -> Vec<PathBuf> {
    let mut roots: Vec<PathBuf> = ["CUDA_PATH", "CUDA_HOME"]
        .iter()
        .filter_map(std::env::var_os)
        .map(PathBuf::from)
        .collect();
    roots.push(PathBuf::from("/usr/local/cuda"));
    roots
}

/// Explicit paths first, then the names `cudarc` itself tries.
fn candidates(name: &str, explicit: &[PathBuf]) -> Vec<String> {
    let mut all: Vec<String> = explicit
        .iter()
        .filter(|p| p.exists())
        .map(|p| p.display().to_string())
        .collect();
    all.extend(cudarc::get_lib_name_candidates(name));
    all
}

/// Loads the first library that opens and leaks it (it must stay loaded for `cudarc`).
/// Returns the names tried on failure.
fn load_any(names: &[String]) -> Result<(), String> {
    for name in names {
        // SAFETY: loading a vendor library runs its initialisers; these are the CUDA
        // libraries cudarc would load by the same names.
        if let Ok(lib) = unsafe { libloading::Library::new(name) } {
            std::mem::forget(lib);
            return Ok(());
        }
    }
    Err(names.join(", "))
}
