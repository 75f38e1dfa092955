//! Hyperparameters read from GGUF metadata, per the architecture's row. A missing required key
//! is an error naming it; metadata the engine does not implement is refused (see
//! `unsupported`); nothing is guessed from a model's name.

use runit_backend::Yarn;
use runit_gguf::GgufFile;

use crate::arch::{self, Architecture, AttentionScale, AttentionWindow, EmbeddingScale, FfnKind};
use crate::arch::{LogitSoftcap, RopeBase};
use crate::keys::{bad, Keys};
use crate::schema::Dimensions;
use crate::{rope_scaling, unsupported, ModelError};

/// Layers of Gemma 3 27B: llama.cpp scales its queries by `1 / sqrt(embd / heads)` (its
/// `query_pre_attn_scalar`), every other Gemma 3 size by `1 / sqrt(head_dim)`; the file states
/// neither, so llama.cpp tells them apart by this count (`LLM_TYPE_27B`).
const GEMMA3_27B_LAYERS: usize = 62;

/// Most layers a model may declare: far beyond any published model, small enough that the
/// per-layer settings a hostile count sizes stay a few megabytes.
pub const MAX_LAYERS: usize = 1 << 16;

/// The hyperparameters of a decoder.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    pub arch: &'static Architecture,
    /// Training context length (`{arch}.context_length`).
    pub context_length: usize,
    /// Width of the residual stream (`embedding_length`).
    pub embedding_length: usize,
    pub block_count: usize,
    /// Dense FFN width, or each expert's width for MoE.
    pub feed_forward_length: usize,
    pub head_count: usize,
    pub head_count_kv: usize,
    /// Per-head width of queries and keys (`attention.key_length`, default embd / heads).
    pub head_dim: usize,
    pub rms_norm_eps: f32,
    /// RoPE base of the global layers (`rope.freq_base`, default 10 000); see
    /// [`ModelConfig::layer`] for each layer's.
    pub rope_theta: f32,
    /// Dimensions rotated per head (`rope.dimension_count`, default head_dim).
    pub rope_dim: usize,
    /// RoPE scale of the global layers: 1 / `rope.scaling.factor` for linear and YaRN scaling
    /// (linear is the type llama.cpp assumes when none is stated), 1 for `none`.
    pub rope_freq_scale: f32,
    /// The attention window (`attention.sliding_window`) of the layers that have one; see
    /// [`ModelConfig::layer`] for which do.
    pub sliding_window: Option<usize>,
    pub expert_count: usize,
    pub expert_used_count: usize,
    /// Renormalise the selected experts' weights to sum to 1.
    pub expert_weights_norm: bool,
    pub vocab_size: usize,
    /// `cap` of `cap * tanh(score / cap)` on attention scores, for a row that reads it.
    pub attention_logit_softcap: Option<f32>,
    /// `cap` of `cap * tanh(logit / cap)` on the final logits, for a row that reads it.
    pub final_logit_softcap: Option<f32>,
    /// How an embedding is pooled from the final hidden states (`pooling_type`); `None`
    /// for a model that declares none (a decoder for generation).
    pub pooling: Option<Pooling>,
    /// Each layer's RoPE and attention window, `block_count` of them.
    layers: Vec<LayerConfig>,
}

/// How token states become one embedding (llama.cpp's `llama_pooling_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pooling {
    /// The mean of every token's state.
    Mean,
    /// The first token's state (CLS).
    First,
    /// The last token's state.
    Last,
}

/// What differs from layer to layer: RoPE base and scale, and the attention window.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LayerConfig {
    /// RoPE base frequency θ.
    pub rope_theta: f32,
    /// RoPE position scale (1 = none).
    pub rope_freq_scale: f32,
    /// YaRN's corrections (or a magnitude factor alone), the same in every layer as in
    /// llama.cpp; `None` for plain RoPE.
    pub rope_yarn: Option<Yarn>,
    /// Tokens each query attends back over; `None` for the whole context.
    pub sliding_window: Option<usize>,
}

impl ModelConfig {
    /// Reads the configuration of `file`, under the table's row for its architecture.
    pub fn from_gguf(file: &GgufFile) -> Result<ModelConfig, ModelError> {
        let arch_name = file.get_str("general.architecture")?;
        let arch = arch::find(arch_name).ok_or_else(|| ModelError::UnsupportedArchitecture {
            found: arch_name.to_string(),
            supported: arch::supported_names(),
        })?;
        ModelConfig::from_gguf_as(file, arch)
    }

