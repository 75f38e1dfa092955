//! Model loading and the generic decoder: configuration from GGUF metadata, the architecture
//! table and its tensor schema, weights used in place from the memory map (or its huge-page copy), and the forward
//! pass.
//!
//! ```no_run
//! use std::sync::Arc;
//! # fn demo(backend: Arc<dyn runit_backend::Backend>) -> Result<(), runit_model::ModelError> {
//! let file = Arc::new(runit_gguf::GgufFile::open("models/SmolLM2-135M-Instruct.Q4_1.gguf")?);
//! let model = runit_model::Model::load(file, backend)?;
//! println!("{} layers", model.config.block_count);
//! # Ok(()) }
//! ```

pub mod arch;
mod config;
mod error;
mod features;
mod forward;
mod hidden;
mod key_means;
mod keys;
mod observer;
pub mod resident;
mod rope_scaling;
pub mod schema;
mod unsupported;
mod weights;
mod workspace;

use std::sync::Arc;

use runit_backend::Backend;
use runit_gguf::GgufFile;

pub use config::{LayerConfig, ModelConfig, Pooling};
pub use error::ModelError;
pub use forward::Batch;
pub use observer::LayerObserver;
pub use resident::{LoadStep, WeightPlacement};
pub use weights::{FfnWeights, LayerWeights, ModelWeights};
pub use workspace::{KvState, Scratch};

/// A loaded decoder: configuration, weights on a backend, and the file they live in.
pub struct Model {
    pub config: ModelConfig,
    /// The activation of the gated FFNs, as the backend computes it (from the row).
    pub activation: runit_backend::Activation,
    pub weights: ModelWeights,
    pub backend: Arc<dyn Backend>,
    pub file: Arc<GgufFile>,
    /// Each layer's mean key ([`key_means`]), measured for the first TurboQuant cache.
    key_means: std::sync::OnceLock<Vec<Vec<f32>>>,
}

impl Model {
    /// Reads the configuration and loads the weights of `file` onto `backend`.
    pub fn load(file: Arc<GgufFile>, backend: Arc<dyn Backend>) -> Result<Model, ModelError> {
        Model::load_placed(file, backend, WeightPlacement::Auto)
    }

    /// [`Model::load`] with the weights' host memory chosen by `placement`.
    pub fn load_placed(
        file: Arc<GgufFile>,
        backend: Arc<dyn Backend>,
        placement: WeightPlacement,
    ) -> Result<Model, ModelError> {
        Model::load_reporting(file, backend, placement, &|_| {})
    }

    /// [`Model::load_placed`], telling `progress` how far the copy and the weights have come.
    pub fn load_reporting(
        file: Arc<GgufFile>,
        backend: Arc<dyn Backend>,
        placement: WeightPlacement,
        progress: &dyn Fn(LoadStep),
    ) -> Result<Model, ModelError> {
        let config = ModelConfig::from_gguf(&file)?;
        let activation = features::decoder_activation(config.arch)?;
        if let Some(available) = backend.memory_available() {
            let needed: u64 = file.tensors().iter().map(|t| t.n_bytes).sum();
            if needed > available as u64 {
                return Err(ModelError::InsufficientMemory {
                    backend: backend.name(),
                    needed,
                    available: available as u64,
                });
            }
        }
        let memory = resident::host_memory(
            &file,
            placement,
            backend.reads_weights_from_host(),
            progress,
        );
        let weights =
            ModelWeights::load_reporting(&file, memory, &config, backend.as_ref(), progress)?;
        Ok(Model {
            config,
            activation,
            weights,
            backend,
            file,
            key_means: std::sync::OnceLock::new(),
        })
    }

    /// Each layer's mean key (`[kv_width]`), which TurboQuant key caches subtract
    /// ([`key_means`]), measured on first use.
    pub(crate) fn key_means(&self) -> Result<&[Vec<f32>], ModelError> {
        if let Some(means) = self.key_means.get() {
            return Ok(means);
        }
        let means = key_means::key_means(self)?;
        Ok(self.key_means.get_or_init(|| means))
    }
}
