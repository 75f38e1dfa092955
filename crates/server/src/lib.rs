//! An OpenAI-compatible HTTP server over the continuous-batching scheduler: `GET /health`,
//! `GET /v1/models` (and `/v1/models/{id}`), `POST /v1/chat/completions`,
//! `POST /v1/completions`, `POST /v1/responses` and `POST /v1/embeddings`, answered as JSON or
//! as server-sent events, and `GET /metrics` in the Prometheus text format. Every request
//! field is honoured or refused by name (`fields`). The server translates requests into
//! engine requests and streams tokens back over channels; it never touches tensors.
//!
//! Clients are not trusted: connections are served under [`ConnectionLimits`] (timeouts for
//! idle, slow and stalled clients, a cap on open connections), bodies under a size limit,
//! and chat templates off the async runtime under [`TemplateLimits`].
//!
//! Where each request field goes: `fields` lists every field of OpenAI's chat-completions,
//! completions and Responses requests with what is done with it (read and checked where
//! parsed, refused when it asks for what is not done: `store: true`, `best_of` other than
//! `n`, `echo` with `logprobs`, ...; an unknown field is a 400 too); extras as llama.cpp's
//! server and vLLM read them: `top_k`, `min_p`, `repetition_penalty`, `ignore_eos`,
//! `grammar`, `chat_template_kwargs`. `infill` lays a `suffix` out with the model's FIM
//! tokens. `structured` reads `logit_bias`, `response_format` and `grammar` and compiles the
//! grammar before anything is submitted (a schema that does not compile is a 400). `tools`
//! reads `tools`, `tool_choice` and `parallel_tool_calls`, passes the tools to the model's
//! own template (a template that takes no tools is a 400), forces a call by grammar for
//! `required` or a named function, and scans calls (Hermes/Qwen `<tool_call>`, Llama 3
//! JSON, Mistral `[TOOL_CALLS]`) out of each choice's text as it grows: a call's name goes
//! out once complete, then its arguments piece by piece. `reasoning` moves `<think>` blocks
//! into `reasoning_content`; `prediction` seeds the scheduler's prompt lookup. Log
//! probabilities (`logprobs`, `top_logprobs`) are those of the model's raw logits, before
//! `logit_bias` and grammar masks are applied (vLLM's default), so a token a grammar forced
//! may show a low log-probability. `embeddings` serves `/v1/embeddings` from a session of its
//! own (made at the first request, one request at a time, at most 8192 tokens).
//! `/v1/models` lists every `--alias` and the file's name; each is accepted in requests.
//!
//! `responses` serves `/v1/responses` through the chat path: `instructions` is a system
//! message first; `input` is a string (a user message) or items: messages (roles user,
//! system, developer, assistant; `input_text`/`output_text` parts; an image, file or audio
//! part is a 400), `function_call` items (the assistant's `tool_calls`) and
//! `function_call_output` items (`tool` messages); reasoning items and item references are
//! 400s. `max_output_tokens`, `temperature`, `top_p`, `parallel_tool_calls` and `user` /
//! `safety_identifier` are read as on chat; `tools` are flat functions (`{type: "function",
//! name, description, parameters, strict}`; web search, file search, computer use and every
//! other tool type are 400s by `tools[i].type`), `tool_choice` is none, auto, required or
//! `{type: "function", name}`; `text.format` is chat's `response_format` (`text`,
//! `json_object`, `json_schema` with its fields beside `type`; `text.verbosity` is a 400);
//! `include` may ask only for `message.output_text.logprobs`, which `top_logprobs` above 0
//! also turns on; `metadata` (16 string pairs) and `max_tool_calls` (it limits built-in
//! tools, which are never offered) are echoed. Nothing is stored: `store: true`,
//! `background: true`, `previous_response_id`, `conversation` and `prompt` are 400s, as are
//! `reasoning` (effort and summaries cannot be honoured), `truncation: auto` (input is never
//! cut), `stream_options.include_obfuscation: true`, and the cache, moderation, image and
//! access-program options. The answer is a `response` object (`completed`, or `incomplete`
//! with `incomplete_details.reason: max_output_tokens`) whose `output` holds a `reasoning`
//! item for `<think>` text, a `message` item with one `output_text` part, and a
//! `function_call` item per call; `usage` counts input, output and reasoning tokens
//! (`input_tokens_details.cached_tokens`: the prompt tokens the prefix cache served; chat and
//! completions report them as `usage.prompt_tokens_details.cached_tokens`).
//! Streamed, the same response is built by OpenAI's events (`response.created`,
//! `response.in_progress`, `response.output_item.added`, `response.content_part.added`,
//! `response.output_text.delta`, `response.reasoning_text.delta`,
//! `response.function_call_arguments.delta`, their `.done` events,
//! `response.output_item.done`, then `response.completed` or `response.incomplete`; an
//! `error` event if the sequence fails), each numbered by `sequence_number`.
//!
//! ```no_run
//! # async fn demo(state: std::sync::Arc<runit_server::AppState>) -> Result<(), runit_server::ServerError> {
//! let listener = runit_server::bind("127.0.0.1", 8080).await?;
//! runit_server::serve(listener, state).await?;
//! # Ok(()) }
//! ```