    /// Reads the configuration of `file` under `arch`, a row that need not be in the table
    /// (one being written, in a test). The file's keys are read under `arch.name`.
    pub fn from_gguf_as(
        file: &GgufFile,
        arch: &'static Architecture,
    ) -> Result<ModelConfig, ModelError> {
        let keys = Keys {
            file,
            arch: arch.name,
        };
        unsupported::refuse_unimplemented(&keys, arch)?;
        let embedding_length = keys.required("embedding_length")?;
        let head_count = keys.required("attention.head_count")?;
        let head_count_kv = keys
            .optional("attention.head_count_kv")?
            .unwrap_or(head_count);
        if head_count % head_count_kv != 0 {
            return Err(bad(
                keys.key("attention.head_count_kv"),
                format!("{head_count_kv} does not divide attention.head_count {head_count}"),
            ));
        }
        let default_head_dim = embedding_length / head_count;
        let head_dim = keys
            .optional("attention.key_length")?
            .unwrap_or(default_head_dim);
        let value_dim = keys
            .optional("attention.value_length")?
            .unwrap_or(default_head_dim);
        if value_dim != head_dim {
            return Err(bad(
                keys.key("attention.value_length"),
                format!("{value_dim} differs from key_length {head_dim}; not supported"),
            ));
        }
        let rope_dim = keys.optional("rope.dimension_count")?.unwrap_or(head_dim);
        if rope_dim > head_dim || rope_dim % 2 != 0 {
            return Err(bad(
                keys.key("rope.dimension_count"),
                format!("{rope_dim} must be even and at most the head size {head_dim}"),
            ));
        }
        let (expert_count, expert_used_count) = match arch.ffn {
            FfnKind::DenseGated => (0, 0),
            FfnKind::MoeGated => {
                let count = keys.required("expert_count")?;
                let used = keys.required("expert_used_count")?;
                if used > count {
                    return Err(bad(
                        keys.key("expert_used_count"),
                        format!("{used} exceeds expert_count {count}"),
                    ));
                }
                (count, used)
            }
        };
        let feed_forward_length = match arch.ffn {
            FfnKind::MoeGated => match keys.optional("expert_feed_forward_length")? {
                Some(n) => n,
                None => keys.required("feed_forward_length")?,
            },
            FfnKind::DenseGated => keys.required("feed_forward_length")?,
        };
        let tokens = file
            .get_array_opt("tokenizer.ggml.tokens")?
            .map(|t| t.len());
        let vocab_size = match (keys.optional("vocab_size")?, tokens) {
            // Every id the output head can pick must be a token the tokenizer can print.
            (Some(n), Some(tokens)) if tokens < n => {
                return Err(bad(
                    keys.key("vocab_size"),
                    format!("{n} rows of logits, but tokenizer.ggml.tokens holds only {tokens}"),
                ))
            }
            (Some(n), _) => n,
            (None, Some(tokens)) => tokens,
            (None, None) => file.get_array("tokenizer.ggml.tokens")?.len(),
        };
        let (attention_logit_softcap, final_logit_softcap) = match arch.logit_softcap {
            LogitSoftcap::None => (None, None),
            LogitSoftcap::FromMetadata => (
                keys.float("attn_logit_softcapping")?,
                keys.float("final_logit_softcapping")?,
            ),
        };
        let block_count = keys.required("block_count")?;
        // The per-layer settings below are sized by this count before any tensor is read
        // (the loader then checks it against the tensors present).
        if block_count > MAX_LAYERS {
            return Err(bad(
                keys.key("block_count"),
                format!("{block_count} layers is beyond the {MAX_LAYERS} RunIT accepts"),
            ));
        }
        let context_length = keys.required("context_length")?;
        let sliding_window = match arch.attention_window {
            AttentionWindow::EveryLayer => keys.optional("attention.sliding_window")?,
            // The pattern's local layers need their window.
            AttentionWindow::Pattern { .. } => Some(keys.required("attention.sliding_window")?),
        };
        if let Some(window) = sliding_window.filter(|&window| window > context_length) {
            return Err(bad(
                keys.key("attention.sliding_window"),
                format!("{window} exceeds the context_length {context_length}"),
            ));
        }
        let scaling = rope_scaling::read(&keys, context_length)?;
        let global = LayerConfig {
            rope_theta: keys.float("rope.freq_base")?.unwrap_or(10_000.0),
            rope_freq_scale: scaling.freq_scale,
            rope_yarn: scaling.yarn,
            sliding_window,
        };
        let layers = layer_configs(&keys, arch, global, block_count)?;
        // Values above 3 were refused by `unsupported`.
        let pooling = match keys.unsigned("pooling_type")? {
            Some(1) => Some(Pooling::Mean),
            Some(2) => Some(Pooling::First),
            Some(3) => Some(Pooling::Last),
            _ => None,
        };
        Ok(ModelConfig {
            arch,
            pooling,
            context_length,
            embedding_length,
            block_count,
            feed_forward_length,
            head_count,
            head_count_kv,
            head_dim,
            rms_norm_eps: keys
                .float("attention.layer_norm_rms_epsilon")?
                .ok_or_else(|| ModelError::MissingKey {
                    key: keys.key("attention.layer_norm_rms_epsilon"),
                })?,
            rope_theta: global.rope_theta,
            rope_dim,
            rope_freq_scale: global.rope_freq_scale,
            sliding_window: global.sliding_window,
            expert_count,
            expert_used_count,
            expert_weights_norm: keys.boolean("expert_weights_norm")?.unwrap_or(false),
            vocab_size,
            attention_logit_softcap,
            final_logit_softcap,
            layers,
        })
    }

