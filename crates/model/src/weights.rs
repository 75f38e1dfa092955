//! Weight loading: every tensor the configuration implies, checked for shape and type, handed
//! to the backend in place (the CPU backend computes from that host memory: the memory map,
//! or its huge-page copy; see `resident`).

use std::sync::Arc;

use runit_backend::{Backend, HostMemory, Op, Weight, WeightRole, WeightSource};
use runit_gguf::GgufFile;

use crate::arch::{FfnKind, QkNorm};
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
    pub ffn_norm: Weight,       // [embd]
    pub ffn: FfnWeights,
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

struct Loader<'a> {
    file: &'a Arc<GgufFile>,
    memory: Arc<dyn HostMemory>,
    backend: &'a dyn Backend,
}

impl Loader<'_> {
    fn tensor(&self, name: &str, shape: &[usize], op: Op) -> Result<Weight, ModelError> {
        self.optional(name, shape, op)?
            .ok_or_else(|| ModelError::MissingTensor {
                name: name.to_string(),
            })
    }

    fn optional(&self, name: &str, shape: &[usize], op: Op) -> Result<Option<Weight>, ModelError> {
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
        let is_vector = shape.len() == 1;
        let supported = if is_vector {
            info.ty == runit_quant::GgmlType::F32
        } else {
            self.backend.supports(op, info.ty)
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
        // The token embedding keeps its role when it is loaded again as the tied output.
        let role = match name {
            "token_embd.weight" => WeightRole::TokenEmbedding,
            _ => WeightRole::of_shape(shape),
        };
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
    /// from `memory` (the file's bytes, or a copy of them at the same offsets).
    pub fn load(
        file: &Arc<GgufFile>,
        memory: Arc<dyn HostMemory>,
        config: &ModelConfig,
        backend: &dyn Backend,
    ) -> Result<ModelWeights, ModelError> {
        let loader = Loader {
            file,
            memory,
            backend,
        };
        let embd = config.embedding_length;
        let vocab = config.vocab_size;
        let q_width = config.q_width();
        let kv_width = config.kv_width();
        let ff = config.feed_forward_length;
        let token_embd = loader.tensor("token_embd.weight", &[embd, vocab], Op::Embedding)?;
        let output = match loader.optional("output.weight", &[embd, vocab], Op::MatMul)? {
            Some(output) => output,
            None => loader.tensor("token_embd.weight", &[embd, vocab], Op::MatMul)?,
        };
        let mut layers = Vec::with_capacity(config.block_count);
        for i in 0..config.block_count {
            let name = |suffix: &str| format!("blk.{i}.{suffix}");
            let vector =
                |suffix: &str, len: usize| loader.tensor(&name(suffix), &[len], Op::MatMul);
            let matrix = |suffix: &str, cols: usize, rows: usize| {
                loader.tensor(&name(suffix), &[cols, rows], Op::MatMul)
            };
            let bias = |suffix: &str, len: usize| -> Result<Option<Weight>, ModelError> {
                if config.arch.qkv_bias {
                    Ok(Some(vector(suffix, len)?))
                } else {
                    Ok(None)
                }
            };
            let (q_norm, k_norm) = match config.arch.qk_norm {
                QkNorm::None => (None, None),
                QkNorm::PerHead => (
                    Some(vector("attn_q_norm.weight", config.head_dim)?),
                    Some(vector("attn_k_norm.weight", config.head_dim)?),
                ),
                QkNorm::FullWidth => (
                    Some(vector("attn_q_norm.weight", q_width)?),
                    Some(vector("attn_k_norm.weight", kv_width)?),
                ),
            };
            let ffn = match config.arch.ffn {
                FfnKind::DenseSwiGlu => FfnWeights::Dense {
                    gate: matrix("ffn_gate.weight", embd, ff)?,
                    up: matrix("ffn_up.weight", embd, ff)?,
                    down: matrix("ffn_down.weight", ff, embd)?,
                },
                FfnKind::MoeSwiGlu => {
                    let experts = config.expert_count;
                    let stacked = |suffix: &str, cols: usize, rows: usize| {
                        loader.tensor(&name(suffix), &[cols, rows, experts], Op::MatMul)
                    };
                    FfnWeights::Moe {
                        router: matrix("ffn_gate_inp.weight", embd, experts)?,
                        gate: stacked("ffn_gate_exps.weight", embd, ff)?,
                        up: stacked("ffn_up_exps.weight", embd, ff)?,
                        down: stacked("ffn_down_exps.weight", ff, embd)?,
                    }
                }
            };
            layers.push(LayerWeights {
                attn_norm: vector("attn_norm.weight", embd)?,
                q: matrix("attn_q.weight", embd, q_width)?,
                k: matrix("attn_k.weight", embd, kv_width)?,
                v: matrix("attn_v.weight", embd, kv_width)?,
                q_bias: bias("attn_q.bias", q_width)?,
                k_bias: bias("attn_k.bias", kv_width)?,
                v_bias: bias("attn_v.bias", kv_width)?,
                q_norm,
                k_norm,
                attn_output: matrix("attn_output.weight", q_width, embd)?,
                ffn_norm: vector("ffn_norm.weight", embd)?,
                ffn,
            });
        }
        Ok(ModelWeights {
            token_embd,
            output_norm: loader.tensor("output_norm.weight", &[embd], Op::MatMul)?,
            output,
            rope_freqs: loader.optional("rope_freqs.weight", &[config.rope_dim / 2], Op::MatMul)?,
            layers,
        })
    }
}
