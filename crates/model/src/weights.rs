//! Weight loading: every tensor of the architecture's schema, checked for shape and type, handed
//! to the backend in place (the CPU backend computes from that host memory: the memory map,
//! or its huge-page copy; see `resident`).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use runit_backend::{Backend, HostMemory, Op, Weight, WeightRole, WeightSource};
use runit_gguf::GgufFile;

use crate::arch::FfnKind;
use crate::schema::{Tensor, TENSORS};
use crate::{ModelConfig, ModelError};

/// Feed-forward weights of one layer.
pub enum FfnWeights {
    Dense {
        gate: Weight, // [embd, ff]
        up: Weight,   // [embd, ff]
        down: Weight, // [ff, embd]
    },
    Moe {
        router: Weight, // [embd, experts]
        gate: Weight,   // [embd, ff, experts]
        up: Weight,     // [embd, ff, experts]
        down: Weight,   // [ff, embd, experts]
    },
}

/// Weights of one decoder layer.
pub struct LayerWeights {
    pub attn_norm: Weight,      // [embd]
    pub q: Weight,              // [embd, heads * head_dim]
    pub k: Weight,              // [embd, kv_heads * head_dim]
    pub v: Weight,              // [embd, kv_heads * head_dim]
    pub q_bias: Option<Weight>, // [heads * head_dim]
    pub k_bias: Option<Weight>, // [kv_heads * head_dim]
    pub v_bias: Option<Weight>, // [kv_heads * head_dim]
    pub q_norm: Option<Weight>, // [head_dim] per head, or [heads * head_dim]
    pub k_norm: Option<Weight>, // [head_dim] per head, or [kv_heads * head_dim]
    pub attn_output: Weight,    // [heads * head_dim, embd]
    /// After attention, before the residual add (rows that norm after each sublayer).
    pub post_attention_norm: Option<Weight>, // [embd]
    pub ffn_norm: Weight,       // [embd]
    pub ffn: FfnWeights,
    /// After the FFN, before the residual add (rows that norm after each sublayer).
    pub post_ffn_norm: Option<Weight>, // [embd]
}

/// All weights of a decoder.
pub struct ModelWeights {
    pub token_embd: Weight,  // [embd, vocab]
    pub output_norm: Weight, // [embd]
    /// The output projection; the token embedding when the model ties them.
    pub output: Weight, // [embd, vocab]
    pub rope_freqs: Option<Weight>, // [rope_dim / 2]
    pub layers: Vec<LayerWeights>,
}

/// The loaded weights by layer (`None` for model tensors) and schema entry, taken out one by
/// one into [`ModelWeights`].
#[derive(Default)]
struct Loaded {
    weights: HashMap<(Option<usize>, Tensor), Weight>,
}

impl Loaded {
    fn take(&mut self, layer: Option<usize>, tensor: Tensor) -> Option<Weight> {
        self.weights.remove(&(layer, tensor))
    }

    /// A weight the decoder cannot do without; missing only when the row's switches leave it
    /// out of the schema (a structure the decoder does not have).
    fn require(&mut self, layer: Option<usize>, tensor: Tensor) -> Result<Weight, ModelError> {
        self.take(layer, tensor)
            .ok_or_else(|| ModelError::MissingTensor {
                name: TENSORS
                    .iter()
                    .find(|spec| spec.tensor == tensor)
                    .map_or_else(|| format!("{tensor:?}"), |spec| spec.name_in(layer)),
            })
    }
}

struct Loader<'a> {
    file: &'a Arc<GgufFile>,
    memory: Arc<dyn HostMemory>,
    backend: &'a dyn Backend,
}

impl Loader<'_> {
    /// The tensor `name` when the file holds it, checked for shape and type: the one place a
    /// weight reaches the backend.
    fn load(
        &self,
        name: &str,
        shape: &[usize],
        role: WeightRole,
        op: Op,
    ) -> Result<Option<Weight>, ModelError> {
        let Some(info) = self.file.tensor(name) else {
            return Ok(None);
        };
        let found: Vec<usize> = info.shape.iter().map(|&d| d as usize).collect();
        if found != shape {
            return Err(ModelError::TensorShape {
                name: name.to_string(),
                expected: shape.to_vec(),
                found,
            });
        }
        let supported = match role {
            WeightRole::Vector => info.ty == runit_quant::GgmlType::F32,
            _ => self.backend.supports(op, info.ty),
        };
        if !supported {
            return Err(ModelError::TensorType {
                name: name.to_string(),
                ty: info.ty,
                backend: self.backend.name(),
            });
        }
        let start = (self.file.data_offset() + info.offset) as usize;
        let range = start..start + info.n_bytes as usize;
        let weight = self.backend.load_weight(WeightSource {
            name,
            role,
            ty: info.ty,
            shape,
            memory: Arc::clone(&self.memory),
            range,
        })?;
        Ok(Some(weight))
    }
}

