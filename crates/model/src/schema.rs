//! The tensor schema: every tensor an architecture row may need, with its GGUF name, its shape
//! as a function of the configuration, whether a file must hold it, and its kind. The weight
//! loader, `runit synth`, the quantize plan and the tests read this one table; a row selects
//! its entries through its switches ([`Condition`]).

use runit_backend::WeightRole;

use crate::arch::{Architecture, FfnKind, QkNorm};
use Dim::{Embd, Experts, Ff, HalfRope, HeadDim, KvWidth, QWidth, Vocab};

/// Which weight a tensor is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Tensor {
    TokenEmbedding,
    OutputNorm,
    /// The output head (absent when the row ties it to the token embedding).
    Output,
    /// Per-frequency RoPE divisors (Llama 3.1's long-context factors).
    RopeFreqs,
    AttnNorm,
    AttnQ,
    AttnK,
    AttnV,
    AttnQBias,
    AttnKBias,
    AttnVBias,
    AttnQNorm,
    AttnKNorm,
    AttnOutput,
    PostAttnNorm,
    FfnNorm,
    FfnGate,
    FfnUp,
    FfnDown,
    /// The MoE router: expert logits per token.
    FfnRouter,
    FfnGateExperts,
    FfnUpExperts,
    FfnDownExperts,
    PostFfnNorm,
}

impl Tensor {
    /// Whether the tensor is a normalisation weight (its values sit near 1).
    pub fn is_norm(self) -> bool {
        use Tensor::*;
        matches!(
            self,
            OutputNorm | AttnNorm | AttnQNorm | AttnKNorm | PostAttnNorm | FfnNorm | PostFfnNorm
        )
    }
}

/// One extent of a tensor's shape, resolved by [`Dimensions::extent`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dim {
    /// Width of the residual stream.
    Embd,
    Vocab,
    /// All query heads together: `heads * head_dim`.
    QWidth,
    /// All key (or value) heads together: `kv_heads * head_dim`.
    KvWidth,
    HeadDim,
    /// The dense FFN's width, or each expert's.
    Ff,
    Experts,
    /// Half the rotated dimensions of a head: one entry per RoPE frequency.
    HalfRope,
}

/// The numbers a [`Dim`] stands for, from a configuration (or a `runit synth` shape).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dimensions {
    pub embedding: usize,
    pub vocab: usize,
    pub q_width: usize,
    pub kv_width: usize,
    pub head_dim: usize,
    pub feed_forward: usize,
    /// 0 for a dense FFN.
    pub experts: usize,
    /// Dimensions RoPE rotates per head.
    pub rope_dim: usize,
}

impl Dimensions {
    /// The number `dim` stands for.
    pub fn extent(&self, dim: Dim) -> usize {
        match dim {
            Dim::Embd => self.embedding,
            Dim::Vocab => self.vocab,
            Dim::QWidth => self.q_width,
            Dim::KvWidth => self.kv_width,
            Dim::HeadDim => self.head_dim,
            Dim::Ff => self.feed_forward,
            Dim::Experts => self.experts,
            Dim::HalfRope => self.rope_dim / 2,
        }
    }
}

/// Whether a file must hold the tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Presence {
    Required,
    /// Used when present.
    Optional,
    /// Optional in a row with [`Architecture::tied_output`] (the token embedding then stands
    /// in for it), required otherwise.
    TiedToEmbedding,
}

/// The row switch an entry depends on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Condition {
    Always,
    QkvBias,
    QkNorm(QkNorm),
    PreNorms,
    PostNorms,
    Ffn(FfnKind),
}

impl Condition {
    /// Whether `row` has the switch.
    pub fn holds(self, row: &Architecture) -> bool {
        match self {
            Condition::Always => true,
            Condition::QkvBias => row.qkv_bias,
            Condition::QkNorm(kind) => row.qk_norm == kind,
            Condition::PreNorms => row.norm_placement.has_pre_norms(),
            Condition::PostNorms => row.norm_placement.has_post_norms(),
            Condition::Ffn(kind) => row.ffn == kind,
        }
    }
}

/// Whether a tensor exists once per model or once per layer (`blk.N.` names).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    Model,
    Layer,
}

/// One entry of the schema.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TensorSpec {
    pub tensor: Tensor,
    pub scope: Scope,
    /// The GGUF name, without the `blk.N.` prefix of a layer tensor.
    pub name: &'static str,
    /// Extents in ggml order: `shape[0]` is the row length.
    pub shape: &'static [Dim],
    pub role: WeightRole,
    pub presence: Presence,
    pub condition: Condition,
}

impl TensorSpec {
    const fn model(tensor: Tensor, name: &'static str, shape: &'static [Dim]) -> TensorSpec {
        TensorSpec {
            tensor,
            scope: Scope::Model,
            name,
            shape,
            role: role_of(shape),
            presence: Presence::Required,
            condition: Condition::Always,
        }
    }

