//! Shared helpers of the engine's golden tests: where golden data and model files live.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::Arc;

use runit_model::Model;

/// `tests/golden` relative to the workspace root, or `$RUNIT_GOLDEN_DIR` (the GPU machine
/// gets a copy of the parts it needs).
pub fn golden_dir() -> PathBuf {
    match std::env::var_os("RUNIT_GOLDEN_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/golden"),
    }
}

/// Where model files are looked for: the golden synthetic models, the project's fetched
/// models, and the requantizations `runit quantize` writes.
pub fn model_dirs() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut dirs = vec![root.join("models"), root.join("models/requant")];
    if let Some(extra) = std::env::var_os("RUNIT_MODEL_DIR") {
        dirs.insert(0, PathBuf::from(extra));
    }
    dirs
}

/// The path of model file `name`, if it can be found.
pub fn find_model(name: &str) -> Option<PathBuf> {
    model_dirs()
        .into_iter()
        .map(|d| d.join(name))
        .find(|p| p.exists())
}

/// Loads `path` on a CPU backend with `threads` threads, or on GPU 0 when
/// `RUNIT_TEST_DEVICE=cuda` or `wgpu` (the golden tests then check that backend).
pub fn load(path: &Path, threads: usize) -> Arc<Model> {
    // The goldens' arithmetic for F16 rows on every CPU (CPUs without AVX-512 would sum them
    // as llama.cpp's AVX2 build does, not as the machine that made the goldens).
    assert!(
        runit_quant::cpu::keep_f16_reference(),
        "the F16 kernels were chosen before the first model load"
    );
    let file = Arc::new(runit_gguf::GgufFile::open(path).expect("golden model opens"));
    let backend: Arc<dyn runit_backend::Backend> = match test_device().as_str() {
        "cuda" => Arc::new(
            runit_backend_cuda::CudaBackend::new(0).expect("RUNIT_TEST_DEVICE=cuda: a GPU"),
        ),
        "wgpu" => Arc::new(
            runit_backend_wgpu::WgpuBackend::new(0).expect("RUNIT_TEST_DEVICE=wgpu: an adapter"),
        ),
        _ => Arc::new(runit_backend_cpu::CpuBackend::new(threads).expect("cpu backend")),
    };
    Arc::new(Model::load(file, backend).expect("golden model loads"))
}

/// `cpu` unless `RUNIT_TEST_DEVICE` names another backend.
pub fn test_device() -> String {
    std::env::var("RUNIT_TEST_DEVICE").unwrap_or_else(|_| "cpu".to_string())
}

/// Whether the file's architecture is a row of the engine's table.
pub fn is_supported_arch(path: &Path) -> bool {
    let file = runit_gguf::GgufFile::open(path).expect("model opens");
    let arch = file
        .get_str("general.architecture")
        .unwrap_or("")
        .to_string();
    runit_model::arch::find(&arch).is_some()
}

/// A scheduler sink that hands each event to the test and, after a token, waits for the
/// test's go-ahead: its sequence gets one token a step, so the scheduler stops once a step,
/// inside the step, until the test says go (which lets a test count steps instead of timing
/// them). A test that has gone away (no go-ahead within a minute) ends the sequence.
pub struct Lockstep {
    pub events: std::sync::mpsc::Sender<runit_engine::scheduler::SequenceEvent>,
    pub go: std::sync::mpsc::Receiver<()>,
}

impl runit_engine::scheduler::EventSink for Lockstep {
    fn send(&mut self, event: runit_engine::scheduler::SequenceEvent) -> bool {
        let is_token = matches!(event, runit_engine::scheduler::SequenceEvent::Token(_));
        if self.events.send(event).is_err() {
            return false;
        }
        !is_token
            || self
                .go
                .recv_timeout(std::time::Duration::from_secs(60))
                .is_ok()
    }
}
