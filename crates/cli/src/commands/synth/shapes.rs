//! The model shapes `runit synth` can imitate: hyperparameters from each model's public
//! `config.json`, their tensors from the model crate's schema (what the loader reads), and
//! their GGUF metadata keys.

use anyhow::{bail, Context, Result};
use runit_gguf::Value;
use runit_model::arch::{self, Architecture, FfnKind};
use runit_model::schema::Dimensions;

use super::vocab::TokenizerStyle;

/// One public model's shape: everything but the weights' values.
#[derive(Debug, Clone, Copy)]
pub struct Shape {
    /// The name `--shape` takes (`qwen2.5-7b`).
    pub name: &'static str,
    /// The Hugging Face repository whose `config.json` the numbers come from.
    pub source: &'static str,
    /// `general.architecture`: a row of the model crate's architecture table.
    pub architecture: &'static str,
    /// `num_hidden_layers`.
    pub num_layers: u32,
    /// `hidden_size`.
    pub embedding_length: u64,
    /// `intermediate_size`: the dense FFN's width, or each expert's.
    pub feed_forward_length: u64,
    /// `num_attention_heads`.
    pub num_heads: u64,
    /// `num_key_value_heads`.
    pub num_kv_heads: u64,
    /// `head_dim` when the config states one that differs from `hidden_size / heads`
    /// (written as `attention.key_length` / `value_length`).
    pub explicit_head_dim: Option<u64>,
    /// `max_position_embeddings`.
    pub context_length: u32,
    /// `rope_theta`.
    pub rope_theta: f32,
    /// `sliding_window` and `rope_local_base_freq` of a model whose layers alternate between
    /// windowed and global attention (Gemma 3: five windowed layers, then a global one, the
    /// period its architecture row assumes); `None` for global attention everywhere.
    pub window: Option<Window>,
    /// `rms_norm_eps`.
    pub rms_norm_eps: f32,
    /// `vocab_size`: rows of the embedding and output matrices, and the token count.
    pub vocab_size: u64,
    /// `tie_word_embeddings`: no `output.weight`, the embedding doubles as the output head.
    pub tied_embeddings: bool,
    /// The experts of a mixture-of-experts FFN; `None` for a dense one.
    pub experts: Option<Experts>,
    /// Special tokens and pre-tokenizer of the model's tokenizer.
    pub tokenizer: &'static TokenizerStyle,
}

/// The mixture-of-experts FFN of a shape: a router and `count` SwiGLU experts per layer.
#[derive(Debug, Clone, Copy)]
pub struct Experts {
    /// `num_experts`.
    pub count: u64,
    /// `num_experts_per_tok`: experts each token is sent to.
    pub used_per_token: u64,
    /// `norm_topk_prob`: the chosen experts' router weights are renormalised to sum to 1.
    pub normalize_weights: bool,
}

/// The windowed layers of a shape.
#[derive(Debug, Clone, Copy)]
pub struct Window {
    /// `sliding_window`: tokens a windowed layer attends back over.
    pub tokens: u32,
    /// `rope_local_base_freq`: the windowed layers' RoPE base.
    pub rope_theta: f32,
}