    const fn layer(tensor: Tensor, name: &'static str, shape: &'static [Dim]) -> TensorSpec {
        TensorSpec {
            scope: Scope::Layer,
            ..TensorSpec::model(tensor, name, shape)
        }
    }

    const fn when(self, condition: Condition) -> TensorSpec {
        TensorSpec { condition, ..self }
    }

    const fn presence(self, presence: Presence) -> TensorSpec {
        TensorSpec { presence, ..self }
    }

    const fn role(self, role: WeightRole) -> TensorSpec {
        TensorSpec { role, ..self }
    }

    /// The tensor's name in a file, in layer `layer` for a layer tensor.
    pub fn name_in(&self, layer: Option<usize>) -> String {
        match (self.scope, layer) {
            (Scope::Layer, Some(layer)) => format!("blk.{layer}.{}", self.name),
            _ => self.name.to_string(),
        }
    }

    /// Whether a file of `row` must hold the tensor.
    pub fn is_required(&self, row: &Architecture) -> bool {
        match self.presence {
            Presence::Required => true,
            Presence::Optional => false,
            Presence::TiedToEmbedding => !row.tied_output,
        }
    }

    /// Whether a file of `row` holds the tensor when written without optional tensors: the
    /// required ones, and the output head unless the model `ties` it to the token embedding
    /// (and the row allows that).
    pub fn is_written(&self, row: &Architecture, ties: bool) -> bool {
        match self.presence {
            Presence::TiedToEmbedding => !(ties && row.tied_output),
            _ => self.is_required(row),
        }
    }

    /// The shape with `dimensions` filled in.
    pub fn resolve(&self, dimensions: &Dimensions) -> Vec<usize> {
        self.shape
            .iter()
            .map(|&dim| dimensions.extent(dim))
            .collect()
    }
}

/// A vector for one extent, a matrix for two, stacked experts for three.
const fn role_of(shape: &[Dim]) -> WeightRole {
    match shape.len() {
        1 => WeightRole::Vector,
        3 => WeightRole::StackedExperts,
        _ => WeightRole::Matrix,
    }
}

/// Every tensor any row may need, model tensors first, then each layer's in computation order.
pub const TENSORS: &[TensorSpec] = &[
    TensorSpec::model(Tensor::TokenEmbedding, "token_embd.weight", &[Embd, Vocab])
        .role(WeightRole::TokenEmbedding),
    TensorSpec::model(Tensor::OutputNorm, "output_norm.weight", &[Embd]),
    TensorSpec::model(Tensor::Output, "output.weight", &[Embd, Vocab])
        .presence(Presence::TiedToEmbedding),
    TensorSpec::model(Tensor::RopeFreqs, "rope_freqs.weight", &[HalfRope])
        .presence(Presence::Optional),
    TensorSpec::layer(Tensor::AttnNorm, "attn_norm.weight", &[Embd]).when(Condition::PreNorms),
    TensorSpec::layer(Tensor::AttnQ, "attn_q.weight", &[Embd, QWidth]),
    TensorSpec::layer(Tensor::AttnK, "attn_k.weight", &[Embd, KvWidth]),
    TensorSpec::layer(Tensor::AttnV, "attn_v.weight", &[Embd, KvWidth]),
    TensorSpec::layer(Tensor::AttnQBias, "attn_q.bias", &[QWidth]).when(Condition::QkvBias),
    TensorSpec::layer(Tensor::AttnKBias, "attn_k.bias", &[KvWidth]).when(Condition::QkvBias),
    TensorSpec::layer(Tensor::AttnVBias, "attn_v.bias", &[KvWidth]).when(Condition::QkvBias),
    TensorSpec::layer(Tensor::AttnQNorm, "attn_q_norm.weight", &[HeadDim])
        .when(Condition::QkNorm(QkNorm::PerHead)),
    TensorSpec::layer(Tensor::AttnKNorm, "attn_k_norm.weight", &[HeadDim])
        .when(Condition::QkNorm(QkNorm::PerHead)),
    TensorSpec::layer(Tensor::AttnQNorm, "attn_q_norm.weight", &[QWidth])
        .when(Condition::QkNorm(QkNorm::FullWidth)),
    TensorSpec::layer(Tensor::AttnKNorm, "attn_k_norm.weight", &[KvWidth])
        .when(Condition::QkNorm(QkNorm::FullWidth)),
    TensorSpec::layer(Tensor::AttnOutput, "attn_output.weight", &[QWidth, Embd]),
    TensorSpec::layer(Tensor::PostAttnNorm, "post_attention_norm.weight", &[Embd])
        .when(Condition::PostNorms),
    TensorSpec::layer(Tensor::FfnNorm, "ffn_norm.weight", &[Embd]).when(Condition::PreNorms),
    TensorSpec::layer(Tensor::FfnGate, "ffn_gate.weight", &[Embd, Ff])
        .when(Condition::Ffn(FfnKind::DenseGated)),
    TensorSpec::layer(Tensor::FfnUp, "ffn_up.weight", &[Embd, Ff])
        .when(Condition::Ffn(FfnKind::DenseGated)),
    TensorSpec::layer(Tensor::FfnDown, "ffn_down.weight", &[Ff, Embd])
        .when(Condition::Ffn(FfnKind::DenseGated)),
    TensorSpec::layer(Tensor::FfnRouter, "ffn_gate_inp.weight", &[Embd, Experts])
        .when(Condition::Ffn(FfnKind::MoeGated)),
    TensorSpec::layer(
        Tensor::FfnGateExperts,
        "ffn_gate_exps.weight",
        &[Embd, Ff, Experts],
    )
    .when(Condition::Ffn(FfnKind::MoeGated)),
    TensorSpec::layer(
        Tensor::FfnUpExperts,
        "ffn_up_exps.weight",
        &[Embd, Ff, Experts],
    )
    .when(Condition::Ffn(FfnKind::MoeGated)),
    TensorSpec::layer(
        Tensor::FfnDownExperts,
        "ffn_down_exps.weight",
        &[Ff, Embd, Experts],
    )
    .when(Condition::Ffn(FfnKind::MoeGated)),
    TensorSpec::layer(Tensor::PostFfnNorm, "post_ffw_norm.weight", &[Embd])
        .when(Condition::PostNorms),
];

