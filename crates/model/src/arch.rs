//! The architecture table: every supported architecture is a row of switches read by the one
//! generic decoder, the weight loader (through the tensor schema in [`crate::schema`]),
//! `runit synth` and the quantize plan, never a copied model file. Adding an architecture is
//! adding a row, plus an enum variant only when something is structurally new.

use runit_backend::RopeStyle;

/// Which query/key normalisation an architecture applies after the projections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QkNorm {
    None,
    /// RMSNorm over each head (`attn_q_norm` is `[head_dim]`): Qwen3.
    PerHead,
    /// RMSNorm over the whole projection (`attn_q_norm` is `[heads * head_dim]`): OLMoE.
    FullWidth,
}

/// Where each layer normalises its sublayers (attention and FFN) relative to the residual.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NormPlacement {
    /// `x + f(norm(x))` (`attn_norm`, `ffn_norm`): LLaMA, Qwen, OLMoE.
    Pre,
    /// `x + norm(f(x))` (`post_attention_norm`, `post_ffw_norm`): OLMo 2.
    Post,
    /// `x + post_norm(f(pre_norm(x)))`, all four norms: Gemma 2 and 3.
    PreAndPost,
}

impl NormPlacement {
    /// Norms before each sublayer.
    pub fn has_pre_norms(self) -> bool {
        matches!(self, NormPlacement::Pre | NormPlacement::PreAndPost)
    }

    /// Norms after each sublayer, before the residual add.
    pub fn has_post_norms(self) -> bool {
        matches!(self, NormPlacement::Post | NormPlacement::PreAndPost)
    }
}

/// The feed-forward block of each layer: `down(act(gate(x)) * up(x))`, with the activation
/// of [`Architecture::activation`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FfnKind {
    /// One gated FFN.
    DenseGated,
    /// Router softmax, the top-k of `expert_count` gated FFNs, weighted sum.
    MoeGated,
}

/// The activation of the gated FFN.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activation {
    /// `x * sigmoid(x)`: SwiGLU.
    Silu,
    /// GELU with the tanh approximation (`gelu_pytorch_tanh`): GeGLU of Gemma.
    GeluTanh,
}

/// A factor applied to the looked-up token embeddings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EmbeddingScale {
    None,
    /// `sqrt(embedding_length)`: Gemma.
    SqrtEmbd,
}

/// Which layers attend within a sliding window (`attention.sliding_window` tokens).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttentionWindow {
    /// Every layer uses the window when the file states one (none when it does not).
    EveryLayer,
    /// Layers in periods of `attention.sliding_window_pattern` (default `default_period`):
    /// the last layer of each period attends globally, the others locally (Gemma 3: five
    /// local, then one global). Without a window in the file every layer is global.
    Pattern { default_period: usize },
}

/// The RoPE base frequency of each layer.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum RopeBase {
    /// `rope.freq_base` (default 10 000) and the file's RoPE scaling in every layer.
    Uniform,
    /// Windowed layers use `rope.freq_base_swa` (default `local_default`) without scaling;
    /// global layers `rope.freq_base` with the file's scaling (Gemma 3).
    LocalGlobal { local_default: f32 },
}

/// Where the attention's `1 / sqrt(d)` scale is applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttentionScale {
    /// On the scores `q · k`, with `d` the head size (LLaMA).
    Scores,
    /// On the queries before the attention (ggml's `ggml_scale` of Q, then a score scale
    /// of 1), with `d` Gemma's `query_pre_attn_scalar`; see `ModelConfig::query_scale`.
    Queries,
}

/// Soft-capping `cap * tanh(x / cap)` of attention scores and final logits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogitSoftcap {
    /// No capping; a file that asks for it is refused.
    None,
    /// The caps the file states (`attn_logit_softcapping`, `final_logit_softcapping`): Gemma 2.
    FromMetadata,
}

/// One row of the table.
#[derive(Debug, Clone, PartialEq)]
pub struct Architecture {
    /// `general.architecture` in the GGUF file.
    pub name: &'static str,
    /// Families this row covers, for messages.
    pub covers: &'static str,
    /// Which dimensions RoPE rotates together.
    pub rope_style: RopeStyle,
    /// The RoPE base (and whether scaling applies) per layer.
    pub rope_base: RopeBase,
    /// Q, K and V projections carry biases.
    pub qkv_bias: bool,
    pub qk_norm: QkNorm,
    pub norm_placement: NormPlacement,
    pub ffn: FfnKind,
    pub activation: Activation,
    pub embedding_scale: EmbeddingScale,
    pub attention_window: AttentionWindow,
    pub attention_scale: AttentionScale,
    pub logit_softcap: LogitSoftcap,
    /// `output.weight` may be absent: the token embedding is then the output head.
    pub tied_output: bool,
}

/// A row's switches where most rows agree: LLaMA's, less its name and RoPE pairing.
const LLAMA: Architecture = Architecture {
    name: "llama",
    covers: "LLaMA, Mistral, SmolLM",
    rope_style: RopeStyle::Normal,
    rope_base: RopeBase::Uniform,
    qkv_bias: false,
    qk_norm: QkNorm::None,
    norm_placement: NormPlacement::Pre,
    ffn: FfnKind::DenseGated,
    activation: Activation::Silu,
    embedding_scale: EmbeddingScale::None,
    attention_window: AttentionWindow::EveryLayer,
    attention_scale: AttentionScale::Scores,
    logit_softcap: LogitSoftcap::None,
    tied_output: true,
};

/// Every supported architecture.
pub const ARCHITECTURES: &[Architecture] = &[
    LLAMA,
    Architecture {
        name: "qwen2",
        covers: "Qwen2, Qwen2.5",
        rope_style: RopeStyle::Neox,
        qkv_bias: true,
        ..LLAMA
    },
    Architecture {
        name: "qwen3",
        covers: "Qwen3",
        rope_style: RopeStyle::Neox,
        qk_norm: QkNorm::PerHead,
        ..LLAMA
    },
    Architecture {
        name: "olmoe",
        covers: "OLMoE",
        rope_style: RopeStyle::Neox,
        qk_norm: QkNorm::FullWidth,
        ffn: FfnKind::MoeGated,
        tied_output: false,
        ..LLAMA
    },
    // llama.cpp's `llama_model_gemma3`: five windowed layers (RoPE base 10 000) then one
    // global. A `final_logit_softcapping` in the file is refused (not computed yet).
    Architecture {
        name: "gemma3",
        covers: "Gemma 3",
        rope_style: RopeStyle::Neox,
        rope_base: RopeBase::LocalGlobal {
            local_default: 10_000.0,
        },
        qk_norm: QkNorm::PerHead,
        norm_placement: NormPlacement::PreAndPost,
        activation: Activation::GeluTanh,
        embedding_scale: EmbeddingScale::SqrtEmbd,
        attention_window: AttentionWindow::Pattern { default_period: 6 },
        attention_scale: AttentionScale::Queries,
        ..LLAMA
    },
];

/// The row named `name`.
pub fn find(name: &str) -> Option<&'static Architecture> {
    ARCHITECTURES.iter().find(|a| a.name == name)
}

/// The supported names, comma-separated, for error messages.
pub fn supported_names() -> String {
    ARCHITECTURES
        .iter()
        .map(|a| a.name)
        .collect::<Vec<_>>()
        .join(", ")
}