impl ModelWeights {
    /// Loads every weight of `config` from `file` onto `backend`, the tensors' bytes read
    /// from `memory` (the file's bytes, or a copy of them at the same offsets): each tensor
    /// of the row's schema ([`crate::schema`]), the token embedding standing in for an
    /// absent output head when the row ties them. A file holding a tensor the schema does not
    /// list (a bias, a shared expert) is refused: the model would compute something else.
    pub fn load(
        file: &Arc<GgufFile>,
        memory: Arc<dyn HostMemory>,
        config: &ModelConfig,
        backend: &dyn Backend,
    ) -> Result<ModelWeights, ModelError> {
        ModelWeights::load_reporting(file, memory, config, backend, &|_| {})
    }

    /// [`ModelWeights::load`], calling `progress` after each tensor.
    pub fn load_reporting(
        file: &Arc<GgufFile>,
        memory: Arc<dyn HostMemory>,
        config: &ModelConfig,
        backend: &dyn Backend,
        progress: &dyn Fn(crate::LoadStep),
    ) -> Result<ModelWeights, ModelError> {
        let loader = Loader {
            file,
            memory,
            backend,
        };
        // Every layer has tensors: a count beyond the file's is refused before it sizes the
        // schema's list.
        if config.block_count > file.tensors().len() {
            return Err(ModelError::BadHyperparameter {
                key: format!("{}.block_count", config.arch.name),
                message: format!(
                    "{} layers, but the file holds only {} tensors",
                    config.block_count,
                    file.tensors().len()
                ),
            });
        }
        let row = config.arch;
        let tensors = row.tensors(&config.dimensions(), config.block_count);
        let known: HashSet<&str> = tensors.iter().map(|tensor| tensor.name.as_str()).collect();
        if let Some(extra) = file
            .tensors()
            .iter()
            .find(|info| !known.contains(info.name.as_str()))
        {
            return Err(ModelError::UnexpectedTensor {
                name: extra.name.clone(),
                arch: row.name.to_string(),
            });
        }
        let mut loaded = Loaded::default();
        let total: u64 = file.tensors().iter().map(|info| info.n_bytes).sum();
        let mut done = 0;
        for tensor in &tensors {
            done += file.tensor(&tensor.name).map_or(0, |info| info.n_bytes);
            let op = match tensor.spec.role {
                WeightRole::TokenEmbedding => Op::Embedding,
                _ => Op::MatMul,
            };
            match loader.load(&tensor.name, &tensor.shape, tensor.spec.role, op)? {
                Some(weight) => {
                    loaded
                        .weights
                        .insert((tensor.layer, tensor.spec.tensor), weight);
                }
                None if tensor.spec.is_required(row) => {
                    return Err(ModelError::MissingTensor {
                        name: tensor.name.clone(),
                    })
                }
                None => {}
            }
            progress(crate::LoadStep::Loaded { bytes: done, total });
        }
        let output = match loaded.take(None, Tensor::Output) {
            Some(output) => output,
            None => {
                let embedding = tensors
                    .iter()
                    .find(|tensor| tensor.spec.tensor == Tensor::TokenEmbedding)
                    .expect("every row's schema has the token embedding");
                let role = embedding.spec.role;
                loader
                    .load(&embedding.name, &embedding.shape, role, Op::MatMul)?
                    .ok_or_else(|| ModelError::MissingTensor {
                        name: embedding.name.clone(),
                    })?
            }
        };
        let mut layers = Vec::with_capacity(config.block_count);
        for i in 0..config.block_count {
            let layer = Some(i);
            let ffn = match row.ffn {
                FfnKind::DenseGated => FfnWeights::Dense {
                    gate: loaded.require(layer, Tensor::FfnGate)?,
                    up: loaded.require(layer, Tensor::FfnUp)?,
                    down: loaded.require(layer, Tensor::FfnDown)?,
                },
                FfnKind::MoeGated => FfnWeights::Moe {
                    router: loaded.require(layer, Tensor::FfnRouter)?,
                    gate: loaded.require(layer, Tensor::FfnGateExperts)?,
                    up: loaded.require(layer, Tensor::FfnUpExperts)?,
                    down: loaded.require(layer, Tensor::FfnDownExperts)?,
                },
            };
            layers.push(LayerWeights {
                attn_norm: loaded.require(layer, Tensor::AttnNorm)?,
                q: loaded.require(layer, Tensor::AttnQ)?,
                k: loaded.require(layer, Tensor::AttnK)?,
                v: loaded.require(layer, Tensor::AttnV)?,
                q_bias: loaded.take(layer, Tensor::AttnQBias),
                k_bias: loaded.take(layer, Tensor::AttnKBias),
                v_bias: loaded.take(layer, Tensor::AttnVBias),
                q_norm: loaded.take(layer, Tensor::AttnQNorm),
                k_norm: loaded.take(layer, Tensor::AttnKNorm),
                attn_output: loaded.require(layer, Tensor::AttnOutput)?,
                post_attention_norm: loaded.take(layer, Tensor::PostAttnNorm),
                ffn_norm: loaded.require(layer, Tensor::FfnNorm)?,
                ffn,
                post_ffn_norm: loaded.take(layer, Tensor::PostFfnNorm),
            });
        }
        Ok(ModelWeights {
            token_embd: loaded.require(None, Tensor::TokenEmbedding)?,
            output_norm: loaded.require(None, Tensor::OutputNorm)?,
            output,
            rope_freqs: loaded.take(None, Tensor::RopeFreqs),
            layers,
        })
    }
}
