//! Shared helpers of the engine's golden tests: where golden data and model files live.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::Arc;

use runit_model::Model;

/// `../shared/golden` relative to the workspace root.
pub fn golden_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/golden")
}

/// Where model files are looked for: the golden synthetic models, the project's fetched
/// models, and the requantizations `runit quantize` writes.
pub fn model_dirs() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    vec![
        golden_dir().join("models"),
        root.join("models"),
        root.join("models/requant"),
    ]
}

/// The path of model file `name`, if it can be found.
pub fn find_model(name: &str) -> Option<PathBuf> {
    model_dirs()
        .into_iter()
        .map(|d| d.join(name))
        .find(|p| p.exists())
}

/// Loads `path` on a CPU backend with `threads` threads.
pub fn load(path: &Path, threads: usize) -> Arc<Model> {
    let file = Arc::new(runit_gguf::GgufFile::open(path).expect("golden model opens"));
    let backend = Arc::new(runit_backend_cpu::CpuBackend::new(threads).expect("cpu backend"));
    Arc::new(Model::load(file, backend).expect("golden model loads"))
}

/// Architectures the engine supports (Gemma 3 goldens exist but are not part of this set).
pub fn is_supported_arch(path: &Path) -> bool {
    let file = runit_gguf::GgufFile::open(path).expect("model opens");
    let arch = file
        .get_str("general.architecture")
        .unwrap_or("")
        .to_string();
    runit_model::arch::find(&arch).is_some()
}