mod accepted;
mod body;
mod choice;
mod connection;
mod embeddings;
mod error;
mod fields;
mod handlers;
mod infill;
mod limits;
mod log;
mod messages;
mod metrics;
mod prediction;
mod reasoning;
mod request;
mod response;
mod responses;
mod structured;
mod submit;
mod template;
mod timed;
mod tools;

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use axum::extract::DefaultBodyLimit;
use axum::routing::{get, post};
use axum::Router;
use runit_engine::constraint::{ConstraintError, GrammarCompiler};
use runit_engine::scheduler::Scheduler;
use runit_engine::speculative::{DraftModelPool, DraftParams};
use runit_model::Model;
use runit_tokenizer::{ChatTemplate, Tokenizer};
use tokio::sync::Semaphore;

use embeddings::Embedder;

pub use connection::Shutdown;
pub use error::{ApiError, ServerError};
pub use limits::{ConnectionLimits, TemplateLimits};
pub use log::{init_logging, LogFormat};
pub use runit_engine::stop::{StopCheck, StopMatcher};

/// Server settings; see `impl Default` for the defaults.
#[derive(Debug, Clone, PartialEq)]
pub struct ServerConfig {
    /// The model id answers carry (the first `--alias`, or the file's name).
    pub model_name: String,
    /// Other ids a request may name (further `--alias` values, the file's name);
    /// `/v1/models` lists them after `model_name`.
    pub aliases: Vec<String>,
    /// Bearer token required on `/v1` routes (`--api-key`, `--api-key-file` or
    /// `RUNIT_API_KEY`); `None` lets everyone in. With a key, `/health` shows only its status
    /// to a client without it.
    pub api_key: Option<String>,
    /// Largest accepted request body.
    pub max_body_bytes: usize,
    /// Tokens generated when a request sets no `max_tokens` (capped at the room left in the
    /// context).
    pub default_max_tokens: usize,
    /// Timeouts and the cap on open connections.
    pub connections: ConnectionLimits,
    /// How chat templates are rendered (the template's own render limits are set on it).
    pub template: TemplateLimits,
    /// Speculative decoding of every sequence by prompt lookup (`--draft-ngram N` and the
    /// draft settings); `None`: a sequence speculates only when its request gives a
    /// `prediction`, then with [`PREDICTION_NGRAM`] and the default settings.
    pub speculation: Option<(usize, DraftParams)>,
    /// Drafts by this draft model (`-md FILE`) for every sequence whose request gives no
    /// `prediction` (with `speculation`'s settings, which must then be set).
    pub draft_model: Option<DraftModelPool>,
}

/// Tokens prompt lookup matches for a request's `prediction` when the server was started
/// without `--draft-ngram`.
pub const PREDICTION_NGRAM: usize = 3;

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            model_name: "runit".into(),
            aliases: Vec::new(),
            api_key: None,
            max_body_bytes: 4 << 20,
            default_max_tokens: 1024,
            connections: ConnectionLimits::DEFAULT,
            template: TemplateLimits::DEFAULT,
            speculation: None,
            draft_model: None,
        }
    }
}

