//! `runit inspect FILE`: what a GGUF file holds — architecture, hyperparameters, tokenizer,
//! every metadata key, the tensor table and totals — as text or one JSON object.

use crate::units::human_bytes;
use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;

use anyhow::Context;
use runit_gguf::{Array, GgufFile, Value};
use serde_json::{json, Map, Value as Json};

/// Arrays longer than this are summarised (type, length, first few entries).
const ARRAY_PREVIEW: usize = 8;

#[derive(clap::Args)]
pub struct Args {
    /// The GGUF file to describe.
    pub file: PathBuf,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
    /// Print every entry of long arrays instead of a summary.
    #[arg(long)]
    pub full: bool,
}

/// Hyperparameter keys shown in the summary, relative to `{arch}.`.
const MAIN_HYPERPARAMETERS: &[&str] = &[
    "context_length",
    "embedding_length",
    "block_count",
    "feed_forward_length",
    "attention.head_count",
    "attention.head_count_kv",
    "attention.key_length",
    "attention.value_length",
    "attention.layer_norm_rms_epsilon",
    "attention.sliding_window",
    "rope.freq_base",
    "rope.dimension_count",
    "rope.scaling.type",
    "rope.scaling.factor",
    "expert_count",
    "expert_used_count",
    "vocab_size",
];

pub fn run(args: Args) -> anyhow::Result<()> {
    let file = GgufFile::open(&args.file)?;
    let report = describe(&file, args.full);
    let mut out = std::io::stdout().lock();
    if args.json {
        serde_json::to_writer_pretty(&mut out, &report).context("writing JSON")?;
        writeln!(out)?;
    } else {
        print_text(&mut out, &report)?;
    }
    Ok(())
}

fn describe(file: &GgufFile, full: bool) -> Json {
    let arch = file
        .get_str("general.architecture")
        .unwrap_or("(none)")
        .to_string();
    let mut hyper = Map::new();
    for suffix in MAIN_HYPERPARAMETERS {
        if let Some(v) = file.get(&format!("{arch}.{suffix}")) {
            hyper.insert(suffix.to_string(), value_json(v, false));
        }
    }
    let tokenizer = tokenizer_summary(file);
    let metadata: Vec<Json> = file
        .metadata()
        .iter()
        .map(|(k, v)| json!({"key": k, "type": v.type_description(), "value": value_json(v, full)}))
        .collect();
    let mut by_type: BTreeMap<String, (u64, u64, u64)> = BTreeMap::new();
    let mut parameters = 0u64;
    let mut tensor_bytes = 0u64;
    let tensors: Vec<Json> = file
        .tensors()
        .iter()
        .map(|t| {
            let n = t.n_elements();
            parameters += n;
            tensor_bytes += t.n_bytes;
            let entry = by_type.entry(t.ty.name().to_string()).or_default();
            entry.0 += 1;
            entry.1 += n;
            entry.2 += t.n_bytes;
            json!({"name": t.name, "type": t.ty.name(), "shape": t.shape, "bytes": t.n_bytes, "offset": t.offset})
        })
        .collect();
    let types: Map<String, Json> = by_type
        .into_iter()
        .map(|(ty, (count, elements, bytes))| {
            (
                ty,
                json!({"tensors": count, "elements": elements, "bytes": bytes}),
            )
        })
        .collect();
    let bpw = if parameters > 0 {
        tensor_bytes as f64 * 8.0 / parameters as f64
    } else {
        0.0
    };
    json!({
        "file": file.path().map(|p| p.display().to_string()),
        "gguf_version": file.version(),
        "alignment": file.alignment(),
        "data_offset": file.data_offset(),
        "architecture": arch,
        "name": file.get_str("general.name").ok(),
        "hyperparameters": hyper,
        "tokenizer": tokenizer,
        "metadata": metadata,
        "tensors": tensors,
        "totals": {
            "tensors": file.tensors().len(),
            "parameters": parameters,
            "tensor_bytes": tensor_bytes,
            "file_size": file.file_size(),
            "bits_per_weight": bpw,
            "by_type": types,
        },
    })
}

fn tokenizer_summary(file: &GgufFile) -> Json {
    let Ok(model) = file.get_str("tokenizer.ggml.model") else {
        return Json::Null;
    };
    let count = |key: &str| file.get(key).and_then(Value::as_array).map(Array::len);
    let token_text = |key: &str| {
        let id = file.get(key)?.as_u64()?;
        let tokens = file.get_str_array("tokenizer.ggml.tokens").ok()?;
        Some(json!({"id": id, "text": tokens.get(id as usize)?}))
    };
    json!({
        "model": model,
        "pre": file.get_str("tokenizer.ggml.pre").ok(),
        "tokens": count("tokenizer.ggml.tokens"),
        "merges": count("tokenizer.ggml.merges"),
        "bos": token_text("tokenizer.ggml.bos_token_id"),
        "eos": token_text("tokenizer.ggml.eos_token_id"),
        "add_bos_token": file.get("tokenizer.ggml.add_bos_token").and_then(Value::as_bool),
        "chat_template": file.get("tokenizer.chat_template").is_some(),
    })
}

