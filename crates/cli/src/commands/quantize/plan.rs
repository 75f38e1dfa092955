//! The per-tensor type choice of `runit quantize`: which tensors are quantized at all, and to
//! which type, following llama.cpp's `llama_tensor_get_type` (src/llama-quant.cpp) for the
//! presets in [`Preset`].
//!
//! The rules, in the order llama.cpp applies them:
//! 1. Only weight matrices are quantized: tensors of two or more dimensions whose name ends in
//!    `weight`, except norms, MoE routers (`ffn_gate_inp`) and a few small special tensors.
//!    Everything else keeps its type.
//! 2. For F32/F16/BF16 presets every quantizable tensor gets that type, nothing more.
//! 3. For quantized presets, unless `--pure`, the mixture rules pick a type per tensor role
//!    (output head, attention V, FFN down, ...) and layer.
//! 4. A type whose block does not divide the row length falls back to a 32-block type.
//!
//! Tensors are visited in llama.cpp's loader order (see [`loader_order`]), which matters because
//! some rules count the tensors of a role seen so far.

use std::cmp::Ordering;
use std::fmt;

use runit_gguf::{Array, GgufError, GgufFile, Value};
use runit_quant::GgmlType;

use super::preset::Preset;

mod mixture;

use mixture::MixtureState;

/// What the plan needs to know about one input tensor.
#[derive(Debug, Clone, Copy)]
pub struct TensorDescription<'a> {
    /// The tensor's name (`blk.0.attn_v.weight`).
    pub name: &'a str,
    /// Shape in ggml order: `shape[0]` is the row length.
    pub shape: &'a [u64],
    /// The tensor's type in the input file.
    pub ty: GgmlType,
}

/// The model hyperparameters the mixture rules look at, read from the input's metadata.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelFacts {
    /// `general.architecture` (`llama`, `qwen2`, `falcon`, ...).
    pub architecture: String,
    /// `<arch>.block_count`.
    pub num_layers: u32,
    /// `<arch>.expert_count`, 0 for a dense model.
    pub num_experts: u32,
    /// `<arch>.attention.head_count`.
    pub num_heads: u32,
    /// `<arch>.attention.head_count_kv`.
    pub num_kv_heads: u32,
}

impl ModelFacts {
    /// Reads the facts from a GGUF file's metadata. `general.architecture` and
    /// `<arch>.block_count` are required; expert and head counts default to 0 when absent.
    pub fn from_gguf(file: &GgufFile) -> Result<ModelFacts, GgufError> {
        let architecture = file.get_str("general.architecture")?.to_string();
        let num_layers = file.get_u32(&format!("{architecture}.block_count"))?;
        let num_experts = file
            .get_u32_opt(&format!("{architecture}.expert_count"))?
            .unwrap_or(0);
        let num_heads = first_u32(file, &format!("{architecture}.attention.head_count"))?;
        let num_kv_heads =
            match first_u32(file, &format!("{architecture}.attention.head_count_kv"))? {
                0 => num_heads,
                count => count,
            };
        Ok(ModelFacts {
            architecture,
            num_layers,
            num_experts,
            num_heads,
            num_kv_heads,
        })
    }

    /// Query heads per key/value head (llama.cpp's `n_gqa`), 0 when unknown.
    fn gqa_factor(&self) -> u32 {
        self.num_heads.checked_div(self.num_kv_heads).unwrap_or(0)
    }

    fn is_falcon(&self) -> bool {
        self.architecture == "falcon"
    }

    /// llama.cpp's `LLM_TYPE_70B`: an 80-layer LLaMA with grouped-query attention.
    fn is_llama_70b(&self) -> bool {
        self.architecture == "llama" && self.num_layers == 80 && self.num_heads != self.num_kv_heads
    }
}

/// A head count: a number, or a per-layer array whose first entry llama.cpp's `n_gqa` uses;
/// 0 when absent.
fn first_u32(file: &GgufFile, key: &str) -> Result<u32, GgufError> {
    let Some(value) = file.get(key) else {
        return Ok(0);
    };
    let first = match value {
        Value::Array(Array::U32(values)) => values.first().map(|&v| u64::from(v)),
        Value::Array(Array::I32(values)) => values.first().and_then(|&v| u64::try_from(v).ok()),
        Value::Array(_) => None,
        scalar => scalar.as_u64(),
    };
    first
        .and_then(|count| u32::try_from(count).ok())
        .ok_or_else(|| GgufError::WrongType {
            key: key.to_string(),
            expected: "u32 or array of u32",
            found: value.type_description(),
        })
}

/// Why no type could be chosen for a tensor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PlanError {
    /// The row length is not a multiple of the type's block and no fallback type exists.
    NoFallback {
        /// The tensor's name.
        tensor: String,
        /// Its row length.
        row_length: u64,
        /// The type that does not fit.
        ty: GgmlType,
    },
    /// An MoE tensor whose name has no usable `blk.N.` layer number.
    BadLayer {
        /// The tensor's name.
        tensor: String,
        /// The model's layer count.
        num_layers: u32,
    },
}

impl fmt::Display for PlanError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PlanError::NoFallback {
                tensor,
                row_length,
                ty,
            } => write!(
                f,
                "tensor `{tensor}`: row length {row_length} is not a multiple of {ty}'s block \
                 size {} and {ty} has no fallback type",
                ty.block_size()
            ),
            PlanError::BadLayer { tensor, num_layers } => write!(
                f,
                "tensor `{tensor}`: expected a name `blk.N.` with N below the layer count \
                 {num_layers}"
            ),
        }
    }
}

