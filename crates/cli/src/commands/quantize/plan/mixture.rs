//! llama.cpp's mixture rules (`llama_tensor_get_type_impl`): the type each tensor role gets
//! in the K-quant and IQ4 presets, before the block-size fallback.

use runit_model::schema::{self, Tensor};
use runit_quant::GgmlType;

use super::{layer_of, ModelFacts, PlanError, Preset, TensorDescription};

/// The role of a tensor for the mixture rules (llama.cpp's `tensor_category`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Role {
    TokenEmbedding,
    Output,
    AttentionValue,
    AttentionKey,
    AttentionOutput,
    FfnDown,
    FfnGate,
    FfnUp,
    Other,
}

impl Role {
    /// The role of the tensor `name`: from the model crate's tensor schema when it lists the
    /// name, else by llama.cpp's name rules (tensors of architectures RunIT does not run).
    pub(super) fn of(name: &str) -> Role {
        match schema::find(name) {
            Some(spec) => Role::of_tensor(spec.tensor),
            None => Role::by_name(name),
        }
    }

    /// The role of a weight the schema knows; the same category llama.cpp's name rules give.
    fn of_tensor(tensor: Tensor) -> Role {
        match tensor {
            Tensor::TokenEmbedding => Role::TokenEmbedding,
            Tensor::Output => Role::Output,
            Tensor::AttnV => Role::AttentionValue,
            Tensor::AttnK => Role::AttentionKey,
            Tensor::AttnOutput => Role::AttentionOutput,
            Tensor::FfnDown | Tensor::FfnDownExperts => Role::FfnDown,
            // llama.cpp's rule matches `ffn_gate` inside the router's `ffn_gate_inp` too.
            Tensor::FfnGate | Tensor::FfnGateExperts | Tensor::FfnRouter => Role::FfnGate,
            Tensor::FfnUp | Tensor::FfnUpExperts => Role::FfnUp,
            Tensor::OutputNorm
            | Tensor::RopeFreqs
            | Tensor::AttnNorm
            | Tensor::AttnQ
            | Tensor::AttnQBias
            | Tensor::AttnKBias
            | Tensor::AttnVBias
            | Tensor::AttnQNorm
            | Tensor::AttnKNorm
            | Tensor::PostAttnNorm
            | Tensor::FfnNorm
            | Tensor::PostFfnNorm => Role::Other,
        }
    }

    /// llama.cpp's `tensor_category`: parts of the name.
    pub(super) fn by_name(name: &str) -> Role {
        if name == "output.weight" {
            Role::Output
        } else if name == "token_embd.weight" || name == "per_layer_token_embd.weight" {
            Role::TokenEmbedding
        } else if ["attn_qkv.weight", "attn_kv_b.weight", "attn_v.weight"]
            .iter()
            .any(|part| name.contains(part))
        {
            // Fused QKV and MLA's kv_b are treated like V: the most quantization-sensitive.
            Role::AttentionValue
        } else if name.contains("attn_k.weight") {
            Role::AttentionKey
        } else if name.contains("attn_output.weight") {
            Role::AttentionOutput
        } else if name.contains("ffn_up") {
            Role::FfnUp
        } else if name.contains("ffn_gate") {
            Role::FfnGate
        } else if name.contains("ffn_down") {
            Role::FfnDown
        } else {
            Role::Other
        }
    }
}

/// llama.cpp's layer-selection heuristic: the first and last eighth of the layers, and every
/// third layer in between, get more bits.
fn use_more_bits(layer: i64, num_layers: i64) -> bool {
    layer < num_layers / 8 || layer >= 7 * num_layers / 8 || (layer - num_layers / 8) % 3 == 2
}

/// Counters the mixture rules carry from tensor to tensor (`quantize_state_impl`).
pub(super) struct MixtureState<'f> {
    facts: &'f ModelFacts,
    tied_embeddings: bool,
    num_attention_values: i64,
    attention_values_seen: i64,
    ffn_down_seen: i64,
}

impl<'f> MixtureState<'f> {
    pub(super) fn new(
        tensors: &[TensorDescription<'_>],
        facts: &'f ModelFacts,
    ) -> MixtureState<'f> {
        let roles = || tensors.iter().map(|tensor| Role::of(tensor.name));
        MixtureState {
            facts,
            tied_embeddings: !roles().any(|role| role == Role::Output),
            num_attention_values: roles().filter(|&r| r == Role::AttentionValue).count() as i64,
            attention_values_seen: 0,
            ffn_down_seen: 0,
        }
    }