/// Every shape, in the order `--list-shapes` prints them.
pub const SHAPES: [Shape; 7] = [
    Shape {
        name: "qwen2.5-0.5b",
        source: "Qwen/Qwen2.5-0.5B-Instruct",
        architecture: "qwen2",
        num_layers: 24,
        embedding_length: 896,
        feed_forward_length: 4864,
        num_heads: 14,
        num_kv_heads: 2,
        explicit_head_dim: None,
        context_length: 32768,
        rope_theta: 1_000_000.0,
        window: None,
        rms_norm_eps: 1e-6,
        vocab_size: 151_936,
        tied_embeddings: true,
        experts: None,
        tokenizer: &super::vocab::QWEN,
    },
    Shape {
        name: "qwen2.5-7b",
        source: "Qwen/Qwen2.5-7B-Instruct",
        architecture: "qwen2",
        num_layers: 28,
        embedding_length: 3584,
        feed_forward_length: 18944,
        num_heads: 28,
        num_kv_heads: 4,
        explicit_head_dim: None,
        context_length: 32768,
        rope_theta: 1_000_000.0,
        window: None,
        rms_norm_eps: 1e-6,
        vocab_size: 152_064,
        tied_embeddings: false,
        experts: None,
        tokenizer: &super::vocab::QWEN,
    },
    Shape {
        name: "qwen3-0.6b",
        source: "Qwen/Qwen3-0.6B",
        architecture: "qwen3",
        num_layers: 28,
        embedding_length: 1024,
        feed_forward_length: 3072,
        num_heads: 16,
        num_kv_heads: 8,
        explicit_head_dim: Some(128),
        context_length: 40960,
        rope_theta: 1_000_000.0,
        window: None,
        rms_norm_eps: 1e-6,
        vocab_size: 151_936,
        tied_embeddings: true,
        experts: None,
        tokenizer: &super::vocab::QWEN,
    },
    Shape {
        name: "llama3-8b",
        source: "meta-llama/Meta-Llama-3-8B-Instruct",
        architecture: "llama",
        num_layers: 32,
        embedding_length: 4096,
        feed_forward_length: 14336,
        num_heads: 32,
        num_kv_heads: 8,
        explicit_head_dim: None,
        context_length: 8192,
        rope_theta: 500_000.0,
        window: None,
        rms_norm_eps: 1e-5,
        vocab_size: 128_256,
        tied_embeddings: false,
        experts: None,
        tokenizer: &super::vocab::LLAMA3,
    },
    Shape {
        name: "smollm2-135m",
        source: "HuggingFaceTB/SmolLM2-135M-Instruct",
        architecture: "llama",
        num_layers: 30,
        embedding_length: 576,
        feed_forward_length: 1536,
        num_heads: 9,
        num_kv_heads: 3,
        explicit_head_dim: None,
        context_length: 8192,
        rope_theta: 100_000.0,
        window: None,
        rms_norm_eps: 1e-5,
        vocab_size: 49_152,
        tied_embeddings: true,
        experts: None,
        tokenizer: &super::vocab::SMOLLM,
    },
    Shape {
        name: "olmoe-1b-7b",
        source: "allenai/OLMoE-1B-7B-0924",
        architecture: "olmoe",
        num_layers: 16,
        embedding_length: 2048,
        feed_forward_length: 1024,
        num_heads: 16,
        num_kv_heads: 16,
        explicit_head_dim: None,
        context_length: 4096,
        rope_theta: 10_000.0,
        window: None,
        rms_norm_eps: 1e-5,
        vocab_size: 50_304,
        tied_embeddings: false,
        experts: Some(Experts {
            count: 64,
            used_per_token: 8,
            normalize_weights: false,
        }),
        tokenizer: &super::vocab::OLMO,
    },
    Shape {
        name: "gemma3-1b",
        source: "google/gemma-3-1b-it",
        architecture: "gemma3",
        num_layers: 26,
        embedding_length: 1152,
        feed_forward_length: 6912,
        num_heads: 4,
        num_kv_heads: 1,
        explicit_head_dim: Some(256),
        context_length: 32768,
        rope_theta: 1_000_000.0,
        window: Some(Window {
            tokens: 512,
            rope_theta: 10_000.0,
        }),
        rms_norm_eps: 1e-6,
        vocab_size: 262_144,
        tied_embeddings: true,
        experts: None,
        tokenizer: &super::vocab::GEMMA,
    },
];

/// A tensor the file will hold: name and shape in ggml order (`shape[0]` is the row length).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorSpec {
    pub name: String,
    pub shape: Vec<u64>,
    /// A normalisation weight (its values sit near 1).
    pub norm: bool,
}

impl TensorSpec {
    /// Elements in one row.
    pub fn row_length(&self) -> u64 {
        self.shape[0]
    }

    /// Rows: the product of every extent but the first.
    pub fn num_rows(&self) -> u64 {
        self.shape[1..].iter().product()
    }

    /// Total elements.
    pub fn num_elements(&self) -> u64 {
        self.shape.iter().product()
    }
}

/// The shape named `name`, or an error listing the valid names.
pub fn find(name: &str) -> Result<&'static Shape> {
    match SHAPES
        .iter()
        .find(|shape| shape.name.eq_ignore_ascii_case(name))
    {
        Some(shape) => Ok(shape),
        None => bail!(
            "unknown shape `{name}`; valid shapes: {}",
            SHAPES.map(|shape| shape.name).join(", ")
        ),
    }
}

impl Shape {
    /// Per-head width of queries and keys.
    pub fn head_dim(&self) -> u64 {
        self.explicit_head_dim
            .unwrap_or(self.embedding_length / self.num_heads)
    }

