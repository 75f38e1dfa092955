//! `runit serve`: an OpenAI-compatible HTTP server (chat and text completions, responses,
//! embeddings, streaming) with continuous batching over one shared, paged KV cache, under
//! limits on connections and on chat-template rendering.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use runit_engine::scheduler::Scheduler;
use runit_engine::EngineConfig;
use runit_server::{AppState, ConnectionLimits, ServerConfig, Shutdown, TemplateLimits};
use runit_tokenizer::RenderLimits;

use super::common::{chat_template, load, ModelArgs};
use super::speculative::SpeculativeArgs;

#[derive(clap::Args)]
#[command(after_help = super::sampling::request_defaults_help())]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub speculative: SpeculativeArgs,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port to listen on.
    #[arg(long, default_value_t = 8080)]
    pub port: u16,
    /// Most sequences decoded at once; they share the --ctx-size cells of the cache.
    #[arg(long, default_value_t = EngineConfig::DEFAULT.max_sequences)]
    pub parallel: usize,
    /// Most sequences waiting beyond the running ones (a request with `n` or several prompts
    /// counts each); a request whose sequences do not all fit is answered 503 whole.
    #[arg(long, default_value_t = EngineConfig::DEFAULT.max_queued)]
    pub max_queued: usize,
    /// On a GPU without --ctx-size: the share of the device memory free after the weights
    /// that the KV pool takes (each request may then use the model's training context).
    #[arg(long, value_name = "SHARE", value_parser = share,
          default_value_t = EngineConfig::DEFAULT_DEVICE_MEMORY_FRACTION)]
    pub gpu_memory_fraction: f64,
    /// Do not keep the KV blocks of prompts for later prompts that begin the same way (a
    /// system prompt, a chat's earlier turns); every prompt is evaluated whole.
    #[arg(long)]
    pub no_prefix_cache: bool,
    /// Require `Authorization: Bearer KEY` on the /v1 routes (and to see /health's
    /// counters). Visible to other users in the process list: prefer --api-key-file or the
    /// RUNIT_API_KEY environment variable.
    #[arg(long, env = "RUNIT_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    /// Read the API key from this file (its first line, surrounding whitespace removed).
    #[arg(long, value_name = "FILE", conflicts_with = "api_key")]
    pub api_key_file: Option<PathBuf>,
    /// A model id reported by /v1/models and accepted in requests; repeat it for several
    /// (the first is the one answers carry; the file's name is always accepted too).
    #[arg(long)]
    pub alias: Vec<String>,
    /// Render chats with the Jinja template in FILE instead of the model's (as llama.cpp's
    /// `--chat-template-file`).
    #[arg(long, value_name = "FILE", conflicts_with = "chat_template")]
    pub chat_template_file: Option<PathBuf>,
    /// Chat template: a built-in name (chatml, llama3, mistral, gemma, qwen3) or a Jinja file,
    /// instead of the model's own.
    #[arg(long, value_name = "NAME|FILE")]
    pub chat_template: Option<String>,
    #[command(flatten)]
    pub limits: LimitArgs,
    /// Log lines as text (coloured only on a terminal) or as one JSON object per line.
    #[arg(long, value_enum, default_value_t = LogFormatArg::Text)]
    pub log_format: LogFormatArg,
}

/// `--log-format` values.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogFormatArg {
    Text,
    Json,
}

