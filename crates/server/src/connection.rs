//! Serving connections under [`ConnectionLimits`]: the accept loop (with a cap on open
//! connections, answering 503 beyond it), one HTTP/1.1 connection per task with hyper, the
//! timeouts of idle and slow clients, and the graceful shutdown that drains for at most the
//! shutdown timeout.
//!
//! The read and write timeouts live in [`TimedStream`], the socket under hyper; the service
//! here tells it, through the connection's [`Activity`], when a request is being answered.

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::response::Response;
use axum::Router;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tower::ServiceExt;

use crate::error::ApiError;
use crate::limits::ConnectionLimits;
use crate::timed::{Activity, InFlight, TimedStream};

/// How serving ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shutdown {
    /// Every request in flight finished.
    Drained,
    /// The shutdown timeout passed with requests still in flight; they were dropped.
    TimedOut,
    /// A second signal asked to stop at once; the requests in flight were dropped.
    Forced,
}

/// Most over-limit connections being answered 503 at once; beyond them a connection is
/// closed without an answer.
const REJECTING_AT_ONCE: usize = 64;
/// How long answering an over-limit connection may take.
const REJECT_TIMEOUT: Duration = Duration::from_secs(1);

/// Accepts and serves connections until `shutdown` completes, then drains them for at most
/// the shutdown timeout, or until `force` completes.
pub(crate) async fn serve(
    listener: TcpListener,
    router: Router,
    limits: ConnectionLimits,
    shutdown: impl Future<Output = ()>,
    force: impl Future<Output = ()>,
) -> Shutdown {
    let connection_permits = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let rejection_permits = Arc::new(Semaphore::new(REJECTING_AT_ONCE));
    let rejection = Arc::new(over_limit_response());
    let graceful = GracefulShutdown::new();
    let mut connections = JoinSet::new();
    let mut builder = hyper::server::conn::http1::Builder::new();
    // Timeouts are [`TimedStream`]'s; hyper's own header timeout needs a timer, left unset.
    builder.keep_alive(true);
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            () = &mut shutdown => break,
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
            accepted = listener.accept() => {
                let stream = match accepted {
                    Ok((stream, _)) => stream,
                    Err(error) => {
                        accept_failed(error).await;
                        continue;
                    }
                };
                let Ok(permit) = Arc::clone(&connection_permits).try_acquire_owned() else {
                    reject(stream, &rejection_permits, &rejection);
                    continue;
                };
                let activity = Arc::new(Activity::default());
                let io = TokioIo::new(TimedStream::new(stream, limits, Arc::clone(&activity)));
                let service = ConnectionService {
                    router: router.clone(),
                    activity,
                };
                let connection = graceful.watch(builder.serve_connection(io, service));
                connections.spawn(async move {
                    if let Err(error) = connection.await {
                        tracing::debug!(%error, "connection ended with an error");
                    }
                    drop(permit);
                });
            }
        }
    }
    drop(listener);
    tracing::info!(
        connections = connections.len(),
        "draining for at most {} s",
        limits.shutdown_timeout.as_secs_f64()
    );
    let outcome = tokio::select! {
        () = graceful.shutdown() => Shutdown::Drained,
        () = tokio::time::sleep(limits.shutdown_timeout) => Shutdown::TimedOut,
        () = force => Shutdown::Forced,
    };
    connections.abort_all();
    outcome
}

/// A failed `accept`: a connection that went away before it was taken is nothing; running out
/// of descriptors or memory waits a little for connections to close.
async fn accept_failed(error: io::Error) {
    use io::ErrorKind;
    if matches!(
        error.kind(),
        ErrorKind::ConnectionAborted | ErrorKind::ConnectionReset | ErrorKind::Interrupted
    ) {
        return;
    }
    tracing::warn!(%error, "accepting a connection failed; retrying in 100 ms");
    tokio::time::sleep(Duration::from_millis(100)).await;
}

/// The raw answer to a connection beyond the limit.
fn over_limit_response() -> Vec<u8> {
    let error = ApiError::service_unavailable(
        "too many connections are open; try again later",
        "too_many_connections",
    );
    let body = error.body().to_string();
    format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n\
         content-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// Answers an over-limit connection 503 and closes it, without waiting for its request.
fn reject(mut stream: TcpStream, permits: &Arc<Semaphore>, response: &Arc<Vec<u8>>) {
    let Ok(permit) = Arc::clone(permits).try_acquire_owned() else {
        tracing::warn!("too many connections; closing one unanswered");
        return;
    };
    let response = Arc::clone(response);
    tokio::spawn(async move {
        let answer = async {
            stream.write_all(&response).await?;
            stream.shutdown().await?;
            // Reading what the client sent before closing keeps the kernel from resetting
            // the connection over unread data, which could discard the answer.
            let mut sink = [0u8; 4096];
            while stream.read(&mut sink).await? > 0 {}
            io::Result::Ok(())
        };
        let _ = tokio::time::timeout(REJECT_TIMEOUT, answer).await;
        drop(permit);
    });
}

/// The router as one connection's hyper service, counting its requests in flight until
/// their response bodies are done.
#[derive(Clone)]
struct ConnectionService {
    router: Router,
    activity: Arc<Activity>,
}

impl hyper::service::Service<hyper::Request<Incoming>> for ConnectionService {
    type Response = Response;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response, Infallible>> + Send>>;

    fn call(&self, request: hyper::Request<Incoming>) -> Self::Future {
        let in_flight = InFlight::start(&self.activity);
        let router = self.router.clone();
        Box::pin(async move {
            let response = router.oneshot(request.map(Body::new)).await?;
            // The body keeps the request counted until hyper has sent it and drops it.
            Ok(response.map(move |body| {
                Body::new(body.map_frame(move |frame| {
                    let _ = &in_flight;
                    frame
                }))
            }))
        })
    }
}
