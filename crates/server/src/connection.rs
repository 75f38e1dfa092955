//! Serving connections under [`ConnectionLimits`]: the accept loop (with a cap on open
//! connections, answering 503 beyond it), one HTTP/1.1 connection per task with hyper, the
//! timeouts of idle and slow clients, and the graceful shutdown that drains for at most the
//! shutdown timeout.
//!
//! The read and write timeouts live in [`TimedStream`], the socket under hyper. It knows
//! whether a request is being answered from the connection's [`Activity`], which the service
//! counts up when a request arrives and down when its response has been sent:
//!
//! * no request in flight and no byte of the next one: the idle timeout runs;
//! * a first byte arrived: the rest of the headers must come within the header timeout;
//! * a request in flight: reads are not timed here (the body timeout is checked where the
//!   body is read, [`crate::body`]); a write that cannot progress for the write timeout
//!   fails, which drops the connection and cancels its generation.

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use axum::response::Response;
use axum::Router;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio::time::{Instant, Sleep};
use tower::ServiceExt;

use crate::error::ApiError;
use crate::limits::ConnectionLimits;

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
                // Small writes (server-sent events) go out at once.
                let _ = stream.set_nodelay(true);
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

/// Requests of one connection whose response has not been sent yet.
#[derive(Debug, Default)]
pub(crate) struct Activity {
    in_flight: AtomicUsize,
}

impl Activity {
    fn is_busy(&self) -> bool {
        self.in_flight.load(Ordering::Acquire) > 0
    }
}

/// Counts a request as in flight while it lives.
struct InFlight(Arc<Activity>);

impl InFlight {
    fn start(activity: &Arc<Activity>) -> InFlight {
        activity.in_flight.fetch_add(1, Ordering::AcqRel);
        InFlight(Arc::clone(activity))
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
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

/// Where a connection is between requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Waiting for the first byte of a request.
    Idle,
    /// A request's headers are arriving.
    Headers,
    /// A request is being answered.
    Busy,
}

/// A socket that times out idle waits, slow headers and stalled writes.
pub(crate) struct TimedStream {
    stream: TcpStream,
    limits: ConnectionLimits,
    activity: Arc<Activity>,
    phase: Phase,
    read_deadline: Pin<Box<Sleep>>,
    write_deadline: Pin<Box<Sleep>>,
    /// Whether a write is waiting (and `write_deadline` runs).
    write_waiting: bool,
}

impl TimedStream {
    fn new(stream: TcpStream, limits: ConnectionLimits, activity: Arc<Activity>) -> TimedStream {
        let now = Instant::now();
        TimedStream {
            stream,
            limits,
            activity,
            phase: Phase::Idle,
            read_deadline: Box::pin(tokio::time::sleep_until(now + limits.idle_timeout)),
            write_deadline: Box::pin(tokio::time::sleep_until(now + limits.write_timeout)),
            write_waiting: false,
        }
    }

    /// A write that cannot progress: fails once it has waited for the write timeout.
    fn poll_write_stalled<T>(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<T>> {
        if !self.write_waiting {
            self.write_waiting = true;
            let deadline = Instant::now() + self.limits.write_timeout;
            self.write_deadline.as_mut().reset(deadline);
        }
        match self.write_deadline.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(timed_out(
                "the client did not read the response within the write timeout",
            ))),
            Poll::Pending => Poll::Pending,
        }
    }
}

fn timed_out(message: &'static str) -> io::Error {
    io::Error::new(io::ErrorKind::TimedOut, message)
}

impl AsyncRead for TimedStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buffer: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.activity.is_busy() {
            this.phase = Phase::Busy;
            return Pin::new(&mut this.stream).poll_read(cx, buffer);
        }
        if this.phase == Phase::Busy {
            this.phase = Phase::Idle;
            let deadline = Instant::now() + this.limits.idle_timeout;
            this.read_deadline.as_mut().reset(deadline);
        }
        let before = buffer.filled().len();
        match Pin::new(&mut this.stream).poll_read(cx, buffer) {
            Poll::Ready(Ok(())) => {
                if this.phase == Phase::Idle && buffer.filled().len() > before {
                    this.phase = Phase::Headers;
                    let deadline = Instant::now() + this.limits.header_timeout;
                    this.read_deadline.as_mut().reset(deadline);
                }
                Poll::Ready(Ok(()))
            }
            Poll::Pending => match this.read_deadline.as_mut().poll(cx) {
                Poll::Ready(()) => Poll::Ready(Err(timed_out(match this.phase {
                    Phase::Headers => "the request headers did not arrive within the timeout",
                    _ => "the connection stayed idle past the idle timeout",
                }))),
                Poll::Pending => Poll::Pending,
            },
            failed => failed,
        }
    }
}

impl AsyncWrite for TimedStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buffer: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        match Pin::new(&mut this.stream).poll_write(cx, buffer) {
            Poll::Pending => this.poll_write_stalled(cx),
            done => {
                this.write_waiting = false;
                done
            }
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buffers: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        match Pin::new(&mut this.stream).poll_write_vectored(cx, buffers) {
            Poll::Pending => this.poll_write_stalled(cx),
            done => {
                this.write_waiting = false;
                done
            }
        }
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
    }
}