/// Timeouts and limits against slow, idle or hostile clients and model files.
#[derive(clap::Args)]
#[command(next_help_heading = "Limits")]
pub struct LimitArgs {
    /// Seconds a request's headers may take to arrive, from its first byte.
    #[arg(long, value_name = "SECONDS", value_parser = seconds, default_value = "10")]
    pub header_timeout: Duration,
    /// Seconds a request's body may take to arrive, after its headers.
    #[arg(long, value_name = "SECONDS", value_parser = seconds, default_value = "30")]
    pub body_timeout: Duration,
    /// Seconds a connection may stay open waiting for its next (or first) request.
    #[arg(long, value_name = "SECONDS", value_parser = seconds, default_value = "60")]
    pub idle_timeout: Duration,
    /// Seconds one write of a response may wait for a client that does not read; then the
    /// connection is dropped and its generation cancelled.
    #[arg(long, value_name = "SECONDS", value_parser = seconds, default_value = "30")]
    pub write_timeout: Duration,
    /// Most connections open at once; more are answered 503 and closed. Keep it below the
    /// descriptor limit (`ulimit -n`).
    #[arg(long, value_name = "N", default_value_t = ConnectionLimits::DEFAULT.max_connections)]
    pub max_connections: usize,
    /// Seconds the requests in flight may take to finish after Ctrl-C or SIGTERM; a second
    /// signal stops at once.
    #[arg(long, value_name = "SECONDS", value_parser = seconds, default_value = "30")]
    pub shutdown_timeout: Duration,
    /// Fuel of one chat-template rendering: one per instruction plus about one per 64 bytes
    /// of data the template creates (so it bounds time and memory); past it the request is
    /// answered 400.
    #[arg(long, value_name = "N", default_value_t = RenderLimits::DEFAULT.fuel)]
    pub template_fuel: u64,
    /// Most bytes a chat template may render; past it the request is answered 400.
    #[arg(long, value_name = "BYTES", default_value_t = RenderLimits::DEFAULT.max_output_bytes)]
    pub template_max_bytes: usize,
    /// Seconds a chat request may wait for its template to be rendered and tokenized.
    #[arg(long, value_name = "SECONDS", value_parser = seconds, default_value = "10")]
    pub template_timeout: Duration,
}

impl LimitArgs {
    fn connections(&self) -> ConnectionLimits {
        ConnectionLimits {
            header_timeout: self.header_timeout,
            body_timeout: self.body_timeout,
            idle_timeout: self.idle_timeout,
            write_timeout: self.write_timeout,
            max_connections: self.max_connections,
            shutdown_timeout: self.shutdown_timeout,
        }
    }

    fn render(&self) -> RenderLimits {
        RenderLimits {
            fuel: self.template_fuel,
            max_output_bytes: self.template_max_bytes,
        }
    }

    fn template(&self) -> TemplateLimits {
        TemplateLimits {
            render: self.render(),
            timeout: self.template_timeout,
            ..TemplateLimits::DEFAULT
        }
    }
}

/// A duration given in seconds (fractions allowed).
fn seconds(text: &str) -> Result<Duration, String> {
    let value: f64 = text
        .trim()
        .parse()
        .map_err(|_| format!("`{text}` is not a number of seconds"))?;
    Duration::try_from_secs_f64(value)
        .map_err(|_| format!("`{text}` must be a finite number of seconds, 0 or more"))
}

/// A share in (0, 1].
fn share(text: &str) -> Result<f64, String> {
    let value: f64 = text
        .parse()
        .map_err(|_| format!("`{text}` is not a number"))?;
    if value > 0.0 && value <= 1.0 {
        Ok(value)
    } else {
        Err(format!("expected a share in (0, 1], found {value}"))
    }
}

/// The API key from --api-key (or RUNIT_API_KEY) or --api-key-file.
fn api_key(args: &Args) -> anyhow::Result<Option<String>> {
    let key = match &args.api_key_file {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading the API key from {}", path.display()))?;
            Some(text.lines().next().unwrap_or_default().trim().to_string())
        }
        None => args.api_key.as_ref().map(|key| key.trim().to_string()),
    };
    if key.as_ref().is_some_and(String::is_empty) {
        anyhow::bail!("the API key is empty");
    }
    Ok(key)
}

