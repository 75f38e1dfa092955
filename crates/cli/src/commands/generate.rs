//! `runit generate`: complete a prompt, streaming text to stdout and a summary to stderr
//! (or one JSON object with ids, text and timings).

use std::io::Write;
use std::path::PathBuf;

use anyhow::Context;
use runit_engine::{
    generate_with, GenerateParams, GeneratedToken, Sampler, SamplerParams, Session, StopReason,
};
use runit_tokenizer::{ChatMessage, RenderLimits, StreamDecoder, StreamOptions};
use serde_json::json;

use super::common::{chat_template, load, parse_n_predict, ModelArgs};
use super::sampling::SamplingArgs;
use super::speculative::SpeculativeArgs;

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    /// The prompt. Special-token text such as `<|im_start|>` is parsed as the special token.
    #[arg(short = 'p', long, conflicts_with_all = ["file", "prompt_ids"])]
    pub prompt: Option<String>,
    /// The prompt as token ids, comma-separated (e.g. `1,376,259`), evaluated exactly as given
    /// (no tokenizer, no BOS added): for replaying a reference's token sequence.
    #[arg(long, value_delimiter = ',', conflicts_with_all = ["file", "chat"])]
    pub prompt_ids: Option<Vec<u32>>,
    /// Read the prompt from this file.
    #[arg(short = 'f', long)]
    pub file: Option<PathBuf>,
    /// Tokens to generate at most; -1: until the context is full.
    #[arg(short = 'n', long = "n-predict", default_value = "256", allow_hyphen_values = true,
          value_parser = parse_n_predict)]
    pub n_predict: usize,
    /// Do not stop at end-of-generation tokens: generate all -n tokens (as a server
    /// request's `ignore_eos`; for benchmarks and comparisons of fixed length).
    #[arg(long)]
    pub ignore_eos: bool,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    #[command(flatten)]
    pub speculative: SpeculativeArgs,
    /// Wrap the prompt in the model's chat template as a user message.
    #[arg(long)]
    pub chat: bool,
    /// System message for `--chat` (`-sys`, as llama.cpp).
    #[arg(long, visible_alias = "system-prompt")]
    pub system: Option<String>,
    /// Chat interactively instead of completing one prompt (`-cnv`, as llama-cli): runs
    /// `runit chat` with these flags.
    #[arg(long, conflicts_with_all = ["prompt", "file", "prompt_ids", "output_format", "dump_logits", "dump_layers"])]
    pub conversation: bool,
    /// Chat template for `--chat`: a built-in name (chatml, llama3, mistral, gemma, qwen3) or
    /// a Jinja file, instead of the model's own.
    #[arg(long, value_name = "NAME|FILE")]
    pub chat_template: Option<String>,
    /// Treat special-token text in the prompt as plain text.
    #[arg(long)]
    pub no_parse_special: bool,
    /// Show special tokens (such as the end-of-turn token) in the output text.
    #[arg(long)]
    pub show_special: bool,
    /// `text` streams the completion; `json` prints one object with ids, text and timings.
    #[arg(long, value_enum, default_value_t = OutputFormat::Text)]
    pub output_format: OutputFormat,
    /// Also report the K most likely tokens and their log-probabilities at every step
    /// (stderr in text mode, `logprobs` in JSON).
    #[arg(long, value_name = "K")]
    pub dump_logits: Option<usize>,
    /// Write every intermediate tensor of the prompt pass (name, shape, sum, first values,
    /// named like llama.cpp's eval-callback) to this file. With RUNIT_DUMP_FULL=NAME,... in the
    /// environment, every value of those nodes is written too.
    #[arg(long, value_name = "FILE")]
    pub dump_layers: Option<PathBuf>,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum OutputFormat {
    Text,
    Json,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    if args.conversation {
        return super::chat::run(super::chat::Args {
            model: args.model,
            sampling: args.sampling,
            speculative: args.speculative,
            system: args.system,
            n_predict: args.n_predict,
            conversation: true,
            chat_template: args.chat_template,
        });
    }
    for (given, flag) in [
        (args.chat_template.is_some(), "--chat-template"),
        (args.system.is_some(), "--system"),
    ] {
        if given && !args.chat {
            anyhow::bail!("{flag} applies to --chat (or -cnv); add --chat to use it");
        }
    }
    let params = args.sampling.params()?;
    let prompt_text = match (&args.prompt, &args.file, &args.prompt_ids) {
        (Some(p), _, _) => p.clone(),
        (None, Some(f), _) => std::fs::read_to_string(f)
            .with_context(|| format!("reading the prompt from {}", f.display()))?,
        (None, None, Some(_)) => String::new(),
        (None, None, None) => {
            anyhow::bail!("give a prompt with -p TEXT, -f FILE or --prompt-ids IDS")
        }
    };
    let loaded = load(&args.model)?;
    let drafts = args.speculative.load(&args.model, &loaded)?;
    let tokenizer = &loaded.tokenizer;
    let text = if args.chat {
        let template = chat_template(
            &loaded,
            args.chat_template.as_deref(),
            RenderLimits::DEFAULT,
        )?;
        let mut messages = Vec::new();
        if let Some(system) = &args.system {
            messages.push(ChatMessage::system(system.clone()));
        }
        messages.push(ChatMessage::user(prompt_text));
        template.render(&messages, true)?
    } else {
        prompt_text
    };
    let prompt_ids = match &args.prompt_ids {
        Some(ids) => ids.clone(),
        None => tokenizer.encode(&text, true, !args.no_parse_special),
    };
    let mut session = Session::new(loaded.model.clone(), &args.model.engine_config())?;
    let gen_params = GenerateParams {
        max_tokens: args.n_predict,
        end_of_generation: if args.ignore_eos {
            Vec::new()
        } else {
            tokenizer.eog_ids()
        },
        top_logprobs: args.dump_logits.unwrap_or(0),
    };
    // The engine's check of the prompt (empty, outside the vocabulary, too long) and of -n,
    // before the layer dump evaluates the prompt too.
    gen_params.validate(&session, &prompt_ids)?;
    if let Some(path) = &args.dump_layers {
        super::dump::dump_prompt_layers(&mut session, &prompt_ids, path)?;
        session.reset();
    }
    let mut sampler = Sampler::new(SamplerParams {
        constraint: args.sampling.constraint(&loaded.tokenizer)?,
        ..params
    })?;
    let json_mode = args.output_format == OutputFormat::Json;
    let mut stream = StreamDecoder::new(
        tokenizer,
        StreamOptions {
            show_special: args.show_special,
            strip_leading_space: false,
        },
    );
    let mut stdout = std::io::stdout().lock();
    let mut steps: Vec<GeneratedToken> = Vec::new();
    let mut write_error = None;
    let mut speculation = drafts
        .as_ref()
        .map(|drafts| drafts.speculation())
        .transpose()?;
    let output = generate_with(
        &mut session,
        &mut sampler,
        &prompt_ids,
        &gen_params,
        speculation.as_mut(),
        |token| {
            if json_mode {
                steps.push(token.clone());
                return true;
            }
            if args.dump_logits.is_some() {
                eprintln!("{}", logits_line(tokenizer, token));
            }
            let chunk = stream.push(token.id).unwrap_or_default();
            let result = stdout
                .write_all(chunk.as_bytes())
                .and_then(|()| stdout.flush());
            if let Err(e) = result {
                write_error = Some(e);
                return false;
            }
            true
        },
    )?;
    if let Some(e) = write_error {
        return Err(e.into());
    }
    let generated_text = {
        let shown: Vec<u32> = output
            .tokens
            .iter()
            .copied()
            .filter(|&id| args.show_special || !tokenizer.is_control(id))
            .collect();
        String::from_utf8_lossy(&tokenizer.decode(&shown)?).into_owned()
    };
    let stop = match output.stop {
        StopReason::EndOfGeneration => "eos",
        StopReason::Limit => "limit",
        StopReason::Cancelled => "cancelled",
    };
    if json_mode {
        let logprobs: Vec<_> = steps
            .iter()
            .map(|s| json!({"id": s.id, "logprob": s.logprob, "top": s.top}))
            .collect();
        let object = json!({
            "prompt_ids": prompt_ids,
            "tokens": output.tokens,
            "text": generated_text,
            "stop": stop,
            "logprobs": if args.dump_logits.is_some() { json!(logprobs) } else { json!(null) },
            "timings": {
                "prompt_tokens": output.prompt_tokens,
                "prompt_ms": output.prompt_time.as_secs_f64() * 1e3,
                "prompt_tokens_per_second": output.prompt_tokens_per_second(),
                "generated_tokens": output.tokens.len(),
                "decode_ms": output.decode_time.as_secs_f64() * 1e3,
                "decode_tokens_per_second": output.decode_tokens_per_second(),
            },
            "speculation": output.speculation.map(|stats| json!({
                "drafted": stats.drafted,
                "accepted": stats.accepted,
                "acceptance_rate": stats.acceptance_rate(),
            })),
        });
        serde_json::to_writer(&mut stdout, &object)?;
        writeln!(stdout)?;
    } else {
        write!(stdout, "{}", stream.finish())?;
        writeln!(stdout)?;
        eprintln!(
            "\nprompt: {} tokens, {:.1} tok/s | generated: {} tokens, {:.1} tok/s | stop: {stop}",
            output.prompt_tokens,
            output.prompt_tokens_per_second(),
            output.tokens.len(),
            output.decode_tokens_per_second(),
        );
        if let Some(stats) = output.speculation {
            eprintln!(
                "speculation: {} drafted, {} accepted ({:.1}%) in {} verifications",
                stats.drafted,
                stats.accepted,
                100.0 * stats.acceptance_rate(),
                stats.verifications
            );
        }
        let windows = session.window_ring_cells().map_or(String::new(), |cells| {
            format!(" (windowed layers keep {cells} cells)")
        });
        eprintln!(
            "kv cache: {:.1} MiB for the sequence{windows}",
            session.kv_cache_bytes() as f64 / (1u64 << 20) as f64
        );
    }
    Ok(())
}

fn logits_line(tokenizer: &runit_tokenizer::Tokenizer, token: &GeneratedToken) -> String {
    let piece = |id: u32| {
        tokenizer
            .token_piece(id)
            .map(|p| String::from_utf8_lossy(p).into_owned())
            .unwrap_or_default()
    };
    let top: Vec<String> = token
        .top
        .iter()
        .map(|&(id, lp)| format!("{id}:{:?}:{lp:.4}", piece(id)))
        .collect();
    format!(
        "[{} {:?} {:.4}] {}",
        token.id,
        piece(token.id),
        token.logprob,
        top.join(" ")
    )
}
