//! Helpers shared by the golden-dump tests.

use std::sync::Arc;

use runit_backend::{Backend, HostMemory, Weight};
use runit_gguf::GgufFile;

/// Loads tensor `name` of `file` onto `backend` from an owned copy of its bytes.
pub fn load_weight(file: &GgufFile, backend: &dyn Backend, name: &str) -> Weight {
    let info = file.tensor(name).unwrap_or_else(|| panic!("tensor {name}"));
    let bytes = file.tensor_data(info).to_vec();
    let len = bytes.len();
    let shape: Vec<usize> = info.shape.iter().map(|d| *d as usize).collect();
    let memory: Arc<dyn HostMemory> = Arc::new(bytes);
    backend
        .load_weight(name, info.ty, &shape, memory, 0..len)
        .unwrap()
}