impl std::error::Error for PlanError {}

/// The output type of every tensor, given in loader order.
///
/// `tensors` must already be in [`loader_order`]; the result is parallel to it.
pub fn plan_types(
    tensors: &[TensorDescription<'_>],
    facts: &ModelFacts,
    preset: Preset,
    pure: bool,
) -> Result<Vec<GgmlType>, PlanError> {
    let mut state = MixtureState::new(tensors, facts);
    let default_type = preset.default_type();
    tensors
        .iter()
        .map(|tensor| {
            if !allows_quantization(tensor) {
                return Ok(tensor.ty);
            }
            if !default_type.is_quantized() {
                return Ok(default_type);
            }
            let chosen = if pure {
                default_type
            } else {
                state.mixture_type(tensor, preset)?
            };
            fallback_type(tensor, chosen)
        })
        .collect()
}

/// llama.cpp's loader order: tensors outside `blk.N.` first, then by layer number, then by
/// name (byte-wise).
pub fn loader_order(left: &str, right: &str) -> Ordering {
    let key = |name: &str| layer_of(name).map_or(-1, i64::from);
    key(left)
        .cmp(&key(right))
        .then_with(|| left.as_bytes().cmp(right.as_bytes()))
}

/// The `N` of a name starting `blk.N.`.
fn layer_of(name: &str) -> Option<u32> {
    let rest = name.strip_prefix("blk.")?;
    let digits = rest.split('.').next()?;
    if digits.is_empty() || !rest[digits.len()..].starts_with('.') {
        return None;
    }
    digits.parse().ok()
}

/// Whether llama.cpp quantizes this tensor at all (`tensor_allows_quantization`).
fn allows_quantization(tensor: &TensorDescription<'_>) -> bool {
    /// Name parts of tensors kept as they are: norms, MoE routers, small or special matrices
    /// (Gemma 3n, Mamba, MiniMax, RWKV, T5, multimodal towers).
    const KEPT_PARTS: [&str; 35] = [
        "_norm.weight",
        "ffn_gate_inp.weight",
        "ffn_gate_tid2eid.weight",
        "altup",
        "laurel",
        "per_layer_model_proj",
        "ssm_conv1d",
        "shortconv.conv.weight",
        "indexer.k_proj.weight",
        "indexer.q_proj.weight",
        "time_mix_first.weight",
        "time_mix_w0.weight",
        "time_mix_w1.weight",
        "time_mix_w2.weight",
        "time_mix_v0.weight",
        "time_mix_v1.weight",
        "time_mix_v2.weight",
        "time_mix_a0.weight",
        "time_mix_a1.weight",
        "time_mix_a2.weight",
        "time_mix_g1.weight",
        "time_mix_g2.weight",
        "time_mix_decay_w1.weight",
        "time_mix_decay_w2.weight",
        "time_mix_lerp_fused.weight",
        "attn_rel_b.weight",
        ".position_embd",
        "sam.pos_embd",
        "sam.neck.",
        "sam.net_",
        ".rel_pos",
        ".patch_embd",
        ".patch_merger",
        "a.rvq.codebook",
        "mm.a.code_embd",
    ];
    /// Whole names kept as they are: learned position embeddings and BERT token types.
    const KEPT_NAMES: [&str; 2] = ["position_embd.weight", "token_types.weight"];
    let name = tensor.name;
    // ggml_n_dims: trailing extents of 1 do not count as dimensions.
    let num_dims = (1..tensor.shape.len())
        .rev()
        .find(|&axis| tensor.shape[axis] > 1)
        .map_or(1, |axis| axis + 1);
    num_dims >= 2
        && name.ends_with("weight")
        && !KEPT_PARTS.iter().any(|part| name.contains(part))
        && !KEPT_NAMES.contains(&name)
}

/// The type used when `ty`'s block does not divide the row length (`tensor_type_fallback`).
fn fallback_type(tensor: &TensorDescription<'_>, ty: GgmlType) -> Result<GgmlType, PlanError> {
    let row_length = tensor.shape.first().copied().unwrap_or(1);
    if row_length.is_multiple_of(ty.block_size() as u64) {
        return Ok(ty);
    }
    let fallback = match ty {
        GgmlType::IQ1_S
        | GgmlType::IQ1_M
        | GgmlType::IQ2_XXS
        | GgmlType::IQ2_XS
        | GgmlType::IQ2_S
        | GgmlType::IQ3_XXS
        | GgmlType::IQ3_S
        | GgmlType::IQ4_XS => GgmlType::IQ4_NL,
        GgmlType::Q2_K | GgmlType::Q3_K | GgmlType::TQ1_0 | GgmlType::TQ2_0 => GgmlType::Q4_0,
        GgmlType::Q4_K => GgmlType::Q5_0,
        GgmlType::Q5_K => GgmlType::Q5_1,
        GgmlType::Q6_K => GgmlType::Q8_0,
        _ => {
            return Err(PlanError::NoFallback {
                tensor: tensor.name.to_string(),
                row_length,
                ty,
            })
        }
    };
    if row_length.is_multiple_of(fallback.block_size() as u64) {
        Ok(fallback)
    } else {
        Ok(GgmlType::F16)
    }
}

#[cfg(test)]
mod tests;