/// What every handler shares.
pub struct AppState {
    pub scheduler: Scheduler,
    pub tokenizer: Arc<Tokenizer>,
    pub template: ChatTemplate,
    pub config: ServerConfig,
    /// When the server started (Unix seconds).
    pub created: u64,
    next_id: AtomicU64,
    /// One permit per template rendering allowed at once.
    renders: Arc<Semaphore>,
    /// Compiles the grammars of structured output for the model's vocabulary (or says why
    /// the vocabulary cannot have them).
    grammars: Result<GrammarCompiler, ConstraintError>,
    /// Runs `/v1/embeddings`, when the server offers it ([`AppState::with_embeddings`]).
    embedder: Option<Embedder>,
}

impl ServerConfig {
    /// Every id of the served model: `model_name`, then the aliases not equal to it.
    pub fn model_ids(&self) -> Vec<&str> {
        let mut ids = vec![self.model_name.as_str()];
        for alias in &self.aliases {
            if !ids.contains(&alias.as_str()) {
                ids.push(alias);
            }
        }
        ids
    }
}

impl AppState {
    /// Shared state over a started scheduler; the template renders under the render limits
    /// of `config.template`.
    pub fn new(
        scheduler: Scheduler,
        tokenizer: Arc<Tokenizer>,
        mut template: ChatTemplate,
        config: ServerConfig,
    ) -> AppState {
        template.set_limits(config.template.render);
        let renders = Arc::new(Semaphore::new(config.template.workers.max(1)));
        let grammars = GrammarCompiler::new(Arc::clone(&tokenizer), &tokenizer.eog_ids());
        AppState {
            scheduler,
            tokenizer,
            template,
            config,
            created: unix_time(),
            next_id: AtomicU64::new(0),
            renders,
            grammars,
            embedder: None,
        }
    }

    /// Offers `/v1/embeddings` over `model` (the scheduler's), in a session of its own that
    /// holds `context_size` tokens (at most 8192), made at the first request.
    pub fn with_embeddings(mut self, model: Arc<Model>, context_size: usize) -> AppState {
        self.embedder = Some(Embedder::new(model, context_size));
        self
    }

    /// A fresh response id (`chatcmpl-…`, `cmpl-…`, `resp_…`), unique for this server.
    fn next_request_id(&self, endpoint: response::Endpoint) -> String {
        let serial = self.next_id.fetch_add(1, Ordering::Relaxed);
        let prefix = match endpoint {
            response::Endpoint::Chat => "chatcmpl-",
            response::Endpoint::Completion => "cmpl-",
            response::Endpoint::Responses => "resp_",
        };
        format!("{prefix}{:x}{serial:06x}", self.created)
    }
}

/// `GET /`: the chat page (one embedded file: it streams from `/v1/chat/completions`, shows
/// the model's name and context from `/v1/models`, and keeps the conversation in the
/// browser's localStorage).
async fn chat_page() -> axum::response::Html<&'static str> {
    axum::response::Html(include_str!("../web/index.html"))
}

/// The routes, with the body limits, the API-key check and error bodies on every error.
pub fn router(state: Arc<AppState>) -> Router {
    let api = Router::new()
        .route("/v1/models", get(handlers::models))
        .route("/v1/models/{id}", get(handlers::model))
        .route("/v1/chat/completions", post(handlers::chat))
        .route("/v1/completions", post(handlers::completions))
        .route("/v1/responses", post(responses::responses))
        .route("/v1/embeddings", post(embeddings::embeddings))
        .route("/metrics", get(metrics::metrics))
        .route_layer(axum::middleware::from_fn_with_state(
            Arc::clone(&state),
            handlers::require_api_key,
        ));
    Router::new()
        .route("/", get(chat_page))
        .route("/health", get(handlers::health))
        .merge(api)
        .fallback(handlers::not_found)
        .layer(DefaultBodyLimit::max(state.config.max_body_bytes))
        .layer(axum::middleware::from_fn_with_state(
            Arc::clone(&state),
            body::read_body,
        ))
        .layer(axum::middleware::from_fn(body::error_bodies))
        .with_state(state)
}

/// Listens on `host:port`.
pub async fn bind(host: &str, port: u16) -> Result<tokio::net::TcpListener, ServerError> {
    let address = format!("{host}:{port}");
    tokio::net::TcpListener::bind(&address)
        .await
        .map_err(|source| ServerError::Bind { address, source })
}

