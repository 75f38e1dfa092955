//! `runit perplexity`: perplexity of a text, computed like llama.cpp's perplexity tool
//! (non-overlapping chunks of `-c` tokens, second half of each scored) so figures compare.

use std::path::PathBuf;

use anyhow::Context;
use indicatif::{ProgressBar, ProgressStyle};
use runit_engine::{perplexity, Session};
use serde_json::json;

use super::common::{load, ModelArgs};

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    /// The text file to score (chunks are `-c` tokens long).
    #[arg(short = 'f', long = "file")]
    pub file: PathBuf,
    /// `text` prints running values and the final estimate; `json` prints one object.
    #[arg(long, value_enum, default_value_t = Format::Text)]
    pub output_format: Format,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Text,
    Json,
}

pub fn run(mut args: Args) -> anyhow::Result<()> {
    let text =
        std::fs::read(&args.file).with_context(|| format!("reading {}", args.file.display()))?;
    // As in llama.cpp's tool, -c is the chunk length; batches never exceed it.
    let n_ctx = args.model.context_size();
    args.model.batch_size = args.model.batch_size.min(n_ctx);
    let loaded = load(&args.model)?;
    let tokens = loaded.tokenizer.encode_bytes(&text, true, false);
    let bos = if loaded.tokenizer.add_bos() {
        loaded.tokenizer.bos_id()
    } else {
        None
    };
    let mut config = args.model.engine_config();
    config.context_size = n_ctx;
    let mut session = Session::new(loaded.model.clone(), &config)?;
    if session.context_size() < n_ctx {
        anyhow::bail!(
            "-c {n_ctx} exceeds the model's context of {} tokens",
            session.context_size()
        );
    }
    let chunks = tokens.len() / n_ctx;
    let bar = ProgressBar::new(chunks as u64).with_style(
        ProgressStyle::with_template("{bar:40} {pos}/{len} chunks, eta {eta} {msg}")
            .expect("the template is valid"),
    );
    let json_mode = args.output_format == Format::Json;
    let report = perplexity(&mut session, &tokens, n_ctx, bos, |i, ppl| {
        bar.set_position(i as u64 + 1);
        bar.set_message(format!("ppl {ppl:.4}"));
    })?;
    bar.finish_and_clear();
    if json_mode {
        let object = json!({
            "model": loaded.path.display().to_string(),
            "text": args.file.display().to_string(),
            "n_ctx": n_ctx,
            "tokens": tokens.len(),
            "n_chunks": report.chunks,
            "scored_tokens": report.scored_tokens,
            "running_ppl_per_chunk": report.running,
            "final_ppl": report.perplexity,
            "final_ppl_stderr": report.stderr,
        });
        println!("{object}");
    } else {
        let running: Vec<String> = report
            .running
            .iter()
            .enumerate()
            .map(|(i, p)| format!("[{}]{p:.4}", i + 1))
            .collect();
        println!("{}", running.join(","));
        println!(
            "Final estimate: PPL = {:.4} +/- {:.5} ({} chunks of {n_ctx} tokens, {} scored)",
            report.perplexity, report.stderr, report.chunks, report.scored_tokens
        );
    }
    Ok(())
}