fn value_json(value: &Value, full: bool) -> Json {
    match value {
        Value::Array(array) => array_json(array, full),
        Value::String(s) => Json::String(s.clone()),
        Value::Bool(b) => Json::Bool(*b),
        Value::F32(x) => json!(x),
        Value::F64(x) => json!(x),
        other => match (other.as_u64(), other.as_i64()) {
            (Some(u), _) => json!(u),
            (None, Some(i)) => json!(i),
            _ => Json::Null,
        },
    }
}

fn array_json(array: &Array, full: bool) -> Json {
    let items: Vec<Json> = (0..array.len())
        .take(if full { usize::MAX } else { ARRAY_PREVIEW })
        .map(|i| array_item(array, i, full))
        .collect();
    if full || array.len() <= ARRAY_PREVIEW {
        Json::Array(items)
    } else {
        json!({"summary": true, "length": array.len(), "first": items})
    }
}

fn array_item(array: &Array, i: usize, full: bool) -> Json {
    match array {
        Array::U8(v) => json!(v[i]),
        Array::I8(v) => json!(v[i]),
        Array::U16(v) => json!(v[i]),
        Array::I16(v) => json!(v[i]),
        Array::U32(v) => json!(v[i]),
        Array::I32(v) => json!(v[i]),
        Array::U64(v) => json!(v[i]),
        Array::I64(v) => json!(v[i]),
        Array::F32(v) => json!(v[i]),
        Array::F64(v) => json!(v[i]),
        Array::Bool(v) => json!(v[i]),
        Array::String(v) => json!(v[i]),
        Array::Array(v) => array_json(&v[i], full),
    }
}

fn print_text(out: &mut impl Write, r: &Json) -> anyhow::Result<()> {
    let s = |v: &Json| match v {
        Json::String(s) => s.clone(),
        Json::Null => "-".into(),
        other => other.to_string(),
    };
    writeln!(out, "file:          {}", s(&r["file"]))?;
    writeln!(
        out,
        "gguf version:  {}   alignment: {}   data offset: {}",
        r["gguf_version"], r["alignment"], r["data_offset"]
    )?;
    writeln!(out, "architecture:  {}", s(&r["architecture"]))?;
    writeln!(out, "name:          {}", s(&r["name"]))?;
    writeln!(out, "\nhyperparameters:")?;
    if let Some(h) = r["hyperparameters"].as_object() {
        for (k, v) in h {
            writeln!(out, "  {k:<36} {}", s(v))?;
        }
    }
    writeln!(out, "\ntokenizer:")?;
    if let Some(t) = r["tokenizer"].as_object() {
        for (k, v) in t {
            writeln!(out, "  {k:<36} {}", s(v))?;
        }
    } else {
        writeln!(out, "  (none)")?;
    }
    writeln!(
        out,
        "\nmetadata ({} keys):",
        r["metadata"].as_array().map_or(0, Vec::len)
    )?;
    for kv in r["metadata"].as_array().into_iter().flatten() {
        let mut value = s(&kv["value"]);
        if value.len() > 160 {
            let cut = (0..=160)
                .rev()
                .find(|&i| value.is_char_boundary(i))
                .unwrap_or(0);
            value = format!("{}… ({} chars)", &value[..cut], value.chars().count());
        }
        let value = value.replace('\n', "\\n");
        writeln!(
            out,
            "  {:<44} {:<14} {}",
            s(&kv["key"]),
            s(&kv["type"]),
            value
        )?;
    }
    let tensors = r["tensors"].as_array().cloned().unwrap_or_default();
    writeln!(out, "\ntensors ({}):", tensors.len())?;
    writeln!(
        out,
        "  {:<40} {:<8} {:<24} {:>12}",
        "name", "type", "shape", "size"
    )?;
    for t in &tensors {
        writeln!(
            out,
            "  {:<40} {:<8} {:<24} {:>12}",
            s(&t["name"]),
            s(&t["type"]),
            t["shape"].to_string(),
            human_bytes(t["bytes"].as_u64().unwrap_or(0))
        )?;
    }
    let totals = &r["totals"];
    writeln!(out, "\ntotals:")?;
    writeln!(
        out,
        "  parameters      {} ({:.1} M)",
        totals["parameters"],
        totals["parameters"].as_f64().unwrap_or(0.0) / 1e6
    )?;
    for (label, key) in [("tensor data", "tensor_bytes"), ("file size", "file_size")] {
        let bytes = totals[key].as_u64().unwrap_or(0);
        writeln!(out, "  {label:<15} {} ({bytes} bytes)", human_bytes(bytes))?;
    }
    writeln!(
        out,
        "  bits per weight {:.3}",
        totals["bits_per_weight"].as_f64().unwrap_or(0.0)
    )?;
    if let Some(types) = totals["by_type"].as_object() {
        for (ty, v) in types {
            writeln!(
                out,
                "  {ty:<8} {:>5} tensors {:>14} elements {:>10}",
                v["tensors"],
                v["elements"],
                human_bytes(v["bytes"].as_u64().unwrap_or(0))
            )?;
        }
    }
    Ok(())
}
