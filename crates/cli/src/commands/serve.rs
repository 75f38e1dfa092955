//! `runit serve`: an OpenAI-compatible HTTP server (chat and text completions, streaming)
//! with continuous batching over one shared, paged KV cache.

use std::sync::Arc;

use anyhow::Context;
use runit_engine::scheduler::Scheduler;
use runit_engine::EngineConfig;
use runit_server::{AppState, ServerConfig};
use runit_tokenizer::ChatTemplate;

use super::common::{load, ModelArgs};

#[derive(clap::Args)]
#[command(after_help = super::sampling::request_defaults_help())]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port to listen on.
    #[arg(long, default_value_t = 8080)]
    pub port: u16,
    /// Most sequences decoded at once; they share the --ctx-size cells of the cache.
    #[arg(long, default_value_t = EngineConfig::DEFAULT.max_sequences)]
    pub parallel: usize,
    /// Most requests waiting for a free sequence slot; more are answered 503.
    #[arg(long, default_value_t = EngineConfig::DEFAULT.max_queued)]
    pub max_queued: usize,
    /// Require `Authorization: Bearer KEY` on the /v1 routes.
    #[arg(long)]
    pub api_key: Option<String>,
    /// Model id reported by /v1/models and expected in requests (default: the file name).
    #[arg(long)]
    pub alias: Option<String>,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    runit_server::init_logging();
    let loaded = load(&args.model)?;
    let template = ChatTemplate::from_tokenizer(&loaded.tokenizer)?;
    let config = EngineConfig {
        max_sequences: args.parallel,
        max_queued: args.max_queued,
        ..args.model.engine_config()
    };
    let scheduler = Scheduler::start(Arc::clone(&loaded.model), &config)?;
    let model_name = args.alias.clone().unwrap_or_else(|| {
        args.model
            .model
            .file_name()
            .map_or_else(|| "model".into(), |n| n.to_string_lossy().into_owned())
    });
    // Without --n-predict a request may generate up to its share of the cache.
    let default_max_tokens = (scheduler.context_size() / args.parallel.max(1)).max(1);
    let config = ServerConfig {
        model_name,
        api_key: args.api_key.clone(),
        default_max_tokens,
        ..ServerConfig::default()
    };
    let state = Arc::new(AppState::new(
        scheduler,
        Arc::new(loaded.tokenizer),
        template,
        config,
    ));
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(async {
        let listener = runit_server::bind(&args.host, args.port).await?;
        // Returns after Ctrl-C or SIGTERM, once the requests in flight have finished.
        runit_server::serve(listener, state).await?;
        anyhow::Ok(())
    })
}
