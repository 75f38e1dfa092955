//! `runit quantize IN OUT TYPE [--pure]`: writes a copy of a GGUF model with its weights in
//! another type, choosing each tensor's type as llama.cpp's `llama-quantize` does.
//!
//! The output matches `llama-quantize --allow-requantize IN OUT TYPE` in layout: metadata copied
//! in order with `general.quantization_version` and `general.file_type` moved to the end,
//! tensors in llama.cpp's loader order (global tensors, then by layer, then by name). A tensor
//! already in its planned type is copied byte for byte; any other is dequantized to f32 and
//! quantized again. Tensors stream to the output one at a time.

mod convert;
pub(crate) mod plan;
pub(crate) mod preset;

use std::borrow::Cow;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use runit_gguf::{GgufError, GgufFile, GgufWriter, TensorInfo, Value};
use runit_quant::GgmlType;

use plan::{loader_order, plan_types, ModelFacts, TensorDescription};
use preset::Preset;

/// `general.quantization_version` of ggml's current block formats.
const QUANTIZATION_VERSION: u32 = 2;

/// Metadata keys the output does not copy: the two set anew, and the split-file keys
/// (the output is always a single file).
const KEYS_NOT_COPIED: [&str; 5] = [
    "general.quantization_version",
    "general.file_type",
    "split.no",
    "split.count",
    "split.tensors.count",
];

/// Arguments of `runit quantize`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// The model to read (F32, F16, BF16 or quantized GGUF).
    pub input: PathBuf,
    /// The file to write.
    pub output: PathBuf,
    /// Target type: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K_S, Q3_K_M, Q3_K_L, Q4_K_S,
    /// Q4_K_M, Q5_K_S, Q5_K_M, Q6_K, IQ4_NL, IQ4_XS, F16, BF16 or F32.
    #[arg(value_name = "TYPE")]
    pub target: String,
    /// Give every weight matrix TYPE, without llama.cpp's per-tensor mixture rules (norms,
    /// biases and MoE routers still stay as they are).
    #[arg(long)]
    pub pure: bool,
    /// Accept an input whose weights are already quantized: they are dequantized and quantized
    /// again, which loses more than quantizing the F32/F16/BF16 original would.
    #[arg(long)]
    pub allow_requantize: bool,
    /// Replace OUTPUT when it exists.
    #[arg(long)]
    pub force: bool,
}

