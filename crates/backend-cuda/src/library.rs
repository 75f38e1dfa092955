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

/// Loads cuBLAS (and its cublasLt dependency) once; later calls return the first result.
/// `RUNIT_CUBLAS_LIB` may name the library's path; its folder is searched for cublasLt too.
pub fn ensure_cublas() -> Result<(), CudaError> {
    static CUBLAS: OnceLock<Result<(), String>> = OnceLock::new();
    CUBLAS
        .get_or_init(|| {
            let mut folders: Vec<PathBuf> = Vec::new();
            if let Some(path) = std::env::var_os("RUNIT_CUBLAS_LIB").map(PathBuf::from) {
                folders.extend(path.parent().map(PathBuf::from));
            }
            for root in cuda_roots() {
                for lib in ["lib64", "lib", "targets/x86_64-linux/lib"] {
                    folders.push(root.join(lib));
                }
            }
            let in_folders = |names: &[&str]| -> Vec<PathBuf> {
                folders
                    .iter()
                    .flat_map(|folder| names.iter().map(move |name| folder.join(name)))
                    .collect()
            };
            // cublasLt first, so that cuBLAS loaded by path finds it already loaded.
            let light = in_folders(&["libcublasLt.so.13", "libcublasLt.so.12"]);
            let _ = load_any(&candidates("cublasLt", &light));
            let mut explicit: Vec<PathBuf> =
                std::env::var_os("RUNIT_CUBLAS_LIB").map(PathBuf::from).into_iter().collect();
            explicit.extend(in_folders(&["libcublas.so.13", "libcublas.so.12"]));
            load_any(&candidates("cublas", &explicit))
        })
        .clone()
        .map_err(|tried| CudaError::Driver {
            op: "loading cuBLAS".into(),
            message: format!(
                "could not load any of: {tried}; install the CUDA toolkit's cuBLAS or set RUNIT_CUBLAS_LIB"
            ),
        })
}
