//! The architecture table: every supported architecture is a row of switches read by the one
//! generic decoder, never a copied model file.

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

/// The feed-forward block of each layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FfnKind {
    /// `down(silu(gate(x)) * up(x))`.
    DenseSwiGlu,
    /// Router softmax, top-k experts of SwiGLU, weighted sum.
    MoeSwiGlu,
}

/// One row of the table.
#[derive(Debug, Clone, PartialEq)]
pub struct Architecture {
    /// `general.architecture` in the GGUF file.
    pub name: &'static str,
    /// Families this row covers, for messages.
    pub covers: &'static str,
    pub rope_style: RopeStyle,
    /// Q, K and V projections carry biases.
    pub qkv_bias: bool,
    pub qk_norm: QkNorm,
    pub ffn: FfnKind,
}

/// Every supported architecture.
pub const ARCHITECTURES: &[Architecture] = &[
    Architecture {
        name: "llama",
        covers: "LLaMA, Mistral, SmolLM",
        rope_style: RopeStyle::Normal,
        qkv_bias: false,
        qk_norm: QkNorm::None,
        ffn: FfnKind::DenseSwiGlu,
    },
    Architecture {
        name: "qwen2",
        covers: "Qwen2, Qwen2.5",
        rope_style: RopeStyle::Neox,
        qkv_bias: true,
        qk_norm: QkNorm::None,
        ffn: FfnKind::DenseSwiGlu,
    },
    Architecture {
        name: "qwen3",
        covers: "Qwen3",
        rope_style: RopeStyle::Neox,
        qkv_bias: false,
        qk_norm: QkNorm::PerHead,
        ffn: FfnKind::DenseSwiGlu,
    },
    Architecture {
        name: "olmoe",
        covers: "OLMoE",
        rope_style: RopeStyle::Neox,
        qkv_bias: false,
        qk_norm: QkNorm::FullWidth,
        ffn: FfnKind::MoeSwiGlu,
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
