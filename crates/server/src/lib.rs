//! An OpenAI-compatible HTTP server over the continuous-batching scheduler: `GET /health`,
//! `GET /v1/models`, `POST /v1/chat/completions` and `POST /v1/completions`, answered as JSON
//! or as server-sent events. The server translates requests into engine requests and streams
//! tokens back over channels; it never touches tensors.
//!
//! ```no_run
//! # async fn demo(state: std::sync::Arc<runit_server::AppState>) -> Result<(), runit_server::ServerError> {
//! let listener = runit_server::bind("127.0.0.1", 8080).await?;
//! runit_server::serve(listener, state).await?;
//! # Ok(()) }
//! ```

mod choice;
mod error;
mod handlers;
mod log;
mod request;
mod response;

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use axum::extract::DefaultBodyLimit;
use axum::routing::{get, post};
use axum::Router;
use runit_engine::scheduler::Scheduler;
use runit_tokenizer::{ChatTemplate, Tokenizer};

pub use error::{ApiError, ServerError};
pub use log::init_logging;
pub use runit_engine::stop::{StopCheck, StopMatcher};

/// Server settings; see `impl Default` for the defaults.
#[derive(Debug, Clone, PartialEq)]
pub struct ServerConfig {
    /// The model id clients name (`--alias`, or the file's name).
    pub model_name: String,
    /// Bearer token required on `/v1` routes (`--api-key`); `None` lets everyone in.
    pub api_key: Option<String>,
    /// Largest accepted request body.
    pub max_body_bytes: usize,
    /// Tokens generated when a request sets no `max_tokens` (capped at the room left in the
    /// context).
    pub default_max_tokens: usize,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            model_name: "runit".into(),
            api_key: None,
            max_body_bytes: 4 << 20,
            default_max_tokens: 1024,
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
}

impl AppState {
    /// Shared state over a started scheduler.
    pub fn new(
        scheduler: Scheduler,
        tokenizer: Arc<Tokenizer>,
        template: ChatTemplate,
        config: ServerConfig,
    ) -> AppState {
        AppState {
            scheduler,
            tokenizer,
            template,
            config,
            created: unix_time(),
            next_id: AtomicU64::new(0),
        }
    }

    /// A fresh response id (`chatcmpl-…`, `cmpl-…`), unique for this server.
    fn next_request_id(&self, endpoint: response::Endpoint) -> String {
        let serial = self.next_id.fetch_add(1, Ordering::Relaxed);
        let prefix = match endpoint {
            response::Endpoint::Chat => "chatcmpl",
            response::Endpoint::Completion => "cmpl",
        };
        format!("{prefix}-{:x}{serial:06x}", self.created)
    }
}

/// The routes, with the body limit and the API-key check.
pub fn router(state: Arc<AppState>) -> Router {
    let api = Router::new()
        .route("/v1/models", get(handlers::models))
        .route("/v1/chat/completions", post(handlers::chat))
        .route("/v1/completions", post(handlers::completions))
        .route_layer(axum::middleware::from_fn_with_state(
            Arc::clone(&state),
            handlers::require_api_key,
        ));
    Router::new()
        .route("/health", get(handlers::health))
        .merge(api)
        .fallback(handlers::not_found)
        .layer(DefaultBodyLimit::max(state.config.max_body_bytes))
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
/// flight and returns.
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: Arc<AppState>,
) -> Result<(), ServerError> {
    serve_until(listener, state, shutdown_signal()).await
}

/// Serves requests on `listener` until `shutdown` completes, then finishes the requests in
/// flight and returns.
pub async fn serve_until(
    listener: tokio::net::TcpListener,
    state: Arc<AppState>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServerError> {
    match listener.local_addr() {
        Ok(address) => tracing::info!(
            "listening on http://{address} (model `{}`, {} cells)",
            state.config.model_name,
            state.scheduler.context_size()
        ),
        Err(error) => tracing::warn!(%error, "listening on an unknown address"),
    }
    axum::serve(listener, router(state))
        .with_graceful_shutdown(shutdown)
        .await
        .map_err(ServerError::Serve)?;
    tracing::info!("server stopped");
    Ok(())
}

/// Completes on Ctrl-C (SIGINT) or, on Unix, SIGTERM.
pub async fn shutdown_signal() {
    let interrupt = async {
        if let Err(error) = tokio::signal::ctrl_c().await {
            tracing::warn!(%error, "cannot listen for Ctrl-C");
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let terminate = async {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut stream) => {
                stream.recv().await;
            }
            Err(error) => {
                tracing::warn!(%error, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = interrupt => tracing::info!("interrupted; shutting down"),
        () = terminate => tracing::info!("terminated; shutting down"),
    }
}

/// Seconds since the Unix epoch.
fn unix_time() -> u64 {
    use std::time::{SystemTime, UNIX_EPOCH};
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}