/// Runs `runit quantize`.
pub fn run(args: Args) -> Result<()> {
    let started = Instant::now();
    let preset: Preset = args.target.parse()?;
    let source = GgufFile::open(&args.input).context("cannot read the input model")?;
    refuse_same_file(&args)?;
    if args.output.exists() && !args.force {
        bail!(
            "{} exists; pass --force to replace it",
            args.output.display()
        );
    }
    if let Some(count) = source
        .get_u32_opt("split.count")?
        .filter(|&count| count > 1)
    {
        bail!(
            "{} is one of {count} split files; merge them first (llama-gguf-split --merge)",
            args.input.display()
        );
    }

    let mut infos: Vec<&TensorInfo> = source.tensors().iter().collect();
    infos.sort_by(|a, b| loader_order(&a.name, &b.name));
    let descriptions: Vec<TensorDescription<'_>> = infos
        .iter()
        .map(|info| TensorDescription {
            name: &info.name,
            shape: &info.shape,
            ty: info.ty,
        })
        .collect();
    let facts = ModelFacts::from_gguf(&source)
        .with_context(|| format!("{}: model metadata", args.input.display()))?;
    let types = plan_types(&descriptions, &facts, preset, args.pure)?;
    if !args.allow_requantize {
        refuse_requantize(&infos, &types)?;
    }
    for (info, &ty) in infos.iter().zip(&types) {
        if !convert::can_convert(info.ty, ty) {
            bail!(
                "tensor `{}`: converting {} to {ty} is not supported",
                info.name,
                info.ty
            );
        }
    }

    let writer = output_layout(&source, &infos, &types, preset)?;
    let progress = progress_bar(infos.len());
    let mut failure: Option<anyhow::Error> = None;
    let written = writer.write_to_path(&args.output, |index, _| {
        let (info, target) = (infos[index], types[index]);
        let data = source.tensor_data(info);
        let converted = if info.ty == target {
            Ok(Cow::Borrowed(data))
        } else {
            convert::convert(data, info.ty, target, info.row_length())
                .with_context(|| format!("tensor `{}` ({} to {target})", info.name, info.ty))
                .map(Cow::Owned)
        };
        progress.inc(1);
        converted.map_err(|error| {
            let message = format!("{error:#}");
            failure = Some(error);
            GgufError::Io {
                source: std::io::Error::other(message),
            }
        })
    });
    progress.finish_and_clear();
    if let Some(error) = failure {
        return Err(error.context(format!("cannot write {}", args.output.display())));
    }
    written.context("cannot write the output model")?;

    let input_bytes: u64 = infos.iter().map(|info| info.n_bytes).sum();
    let output_bytes: u64 = infos
        .iter()
        .zip(&types)
        .map(|(info, ty)| ty.row_bytes(info.row_length()).unwrap_or(0) * info.n_rows())
        .sum();
    eprintln!(
        "{}: {} tensors, {:.2} MiB -> {:.2} MiB of tensor data ({preset}{}), {:.1} s",
        args.output.display(),
        infos.len(),
        input_bytes as f64 / (1 << 20) as f64,
        output_bytes as f64 / (1 << 20) as f64,
        if args.pure { ", pure" } else { "" },
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// Refuses to overwrite the input: the output is written while the input is still mapped.
fn refuse_same_file(args: &Args) -> Result<()> {
    let same = match (args.input.canonicalize(), args.output.canonicalize()) {
        (Ok(input), Ok(output)) => input == output,
        _ => false,
    };
    if same {
        bail!(
            "the output {} is the input file; write to another path",
            args.output.display()
        );
    }
    Ok(())
}

/// Refuses to convert a tensor that is already quantized (as llama-quantize does without
/// `--allow-requantize`); tensors kept in their type are copied and need no permission.
fn refuse_requantize(infos: &[&TensorInfo], types: &[GgmlType]) -> Result<()> {
    let requantized: Vec<String> = infos
        .iter()
        .zip(types)
        .filter(|(info, &ty)| info.ty.is_quantized() && info.ty != ty)
        .map(|(info, ty)| format!("{} ({} to {ty})", info.name, info.ty))
        .collect();
    if let Some(first) = requantized.first() {
        bail!(
            "the input is already quantized: {} tensors would be quantized again (first: {first}); \
             quantize the F32/F16/BF16 original, or pass --allow-requantize to accept the loss",
            requantized.len()
        );
    }
    Ok(())
}

/// The output's metadata and tensor table: the input's keys in order (minus
/// [`KEYS_NOT_COPIED`]), then the quantization version and file type, then the tensors.
fn output_layout(
    source: &GgufFile,
    infos: &[&TensorInfo],
    types: &[GgmlType],
    preset: Preset,
) -> Result<GgufWriter> {
    let mut writer = GgufWriter::new();
    for (key, value) in source.metadata() {
        if !KEYS_NOT_COPIED.contains(&key.as_str()) {
            writer.add_metadata(key.clone(), value.clone())?;
        }
    }
    writer.add_metadata(
        "general.quantization_version",
        Value::U32(QUANTIZATION_VERSION),
    )?;
    writer.add_metadata("general.file_type", Value::U32(preset.file_type()))?;
    for (info, &ty) in infos.iter().zip(types) {
        writer.add_tensor(info.name.clone(), ty, info.shape.clone())?;
    }
    Ok(writer)
}

/// A bar of tensors done on stderr (drawn only when stderr is a terminal).
fn progress_bar(num_tensors: usize) -> ProgressBar {
    let progress = ProgressBar::new(num_tensors as u64);
    if let Ok(style) =
        ProgressStyle::with_template("{elapsed_precise} [{bar:40}] {pos}/{len} tensors")
    {
        progress.set_style(style.progress_chars("=> "));
    }
    progress
}