pub fn run(args: Args) -> anyhow::Result<()> {
    runit_server::init_logging(match args.log_format {
        LogFormatArg::Text => runit_server::LogFormat::Text,
        LogFormatArg::Json => runit_server::LogFormat::Json,
    });
    let api_key = api_key(&args)?;
    let loaded = load(&args.model)?;
    // A draft model is loaded now (its vocabulary checked), its sessions made once the
    // context is known; prompt lookup needs only its settings.
    let draft_source = match &args.speculative.model_draft {
        Some(_) => args.speculative.load(&args.model, &loaded)?,
        None => None,
    };
    let speculation = match &draft_source {
        Some(source) => Some((runit_server::PREDICTION_NGRAM, source.params())),
        None => args.speculative.serve_settings()?,
    };
    let choice = args
        .chat_template_file
        .as_ref()
        .map(|path| path.to_string_lossy().into_owned())
        .or(args.chat_template.clone());
    let template = chat_template(&loaded, choice.as_deref(), args.limits.render())?;
    // On a device without --ctx-size, the pool fills the memory share and each request may
    // use the training context; else the pool holds --ctx-size cells.
    let from_memory =
        args.model.ctx_size.is_none() && loaded.model.backend.memory_available().is_some();
    let base = args.model.engine_config();
    let config = EngineConfig {
        max_sequences: args.parallel,
        max_queued: args.max_queued,
        prefix_cache: !args.no_prefix_cache,
        context_size: if from_memory { 0 } else { base.context_size },
        device_memory_fraction: from_memory.then_some(args.gpu_memory_fraction),
        ..base
    };
    let scheduler = Scheduler::start(Arc::clone(&loaded.model), &config)?;
    let stats = scheduler.stats();
    let kv_bytes = runit_model::KvState::token_bytes(&loaded.model, config.kv_types)?;
    eprintln!(
        "KV pool: {} blocks of {} cells ({}, {kv_bytes} bytes per token, {:.1} MiB); prefix cache {}",
        stats.total_blocks,
        config.kv_block_size,
        config.kv_types,
        (stats.total_blocks * config.kv_block_size * kv_bytes) as f64 / (1u64 << 20) as f64,
        if config.prefix_cache { "on" } else { "off" }
    );
    let context_size = scheduler.context_size();
    let draft_model = match &draft_source {
        Some(source) => source.pool(context_size)?,
        None => None,
    };
    if let (Some(source), Some(_)) = (&draft_source, &draft_model) {
        eprintln!(
            "speculative decoding: {} (a draft session of {context_size} cells for each sequence that drafts)",
            source.describe()
        );
    }
    let file_name = loaded
        .path
        .file_name()
        .map_or_else(|| "model".into(), |n| n.to_string_lossy().into_owned());
    let mut aliases = args.alias.clone();
    aliases.push(file_name);
    let model_name = aliases.remove(0);
    // Without --n-predict a request may generate up to its share of the cache.
    let pool_cells = stats.total_blocks * config.kv_block_size;
    let default_max_tokens = (pool_cells / args.parallel.max(1))
        .min(scheduler.context_size())
        .max(1);
    let config = ServerConfig {
        model_name,
        aliases,
        api_key,
        default_max_tokens,
        connections: args.limits.connections(),
        template: args.limits.template(),
        speculation,
        draft_model,
        ..ServerConfig::default()
    };
    let state = Arc::new(
        AppState::new(scheduler, loaded.tokenizer, template, config)
            .with_embeddings(Arc::clone(&loaded.model), context_size),
    );
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let outcome = runtime.block_on(async {
        let listener = runit_server::bind(&args.host, args.port).await?;
        // Returns after Ctrl-C or SIGTERM, once the requests in flight have finished, the
        // shutdown timeout has passed, or a second signal came.
        anyhow::Ok(runit_server::serve(listener, state).await?)
    })?;
    if outcome != Shutdown::Drained {
        // Dropped requests may leave blocking work (a template rendering) behind: leave it.
        runtime.shutdown_background();
        std::process::exit(1);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(clap::Parser)]
    struct Command {
        #[command(flatten)]
        limits: LimitArgs,
    }

    #[test]
    fn flag_defaults_are_the_library_defaults() {
        let limits = Command::parse_from(["serve"]).limits;
        assert_eq!(limits.connections(), ConnectionLimits::DEFAULT);
        assert_eq!(limits.template(), TemplateLimits::DEFAULT);
    }

    #[test]
    fn seconds_take_fractions_and_refuse_nonsense() {
        assert_eq!(seconds("1.5"), Ok(Duration::from_millis(1500)));
        assert!(seconds("-1").is_err());
        assert!(seconds("NaN").is_err());
        assert!(seconds("soon").is_err());
    }

    #[test]
    fn memory_shares_are_in_zero_to_one() {
        assert_eq!(share("0.9"), Ok(0.9));
        assert_eq!(share("1"), Ok(1.0));
        for bad in ["0", "1.5", "-0.2", "NaN", "most"] {
            assert!(share(bad).is_err(), "{bad}");
        }
    }
}