    /// Width of all query heads together.
    pub fn q_width(&self) -> usize {
        self.head_count * self.head_dim
    }

    /// Width of all key (or value) heads together.
    pub fn kv_width(&self) -> usize {
        self.head_count_kv * self.head_dim
    }

    /// The RoPE and attention window of layer `index` (below `block_count`).
    pub fn layer(&self, index: usize) -> &LayerConfig {
        &self.layers[index]
    }

    /// Every layer's RoPE and attention window.
    pub fn layers(&self) -> &[LayerConfig] {
        &self.layers
    }

    /// The factor the token embeddings are multiplied by, when the row scales them.
    pub fn embedding_scale(&self) -> Option<f32> {
        match self.arch.embedding_scale {
            EmbeddingScale::None => None,
            EmbeddingScale::SqrtEmbd => Some((self.embedding_length as f32).sqrt()),
        }
    }

    /// The factor the queries are multiplied by before the attention, for a row that scales
    /// them there ([`AttentionScale::Queries`]: `1 / sqrt(query_pre_attn_scalar)`, the scalar
    /// by llama.cpp's Gemma 3 rule); `None` when the scores take `1 / sqrt(head_dim)`.
    pub fn query_scale(&self) -> Option<f32> {
        match self.arch.attention_scale {
            AttentionScale::Scores => None,
            AttentionScale::Queries => {
                let scalar = if self.block_count == GEMMA3_27B_LAYERS {
                    self.embedding_length / self.head_count
                } else {
                    self.head_dim
                };
                Some(1.0 / (scalar as f32).sqrt())
            }
        }
    }

    /// The extents the tensor schema's shapes are made of.
    pub fn dimensions(&self) -> Dimensions {
        Dimensions {
            embedding: self.embedding_length,
            vocab: self.vocab_size,
            q_width: self.q_width(),
            kv_width: self.kv_width(),
            head_dim: self.head_dim,
            feed_forward: self.feed_forward_length,
            experts: self.expert_count,
            rope_dim: self.rope_dim,
        }
    }
}

/// Each layer's configuration: `global` everywhere, or under a window pattern the windowed
/// layers with the window and their local RoPE base.
fn layer_configs(
    keys: &Keys,
    arch: &Architecture,
    global: LayerConfig,
    block_count: usize,
) -> Result<Vec<LayerConfig>, ModelError> {
    let period = match arch.attention_window {
        AttentionWindow::EveryLayer => return Ok(vec![global; block_count]),
        AttentionWindow::Pattern { default_period } => {
            let key = "attention.sliding_window_pattern";
            match keys.value(key) {
                None => default_period,
                Some(value) => value
                    .as_i64()
                    .filter(|&period| (0..=block_count as i64).contains(&period))
                    .map(|period| period as usize)
                    .ok_or_else(|| {
                        keys.unsupported(
                            key,
                            crate::unsupported::describe(value),
                            &format!(
                                "a period of layers from 0 to block_count {block_count} \
                                 (the last layer of each period global)"
                            ),
                        )
                    })?,
            }
        }
    };
    let local = LayerConfig {
        rope_theta: match arch.rope_base {
            RopeBase::Uniform => global.rope_theta,
            RopeBase::LocalGlobal { local_default } => {
                keys.float("rope.freq_base_swa")?.unwrap_or(local_default)
            }
        },
        rope_freq_scale: match arch.rope_base {
            RopeBase::Uniform => global.rope_freq_scale,
            RopeBase::LocalGlobal { .. } => 1.0,
        },
        // llama.cpp gives the windowed layers the context's YaRN factors too.
        rope_yarn: global.rope_yarn,
        sliding_window: global.sliding_window,
    };
    let global = LayerConfig {
        sliding_window: None,
        ..global
    };
    // llama.cpp's `set_swa_pattern`: period 0 windows every layer, else all but the last of
    // each period; without a window in the file every layer is global.
    let windowed = |layer: usize| period == 0 || layer % period < period - 1;
    Ok((0..block_count)
        .map(|layer| match local.sliding_window {
            Some(_) if windowed(layer) => local,
            _ => global,
        })
        .collect())
}