    /// The layer an FFN tensor belongs to: its position among its kind for dense models, its
    /// `blk.N.` number for MoE models (whose expert tensors need not be consecutive).
    fn ffn_layer(&self, tensor: &TensorDescription<'_>, seen: i64) -> Result<i64, PlanError> {
        if self.facts.num_experts <= 1 {
            return Ok(seen);
        }
        match layer_of(tensor.name) {
            Some(layer) if layer < self.facts.num_layers => Ok(i64::from(layer)),
            _ => Err(PlanError::BadLayer {
                tensor: tensor.name.to_string(),
                num_layers: self.facts.num_layers,
            }),
        }
    }

    /// `llama_tensor_get_type_impl` for the presets RunIT offers (before the fallback).
    pub(super) fn mixture_type(
        &mut self,
        tensor: &TensorDescription<'_>,
        preset: Preset,
    ) -> Result<GgmlType, PlanError> {
        use GgmlType as T;
        use Preset as P;
        let facts = self.facts;
        let default_type = preset.default_type();
        let num_layers = i64::from(facts.num_layers);
        let eight_experts = facts.num_experts == 8;
        let role = Role::of(tensor.name);
        let ty = match role {
            Role::Output | Role::TokenEmbedding if role == Role::Output || self.tied_embeddings => {
                // The output head (or the embedding that doubles as it) keeps the most bits.
                let row_length = tensor.shape.first().copied().unwrap_or(1);
                if facts.is_falcon() || !row_length.is_multiple_of(default_type.block_size() as u64)
                {
                    T::Q8_0
                } else if default_type != T::Q8_0 {
                    T::Q6_K
                } else {
                    default_type
                }
            }
            Role::AttentionValue => {
                let index = self.attention_values_seen;
                self.attention_values_seen += 1;
                let gqa = facts.gqa_factor();
                let mut ty = match preset {
                    P::Q2_K if gqa >= 4 => T::Q4_K,
                    P::Q2_K => T::Q3_K,
                    P::Q3_K_M if index < 2 => T::Q5_K,
                    P::Q3_K_M => T::Q4_K,
                    P::Q3_K_L => T::Q5_K,
                    P::IQ4_NL | P::IQ4_XS if gqa >= 4 => T::Q5_K,
                    P::Q4_K_M | P::Q5_K_M if use_more_bits(index, self.num_attention_values) => {
                        T::Q6_K
                    }
                    P::Q4_K_S if index < 4 => T::Q5_K,
                    _ => default_type,
                };
                if facts.is_llama_70b() && matches!(ty, T::Q3_K | T::Q4_K) {
                    // 8 query heads share each V head there, so V is small: give it more bits.
                    ty = T::Q5_K;
                }
                if eight_experts {
                    ty = T::Q8_0;
                }
                ty
            }
            Role::AttentionKey if eight_experts => T::Q8_0,
            Role::FfnDown => {
                let layer = self.ffn_layer(tensor, self.ffn_down_seen)?;
                self.ffn_down_seen += 1;
                let more_bits = use_more_bits(layer, num_layers);
                let falcon = facts.is_falcon();
                match preset {
                    P::Q2_K => T::Q3_K,
                    P::Q3_K_M if layer < num_layers / 16 => T::Q5_K,
                    P::Q3_K_M if !falcon || more_bits => T::Q4_K,
                    P::Q3_K_M => T::Q3_K,
                    P::Q3_K_L if falcon => T::Q4_K,
                    P::Q3_K_L => T::Q5_K,
                    P::Q4_K_M if falcon && layer < num_layers / 16 => T::Q6_K,
                    P::Q4_K_M if falcon && more_bits => T::Q5_K,
                    P::Q4_K_M if falcon => T::Q4_K,
                    P::Q4_K_M if more_bits => T::Q6_K,
                    P::Q4_K_M => default_type,
                    P::IQ4_NL | P::IQ4_XS if layer < num_layers / 8 => T::Q5_K,
                    P::Q5_K_M if more_bits => T::Q6_K,
                    P::Q4_K_S if !falcon && layer < num_layers / 8 => T::Q5_K,
                    _ => default_type,
                }
            }
            Role::AttentionOutput => match preset {
                P::Q3_K_L if facts.is_falcon() => T::Q4_K,
                _ if facts.is_falcon() => default_type,
                P::Q2_K | P::Q3_K_S | P::Q3_K_M | P::IQ4_NL | P::Q4_K_S | P::Q4_K_M | P::IQ4_XS
                    if eight_experts =>
                {
                    T::Q5_K
                }
                _ if eight_experts => default_type,
                P::Q2_K => T::Q3_K,
                P::Q3_K_M => T::Q4_K,
                P::Q3_K_L => T::Q5_K,
                _ => default_type,
            },
            Role::FfnGate | Role::FfnUp => {
                // Only the IQ3_XS preset (not offered) changes these; llama.cpp's per-role
                // counters advance but nothing reads them for our presets.
                default_type
            }
            _ => default_type,
        };
        Ok(ty)
    }
}
