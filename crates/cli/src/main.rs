//! `runit`: the command-line front end of the RunIT inference engine.

mod commands;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// RunIT: run GGUF language models locally, from scratch in Rust.
#[derive(Parser)]
#[command(name = "runit", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            if is_broken_pipe(&err) {
                return ExitCode::SUCCESS;
            }
            eprintln!("error: {err:#}");
            ExitCode::FAILURE
        }
    }
}

/// A closed stdout (`runit inspect x | head`) is a normal way for a reader to stop.
fn is_broken_pipe(err: &anyhow::Error) -> bool {
    err.chain().any(|cause| {
        cause
            .downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}