/// Serves requests on `listener` until Ctrl-C or SIGTERM, then finishes the requests in
/// flight for at most the shutdown timeout; a second signal stops at once.
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: Arc<AppState>,
) -> Result<Shutdown, ServerError> {
    let (first, first_received) = tokio::sync::oneshot::channel::<()>();
    let (second, second_received) = tokio::sync::oneshot::channel::<()>();
    let signals = tokio::spawn(async move {
        let mut signals = Signals::new();
        signals.next().await;
        let _ = first.send(());
        signals.next().await;
        tracing::info!("second signal; stopping now");
        let _ = second.send(());
    });
    let outcome = serve_with(
        listener,
        state,
        async move {
            let _ = first_received.await;
        },
        async move {
            if second_received.await.is_err() {
                std::future::pending::<()>().await;
            }
        },
    )
    .await;
    signals.abort();
    outcome
}

/// Serves requests on `listener` until `shutdown` completes, then finishes the requests in
/// flight for at most the shutdown timeout.
pub async fn serve_until(
    listener: tokio::net::TcpListener,
    state: Arc<AppState>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<Shutdown, ServerError> {
    serve_with(listener, state, shutdown, std::future::pending()).await
}

/// Serves until `shutdown`, then drains until the shutdown timeout or `force`.
async fn serve_with(
    listener: tokio::net::TcpListener,
    state: Arc<AppState>,
    shutdown: impl Future<Output = ()>,
    force: impl Future<Output = ()>,
) -> Result<Shutdown, ServerError> {
    match listener.local_addr() {
        Ok(address) => tracing::info!(
            "listening on http://{address} (model `{}`, {} cells)",
            state.config.model_name,
            state.scheduler.context_size()
        ),
        Err(error) => tracing::warn!(%error, "listening on an unknown address"),
    }
    let limits = state.config.connections;
    let outcome = connection::serve(listener, router(state), limits, shutdown, force).await;
    match outcome {
        Shutdown::Drained => tracing::info!("server stopped"),
        Shutdown::TimedOut => tracing::warn!(
            "server stopped; requests still in flight after {} s were dropped",
            limits.shutdown_timeout.as_secs_f64()
        ),
        Shutdown::Forced => tracing::warn!("server stopped at once; requests were dropped"),
    }
    Ok(outcome)
}

/// Ctrl-C (SIGINT) and, on Unix, SIGTERM, as one stream of shutdown requests.
struct Signals {
    #[cfg(unix)]
    interrupt: Option<tokio::signal::unix::Signal>,
    #[cfg(unix)]
    terminate: Option<tokio::signal::unix::Signal>,
}

impl Signals {
    fn new() -> Signals {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{signal, SignalKind};
            let listen = |kind: SignalKind, name: &str| match signal(kind) {
                Ok(stream) => Some(stream),
                Err(error) => {
                    tracing::warn!(%error, "cannot listen for {name}");
                    None
                }
            };
            Signals {
                interrupt: listen(SignalKind::interrupt(), "SIGINT"),
                terminate: listen(SignalKind::terminate(), "SIGTERM"),
            }
        }
        #[cfg(not(unix))]
        Signals {}
    }

    /// Completes at the next signal.
    async fn next(&mut self) {
        #[cfg(unix)]
        {
            async fn receive(stream: &mut Option<tokio::signal::unix::Signal>) {
                match stream {
                    Some(stream) => {
                        stream.recv().await;
                    }
                    None => std::future::pending().await,
                }
            }
            tokio::select! {
                () = receive(&mut self.interrupt) => tracing::info!("interrupted; shutting down"),
                () = receive(&mut self.terminate) => tracing::info!("terminated; shutting down"),
            }
        }
        #[cfg(not(unix))]
        {
            if let Err(error) = tokio::signal::ctrl_c().await {
                tracing::warn!(%error, "cannot listen for Ctrl-C");
                std::future::pending::<()>().await;
            }
            tracing::info!("interrupted; shutting down");
        }
    }
}

/// Seconds since the Unix epoch.
fn unix_time() -> u64 {
    use std::time::{SystemTime, UNIX_EPOCH};
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}