/// One tensor of a model: its schema entry, its name in the file and its shape.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelTensor {
    pub spec: &'static TensorSpec,
    /// The layer of a layer tensor.
    pub layer: Option<usize>,
    pub name: String,
    pub shape: Vec<usize>,
}

impl Architecture {
    /// The schema entries of this row, in [`TENSORS`] order.
    pub fn tensor_specs(&self) -> impl Iterator<Item = &'static TensorSpec> + '_ {
        TENSORS.iter().filter(|spec| spec.condition.holds(self))
    }

    /// Every tensor a model of this row with `block_count` layers may hold (optional ones
    /// included): the model tensors, then layer by layer.
    pub fn tensors(&self, dimensions: &Dimensions, block_count: usize) -> Vec<ModelTensor> {
        let entry = |spec: &'static TensorSpec, layer| ModelTensor {
            spec,
            layer,
            name: spec.name_in(layer),
            shape: spec.resolve(dimensions),
        };
        let model = self
            .tensor_specs()
            .filter(|spec| spec.scope == Scope::Model)
            .map(|spec| entry(spec, None));
        let layers = (0..block_count).flat_map(|layer| {
            self.tensor_specs()
                .filter(|spec| spec.scope == Scope::Layer)
                .map(move |spec| entry(spec, Some(layer)))
        });
        model.chain(layers).collect()
    }
}

/// The schema entry a tensor name matches (`blk.N.` stripped from layer tensors), in any row.
pub fn find(name: &str) -> Option<&'static TensorSpec> {
    let (scope, base) = match layer_suffix(name) {
        Some(base) => (Scope::Layer, base),
        None => (Scope::Model, name),
    };
    TENSORS
        .iter()
        .find(|spec| spec.scope == scope && spec.name == base)
}

/// The part after `blk.N.` of a layer tensor's name.
fn layer_suffix(name: &str) -> Option<&str> {
    let rest = name.strip_prefix("blk.")?;
    let (digits, base) = rest.split_once('.')?;
    (!digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit())).then_some(base)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::arch::ARCHITECTURES;

    #[test]
    fn names_are_unique_within_each_row() {
        for row in ARCHITECTURES {
            let mut names: Vec<_> = row.tensor_specs().map(|spec| spec.name).collect();
            let count = names.len();
            names.sort_unstable();
            names.dedup();
            assert_eq!(names.len(), count, "{}", row.name);
        }
    }

    #[test]
    fn kinds_follow_the_shapes() {
        for spec in TENSORS {
            let expected = match (spec.tensor, spec.shape.len()) {
                (Tensor::TokenEmbedding, _) => WeightRole::TokenEmbedding,
                (_, 1) => WeightRole::Vector,
                (_, 2) => WeightRole::Matrix,
                _ => WeightRole::StackedExperts,
            };
            assert_eq!(spec.role, expected, "{}", spec.name);
        }
    }

    #[test]
    fn names_find_their_entries() {
        let q = find("blk.12.attn_q.weight").expect("a layer tensor");
        assert_eq!((q.tensor, q.scope), (Tensor::AttnQ, Scope::Layer));
        let output = find("output.weight").expect("a model tensor");
        assert_eq!(output.tensor, Tensor::Output);
        assert_eq!(
            find("attn_q.weight"),
            None,
            "a layer tensor without its layer"
        );
        assert_eq!(find("blk.x.attn_q.weight"), None);
        assert_eq!(find("blk.0.token_embd.weight"), None);
        assert_eq!(find("blk.0.attn_qkv.weight"), None);
    }
}
