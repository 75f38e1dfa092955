//! `runit synth --shape NAME --type TYPE OUT`: writes a GGUF model with random weights and the
//! exact tensor shapes, tensor types and metadata of a public model, so speed can be measured
//! where the real multi-gigabyte file cannot be carried.
//!
//! Each tensor's type is what `runit quantize` (and so `llama-quantize`) would choose for a
//! real file of that shape ([`plan_types`] in loader order); norms, biases and MoE routers stay
//! F32. The file carries a loadable byte-level BPE tokenizer of the model's vocabulary size.
//! Weight matrices (and the stacked expert matrices of MoE models) are filled from small pools
//! of pre-quantized random rows ([`fill`]) and streamed to the file one tensor at a time.

mod fill;
mod shapes;
mod vocab;

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use runit_gguf::{GgufError, GgufWriter, Value};
use runit_quant::GgmlType;

use super::quantize::plan::{loader_order, plan_types, ModelFacts, TensorDescription};
use super::quantize::preset::{Preset, ALL_PRESETS};
use shapes::{Shape, TensorSpec, SHAPES};

/// `general.quantization_version` of ggml's current block formats.
const QUANTIZATION_VERSION: u32 = 2;

/// Bare ggml type names that are not preset names: they mean that one type everywhere.
const SINGLE_TYPES: [GgmlType; 3] = [GgmlType::Q3_K, GgmlType::Q4_K, GgmlType::Q5_K];

/// Arguments of `runit synth`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// The model to imitate: qwen2.5-0.5b, qwen2.5-7b, qwen3-0.6b, llama3-8b, smollm2-135m,
    /// olmoe-1b-7b or gemma3-1b (`--list-shapes` prints their hyperparameters).
    #[arg(long, required_unless_present = "list_shapes")]
    pub shape: Option<String>,
    /// Weight type: a llama-quantize preset (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K_S,
    /// Q3_K_M, Q3_K_L, Q4_K_S, Q4_K_M, Q5_K_S, Q5_K_M, Q6_K, IQ4_NL, IQ4_XS, F16, BF16, F32),
    /// whose per-tensor mixture is exactly `runit quantize`'s, or a bare Q3_K, Q4_K or Q5_K
    /// for that one type in every weight matrix.
    #[arg(
        long = "type",
        value_name = "TYPE",
        required_unless_present = "list_shapes"
    )]
    pub target: Option<String>,
    /// The file to write.
    #[arg(value_name = "OUT", required_unless_present = "list_shapes")]
    pub output: Option<PathBuf>,
    /// Seed of the random weights (the same seed writes the same file).
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Write this many layers instead of the model's own count (for quick tests).
    #[arg(long, value_name = "N")]
    pub layers: Option<u32>,
    /// Give every weight matrix the preset's main type, without the mixture rules.
    #[arg(long)]
    pub pure: bool,
    /// Print the known shapes and exit.
    #[arg(long)]
    pub list_shapes: bool,
}

