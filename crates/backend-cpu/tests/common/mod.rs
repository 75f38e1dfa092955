//! Helpers shared by the golden-dump tests.

use std::sync::Arc;

use runit_backend::{Backend, HostMemory, Weight, WeightRole, WeightSource};
use runit_gguf::GgufFile;

/// Loads tensor `name` of `file` onto `backend` from an owned copy of its bytes, in the role
/// the model loader gives it (the token embedding by name, the others by shape).
pub fn load_weight(file: &GgufFile, backend: &dyn Backend, name: &str) -> Weight {
    let info = file.tensor(name).unwrap_or_else(|| panic!("tensor {name}"));
    let bytes = file.tensor_data(info).to_vec();
    let len = bytes.len();
    let shape: Vec<usize> = info.shape.iter().map(|d| *d as usize).collect();
    let memory: Arc<dyn HostMemory> = Arc::new(bytes);
    let role = match name {
        "token_embd.weight" => WeightRole::TokenEmbedding,
        _ => WeightRole::of_shape(&shape),
    };
    let source = WeightSource {
        name,
        role,
        ty: info.ty,
        shape: &shape,
        memory,
        range: 0..len,
    };
    backend.load_weight(source).unwrap()
}