    /// The model crate's architecture row for this shape.
    pub fn architecture_row(&self) -> Result<&'static Architecture> {
        match arch::find(self.architecture) {
            Some(row) => Ok(row),
            None => bail!(
                "shape `{}`: architecture `{}` is not in the model crate's table ({})",
                self.name,
                self.architecture,
                arch::supported_names()
            ),
        }
    }

    /// Every tensor of a model with `num_layers` layers, from the model crate's tensor
    /// schema for the shape's row: the required ones, and the output head unless the shape
    /// ties it to the embedding (callers sort them into llama.cpp's loader order).
    pub fn tensors(&self, num_layers: u32) -> Result<Vec<TensorSpec>> {
        let row = self.architecture_row()?;
        if (row.ffn == FfnKind::MoeGated) != self.experts.is_some() {
            bail!(
                "shape `{}`: architecture `{}` has a {:?} feed-forward but the shape {} experts",
                self.name,
                self.architecture,
                row.ffn,
                if self.experts.is_some() {
                    "has"
                } else {
                    "lacks"
                }
            );
        }
        let extent = |value: u64| usize::try_from(value).context("shape extent above usize");
        let head_dim = self.head_dim();
        let dimensions = Dimensions {
            embedding: extent(self.embedding_length)?,
            vocab: extent(self.vocab_size)?,
            q_width: extent(self.num_heads * head_dim)?,
            kv_width: extent(self.num_kv_heads * head_dim)?,
            head_dim: extent(head_dim)?,
            feed_forward: extent(self.feed_forward_length)?,
            experts: extent(self.experts.map_or(0, |experts| experts.count))?,
            rope_dim: extent(head_dim)?,
        };
        Ok(row
            .tensors(&dimensions, extent(num_layers.into())?)
            .into_iter()
            .filter(|tensor| tensor.spec.is_written(row, self.tied_embeddings))
            .map(|tensor| TensorSpec {
                name: tensor.name,
                shape: tensor.shape.iter().map(|&extent| extent as u64).collect(),
                norm: tensor.spec.tensor.is_norm(),
            })
            .collect())
    }

    /// The `<arch>.*` hyperparameter keys for a model with `num_layers` layers, as
    /// llama.cpp's converter writes them.
    pub fn hyperparameters(&self, num_layers: u32) -> Vec<(String, Value)> {
        let key = |suffix: &str| format!("{}.{suffix}", self.architecture);
        let count = |value: u64| Value::U32(u32::try_from(value).expect("table sizes fit in u32"));
        let mut keys = vec![
            (key("block_count"), Value::U32(num_layers)),
            (key("context_length"), Value::U32(self.context_length)),
            (key("embedding_length"), count(self.embedding_length)),
            (key("feed_forward_length"), count(self.feed_forward_length)),
            (key("attention.head_count"), count(self.num_heads)),
            (key("attention.head_count_kv"), count(self.num_kv_heads)),
            (key("rope.freq_base"), Value::F32(self.rope_theta)),
            (
                key("attention.layer_norm_rms_epsilon"),
                Value::F32(self.rms_norm_eps),
            ),
        ];
        if let Some(head_dim) = self.explicit_head_dim {
            keys.push((key("attention.key_length"), count(head_dim)));
            keys.push((key("attention.value_length"), count(head_dim)));
        }
        if let Some(experts) = self.experts {
            keys.push((key("expert_count"), count(experts.count)));
            keys.push((key("expert_used_count"), count(experts.used_per_token)));
            // llama.cpp's converter writes this only for models that renormalise (not OLMoE);
            // an absent key reads as false.
            if experts.normalize_weights {
                keys.push((key("expert_weights_norm"), Value::Bool(true)));
            }
        }
        if let Some(window) = self.window {
            keys.push((key("attention.sliding_window"), Value::U32(window.tokens)));
            keys.push((key("rope.freq_base_swa"), Value::F32(window.rope_theta)));
        }
        keys.push((key("vocab_size"), count(self.vocab_size)));
        keys.push((key("rope.dimension_count"), count(self.head_dim())));
        keys
    }

    /// Parameters of the full-depth model (every tensor's elements).
    pub fn num_parameters(&self) -> Result<u64> {
        Ok(self
            .tensors(self.num_layers)?
            .iter()
            .map(TensorSpec::num_elements)
            .sum())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_shape_builds_and_counts_like_its_model() {
        // Parameter counts the model cards state, to 1%: the tables above are the configs.
        let stated = [
            ("qwen2.5-0.5b", 0.494e9),
            ("qwen2.5-7b", 7.62e9),
            ("qwen3-0.6b", 0.596e9),
            ("llama3-8b", 8.03e9),
            ("smollm2-135m", 0.1348e9),
            ("olmoe-1b-7b", 6.92e9),
            ("gemma3-1b", 1.0e9),
        ];
        for (name, parameters) in stated {
            let shape = find(name).expect("shape in the table");
            let counted = shape.num_parameters().expect("tensors") as f64;
            assert!(
                (counted / parameters - 1.0).abs() < 0.01,
                "{name}: {counted} parameters, model card says {parameters}"
            );
        }
    }

    #[test]
    fn unknown_shape_lists_the_valid_ones() {
        let message = find("gpt-5").expect_err("not a shape").to_string();
        for shape in SHAPES {
            assert!(message.contains(shape.name), "{message}");
        }
    }
}
