//! `runit`: the command-line front end of the RunIT inference engine.

mod argv;
mod commands;
mod hub;
mod units;

use std::process::ExitCode;

use clap::{CommandFactory, Parser, Subcommand};

/// RunIT: run GGUF language models locally, from scratch in Rust.
#[derive(Parser)]
#[command(name = "runit", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Chat interactively with a model, using its chat template.
    Chat(commands::chat::Args),
    /// Measure prompt-processing and generation speed (like llama-bench).
    Bench(commands::bench::Args),
    /// Compute the perplexity of a text (like llama.cpp's perplexity tool).
    Perplexity(commands::perplexity::Args),
    /// Complete a prompt with a model, streaming the text.
    Generate(commands::generate::Args),
    /// List the devices this build can run on (CPU, CUDA, wgpu) with their `--device` names.
    Devices(commands::devices::Args),
    /// Describe a GGUF file: architecture, hyperparameters, tokenizer, metadata, tensors.
    Inspect(commands::inspect::Args),
    /// Write a copy of a GGUF model with its weights in another type (like llama-quantize).
    Quantize(commands::quantize::Args),
    /// Serve an OpenAI-compatible HTTP API (chat, completions, responses, embeddings) with
    /// continuous batching.
    Serve(commands::serve::Args),
    /// Write a random-weight GGUF with the exact shapes and types of a public model.
    Synth(commands::synth::Args),
    /// Print the token ids and pieces of a text (like llama-tokenize).
    Tokenize(commands::tokenize::Args),
    /// Print the embedding of each text (pooled, L2-normalised) as a JSON array.
    Embed(commands::embed::Args),
    /// Download a model from the Hugging Face Hub into the local cache (OWNER/NAME[:QUANT]).
    Pull(commands::models::PullArgs),
    /// List the cached models: name, quant, architecture, size.
    List(commands::models::ListArgs),
    /// Delete a cached model.
    Rm(commands::models::RemoveArgs),
}

fn main() -> ExitCode {
    let args = match argv::rewrite(std::env::args().collect(), &Cli::command()) {
        Ok(args) => args,
        Err(message) => {
            eprintln!("error: {message}");
            return ExitCode::from(2);
        }
    };
    let cli = Cli::parse_from(args);
    // A mistyped `RUNIT_CPU_ISA` would otherwise stop the first kernel choice with a panic.
    if let Err(error) = runit_quant::cpu::cap() {
        eprintln!("error: {error}");
        return ExitCode::from(2);
    }
    let result = match cli.command {
        Command::Chat(args) => commands::chat::run(args),
        Command::Bench(args) => commands::bench::run(args),
        Command::Perplexity(args) => commands::perplexity::run(args),
        Command::Generate(args) => commands::generate::run(args),
        Command::Devices(args) => commands::devices::run(args),
        Command::Inspect(args) => commands::inspect::run(args),
        Command::Quantize(args) => commands::quantize::run(args),
        Command::Serve(args) => commands::serve::run(args),
        Command::Synth(args) => commands::synth::run(args),
        Command::Tokenize(args) => commands::tokenize::run(args),
        Command::Embed(args) => commands::embed::run(args),
        Command::Pull(args) => commands::models::pull(args),
        Command::List(args) => commands::models::list(args),
        Command::Rm(args) => commands::models::remove(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            if is_broken_pipe(&err) {
                return ExitCode::SUCCESS;
            }
            eprintln!("error: {}", error_chain(&err));
            ExitCode::FAILURE
        }
    }
}

/// The error and its causes, skipping causes whose text the message already includes
/// (library errors often embed their source in their own message).
fn error_chain(err: &anyhow::Error) -> String {
    let mut text = String::new();
    for cause in err.chain() {
        let part = cause.to_string();
        if !text.contains(&part) {
            if !text.is_empty() {
                text.push_str(": ");
            }
            text.push_str(&part);
        }
    }
    text
}

/// A closed stdout (`runit inspect x | head`) is a normal way for a reader to stop.
fn is_broken_pipe(err: &anyhow::Error) -> bool {
    err.chain().any(|cause| {
        cause
            .downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}