/// Runs `runit synth`.
pub fn run(args: Args) -> Result<()> {
    if args.list_shapes {
        return print_shapes();
    }
    let (Some(shape_name), Some(type_name), Some(output)) =
        (&args.shape, &args.target, &args.output)
    else {
        bail!("--shape, --type and OUT are required (or --list-shapes)");
    };
    let started = Instant::now();
    let shape = shapes::find(shape_name)?;
    let (preset, pure) = parse_type(type_name, args.pure)?;
    let num_layers = args.layers.unwrap_or(shape.num_layers);
    if num_layers == 0 {
        bail!("--layers must be at least 1");
    }

    let mut tensors = shape.tensors(num_layers)?;
    tensors.sort_by(|a, b| loader_order(&a.name, &b.name));
    let types = tensor_types(shape, num_layers, &tensors, preset, pure)?;
    let plan: Vec<(&TensorSpec, GgmlType)> = tensors.iter().zip(types).collect();
    let pools = fill::build_pools(&plan, args.seed)?;
    let writer = layout(shape, num_layers, preset, &plan)?;
    let total_bytes: u64 = writer.tensor_infos()?.iter().map(|info| info.n_bytes).sum();

    let progress = progress_bar(total_bytes);
    let written = writer.write_to_path(output, |index, info| {
        let (tensor, ty) = plan[index];
        let salt = fill::Random::new(args.seed, index as u64).next_u64();
        let bytes = if tensor.shape.len() == 1 && ty == GgmlType::F32 {
            fill::vector(tensor, args.seed, salt)
        } else {
            pools
                .get(&(tensor.row_length(), ty))
                .context("a pool was built for every matrix")
                .and_then(|pool| pool.matrix(tensor.num_rows(), salt))
        };
        progress.inc(info.n_bytes);
        bytes.map(Cow::Owned).map_err(|error| GgufError::Io {
            source: std::io::Error::other(format!("tensor `{}`: {error:#}", info.name)),
        })
    });
    progress.finish_and_clear();
    written.with_context(|| format!("cannot write {}", output.display()))?;

    let file_bytes = std::fs::metadata(output)?.len();
    eprintln!(
        "{}: synthetic {} ({} layers, {preset}{}), {} tensors [{}], {:.2} MiB of tensor data, \
         {:.2} MiB file, {:.1} s",
        output.display(),
        shape.name,
        num_layers,
        if pure { ", pure" } else { "" },
        plan.len(),
        type_counts(&plan),
        total_bytes as f64 / (1 << 20) as f64,
        file_bytes as f64 / (1 << 20) as f64,
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// The preset and whether it is applied pure: a preset name (or `llama_ftype` number) as
/// `runit quantize` reads it, or a bare type from [`SINGLE_TYPES`], which is always pure.
fn parse_type(text: &str, pure: bool) -> Result<(Preset, bool)> {
    if let Some(ty) = SINGLE_TYPES
        .into_iter()
        .find(|ty| ty.name().eq_ignore_ascii_case(text))
    {
        let preset = ALL_PRESETS
            .into_iter()
            .filter(|preset| preset.default_type() == ty)
            .find(|preset| preset.name().ends_with("_M"))
            .expect("each K-quant family has an _M preset");
        return Ok((preset, true));
    }
    match text.parse::<Preset>() {
        Ok(preset) => Ok((preset, pure)),
        Err(_) => bail!(
            "unknown weight type `{text}`; valid types: {} (presets), {} (one type everywhere)",
            ALL_PRESETS.map(Preset::name).join(", "),
            SINGLE_TYPES.map(GgmlType::name).join(", ")
        ),
    }
}

/// Each tensor's type: the quantize plan applied to an F32 source of this shape.
fn tensor_types(
    shape: &Shape,
    num_layers: u32,
    tensors: &[TensorSpec],
    preset: Preset,
    pure: bool,
) -> Result<Vec<GgmlType>> {
    let descriptions: Vec<TensorDescription<'_>> = tensors
        .iter()
        .map(|tensor| TensorDescription {
            name: &tensor.name,
            shape: &tensor.shape,
            ty: GgmlType::F32,
        })
        .collect();
    let count = |value: u64| u32::try_from(value).context("head or expert count above u32");
    let facts = ModelFacts {
        architecture: shape.architecture.to_string(),
        num_layers,
        num_experts: count(shape.experts.map_or(0, |experts| experts.count))?,
        num_heads: count(shape.num_heads)?,
        num_kv_heads: count(shape.num_kv_heads)?,
    };
    let types = plan_types(&descriptions, &facts, preset, pure)?;
    for (tensor, &ty) in tensors.iter().zip(&types) {
        if !runit_quant::can_quantize(ty) {
            bail!("tensor `{}`: {ty} cannot be written", tensor.name);
        }
    }
    Ok(types)
}

/// Metadata (general keys, hyperparameters, file type, tokenizer) and the tensor table.
fn layout(
    shape: &Shape,
    num_layers: u32,
    preset: Preset,
    plan: &[(&TensorSpec, GgmlType)],
) -> Result<GgufWriter> {
    let mut writer = GgufWriter::new();
    let text = |value: &str| Value::String(value.to_string());
    writer.add_metadata("general.architecture", text(shape.architecture))?;
    writer.add_metadata("general.type", text("model"))?;
    writer.add_metadata("general.name", text(&format!("synthetic {}", shape.name)))?;
    for (key, value) in shape.hyperparameters(num_layers) {
        writer.add_metadata(key, value)?;
    }
    writer.add_metadata("general.file_type", Value::U32(preset.file_type()))?;
    writer.add_metadata(
        "general.quantization_version",
        Value::U32(QUANTIZATION_VERSION),
    )?;
    for (key, value) in vocab::tokenizer_metadata(shape.tokenizer, shape.vocab_size)? {
        writer.add_metadata(key, value)?;
    }
    for (tensor, ty) in plan {
        writer.add_tensor(tensor.name.clone(), *ty, tensor.shape.clone())?;
    }
    Ok(writer)
}

/// `Q4_K x 98, Q6_K x 15, F32 x 57`: how many tensors of each type, most common first.
fn type_counts(plan: &[(&TensorSpec, GgmlType)]) -> String {
    let mut counts: BTreeMap<GgmlType, usize> = BTreeMap::new();
    for (_, ty) in plan {
        *counts.entry(*ty).or_default() += 1;
    }
    let mut counts: Vec<(GgmlType, usize)> = counts.into_iter().collect();
    counts.sort_by_key(|&(_, count)| std::cmp::Reverse(count));
    counts
        .iter()
        .map(|(ty, count)| format!("{ty} x {count}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The `--list-shapes` table.
fn print_shapes() -> Result<()> {
    println!(
        "{:<14} {:<6} {:>6} {:>6} {:>6} {:>7} {:>8} {:>8} {:>7} {:>5} {:>8}  source",
        "shape",
        "arch",
        "layers",
        "embd",
        "ff",
        "experts",
        "heads/kv",
        "head_dim",
        "vocab",
        "tied",
        "params"
    );
    for shape in &SHAPES {
        let experts = match shape.experts {
            Some(experts) => format!("{}/{}", experts.used_per_token, experts.count),
            None => "-".to_string(),
        };
        println!(
            "{:<14} {:<6} {:>6} {:>6} {:>6} {:>7} {:>8} {:>8} {:>7} {:>5} {:>7.3}B  {}",
            shape.name,
            shape.architecture,
            shape.num_layers,
            shape.embedding_length,
            shape.feed_forward_length,
            experts,
            format!("{}/{}", shape.num_heads, shape.num_kv_heads),
            shape.head_dim(),
            shape.vocab_size,
            if shape.tied_embeddings { "yes" } else { "no" },
            shape.num_parameters()? as f64 / 1e9,
            shape.source
        );
    }
    Ok(())
}

/// A bar of tensor bytes written, on stderr (drawn only when stderr is a terminal).
fn progress_bar(total_bytes: u64) -> ProgressBar {
    let progress = ProgressBar::new(total_bytes);
    if let Ok(style) = ProgressStyle::with_template(
        "{elapsed_precise} [{bar:40}] {binary_bytes}/{binary_total_bytes} ({eta} left)",
    ) {
        progress.set_style(style.progress_chars("=> "));
    }
    progress
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{CommandFactory, Parser};

    #[derive(Parser)]
    struct Command {
        #[command(flatten)]
        args: Args,
    }

    #[test]
    fn help_names_every_shape() {
        let help = Command::command().render_long_help().to_string();
        for shape in SHAPES {
            assert!(
                help.contains(shape.name),
                "{} missing from\n{help}",
                shape.name
            );
        }
    }

    /// llama-quantize's Q4_K_M for the full OLMoE-1B-7B (64 experts, so none of the 8-expert
    /// rules): V and the experts' down projections get Q6_K in the first and last eighth of
    /// the 16 layers and every third layer between, the output head Q6_K, the router F32.
    #[test]
    fn olmoe_q4_k_m_follows_llama_quantize() {
        let shape = shapes::find("olmoe-1b-7b").expect("shape in the table");
        let mut tensors = shape.tensors(shape.num_layers).expect("tensors");
        tensors.sort_by(|a, b| loader_order(&a.name, &b.name));
        let types = tensor_types(shape, shape.num_layers, &tensors, Preset::Q4_K_M, false)
            .expect("a type for every tensor");
        let more_bits_layers = ["0", "1", "4", "7", "10", "13", "14", "15"];
        let mut counts = BTreeMap::new();
        for (tensor, ty) in tensors.iter().zip(types) {
            let name = tensor.name.as_str();
            let layer = name
                .strip_prefix("blk.")
                .and_then(|rest| rest.split('.').next());
            let sensitive = ["attn_v.weight", "ffn_down_exps.weight"]
                .iter()
                .any(|suffix| name.ends_with(suffix));
            let expected = if tensor.shape.len() == 1 || name.ends_with("ffn_gate_inp.weight") {
                GgmlType::F32
            } else if name == "output.weight"
                || (sensitive && layer.is_some_and(|layer| more_bits_layers.contains(&layer)))
            {
                GgmlType::Q6_K
            } else {
                GgmlType::Q4_K
            };
            assert_eq!(ty, expected, "{name}");
            *counts.entry(ty).or_insert(0) += 1;
        }
        // Per layer 4 norms and a router stay F32 and 7 matrices are quantized, 2 of them
        // sensitive in 8 of the 16 layers; plus the final norm, embedding and output head.
        let expected_counts = [
            (GgmlType::F32, 16 * 5 + 1),
            (GgmlType::Q4_K, 16 * 7 - 2 * 8 + 1),
            (GgmlType::Q6_K, 2 * 8 + 1),
        ];
        assert_eq!(counts, BTreeMap::from(expected_counts));
    }

    #[test]
    fn types_parse_as_presets_or_single_types() {
        assert_eq!(
            parse_type("Q4_K_M", false).expect("preset"),
            (Preset::Q4_K_M, false)
        );
        assert_eq!(
            parse_type("q8_0", true).expect("preset"),
            (Preset::Q8_0, true)
        );
        assert_eq!(
            parse_type("Q4_K", false).expect("type"),
            (Preset::Q4_K_M, true)
        );
        assert_eq!(
            parse_type("q3_k", false).expect("type"),
            (Preset::Q3_K_M, true)
        );
        let message = parse_type("Q7_K", false)
            .expect_err("not a type")
            .to_string();
        assert!(message.contains("Q7_K") && message.contains("IQ4_XS") && message.contains("Q5_K"));
    }
}
