//! Hyperparameters read from GGUF metadata, per the architecture's schema. A missing
//! required key is an error naming it; nothing is guessed from a model's name.

use runit_gguf::GgufFile;

use crate::arch::{self, Architecture, FfnKind};
use crate::ModelError;

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
    pub rope_theta: f32,
    /// Dimensions rotated per head (`rope.dimension_count`, default head_dim).
    pub rope_dim: usize,
    /// Linear RoPE scale applied to positions (1 / `rope.scaling.factor` for linear scaling).
    pub rope_freq_scale: f32,
    pub sliding_window: Option<usize>,
    pub expert_count: usize,
    pub expert_used_count: usize,
    /// Renormalise the selected experts' weights to sum to 1.
    pub expert_weights_norm: bool,
    pub vocab_size: usize,
}

struct Keys<'a> {
    file: &'a GgufFile,
    arch: &'static str,
}

impl Keys<'_> {
    fn key(&self, suffix: &str) -> String {
        format!("{}.{suffix}", self.arch)
    }

    fn required(&self, suffix: &str) -> Result<usize, ModelError> {
        let key = self.key(suffix);
        let value = self.file.get_u64(&key)?;
        positive(&key, value)
    }

    fn optional(&self, suffix: &str) -> Result<Option<usize>, ModelError> {
        let key = self.key(suffix);
        match self.file.get_u64_opt(&key)? {
            Some(v) => Ok(Some(positive(&key, v)?)),
            None => Ok(None),
        }
    }

    fn float(&self, suffix: &str) -> Result<Option<f32>, ModelError> {
        let key = self.key(suffix);
        match self.file.get_f32_opt(&key)? {
            Some(v) if !v.is_finite() || v <= 0.0 => Err(ModelError::BadHyperparameter {
                key,
                message: format!("must be a positive finite number, found {v}"),
            }),
            other => Ok(other),
        }
    }
}

fn positive(key: &str, value: u64) -> Result<usize, ModelError> {
    if value == 0 || value > (1 << 32) {
        return Err(ModelError::BadHyperparameter {
            key: key.to_string(),
            message: format!("must be between 1 and 2^32, found {value}"),
        });
    }
    Ok(value as usize)
}

fn bad(key: String, message: String) -> ModelError {
    ModelError::BadHyperparameter { key, message }
}

impl ModelConfig {
    /// Reads the configuration of `file`.
    pub fn from_gguf(file: &GgufFile) -> Result<ModelConfig, ModelError> {
        let arch_name = file.get_str("general.architecture")?;
        let arch = arch::find(arch_name).ok_or_else(|| ModelError::UnsupportedArchitecture {
            found: arch_name.to_string(),
            supported: arch::supported_names(),
        })?;
        let keys = Keys {
            file,
            arch: arch.name,
        };
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
        let rope_freq_scale = match file.get_str_opt(&keys.key("rope.scaling.type"))? {
            None | Some("none") | Some("yarn") | Some("llama3") => 1.0,
            Some("linear") => 1.0 / keys.float("rope.scaling.factor")?.unwrap_or(1.0),
            Some(other) => {
                return Err(bad(
                    keys.key("rope.scaling.type"),
                    format!("`{other}` is not supported (none, linear)"),
                ))
            }
        };
        let (expert_count, expert_used_count) = match arch.ffn {
            FfnKind::DenseSwiGlu => (0, 0),
            FfnKind::MoeSwiGlu => {
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
            FfnKind::MoeSwiGlu => match keys.optional("expert_feed_forward_length")? {
                Some(n) => n,
                None => keys.required("feed_forward_length")?,
            },
            FfnKind::DenseSwiGlu => keys.required("feed_forward_length")?,
        };
        let vocab_size = match keys.optional("vocab_size")? {
            Some(n) => n,
            None => file.get_array("tokenizer.ggml.tokens")?.len(),
        };
        Ok(ModelConfig {
            arch,
            context_length: keys.required("context_length")?,
            embedding_length,
            block_count: keys.required("block_count")?,
            feed_forward_length,
            head_count,
            head_count_kv,
            head_dim,
            rms_norm_eps: keys
                .float("attention.layer_norm_rms_epsilon")?
                .ok_or_else(|| ModelError::MissingKey {
                    key: keys.key("attention.layer_norm_rms_epsilon"),
                })?,
            rope_theta: keys.float("rope.freq_base")?.unwrap_or(10_000.0),
            rope_dim,
            rope_freq_scale,
            sliding_window: keys.optional("attention.sliding_window")?,
            expert_count,
            expert_used_count,
            expert_weights_norm: file
                .get_bool_opt(&keys.key("expert_weights_norm"))?
                .unwrap_or(false),
            vocab_size,
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
}
