//! [`TimedStream`], the socket under hyper, with the connection timeouts. It knows whether a
//! request is being answered from the connection's [`Activity`], which the service counts up
//! when a request arrives and down when its response has been sent:
//!
//! * no request in flight and no byte of the next one: the idle timeout runs;
//! * a first byte arrived: the rest of the headers must come within the header timeout;
//! * a request in flight: reads are not timed here (the body timeout is checked where the
//!   body is read, `crate::body`).
//!
//! A write that cannot progress for the write timeout fails, whatever the phase; hyper then
//! drops the connection, which cancels its generation.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};

use crate::limits::ConnectionLimits;

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
pub(crate) struct InFlight(Arc<Activity>);

impl InFlight {
    pub(crate) fn start(activity: &Arc<Activity>) -> InFlight {
        activity.in_flight.fetch_add(1, Ordering::AcqRel);
        InFlight(Arc::clone(activity))
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::AcqRel);
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
pub(crate) struct TimedStream<S> {
    stream: S,
    limits: ConnectionLimits,
    activity: Arc<Activity>,
    phase: Phase,
    read_deadline: Pin<Box<Sleep>>,
    write_deadline: Pin<Box<Sleep>>,
    /// Whether a write is waiting (and `write_deadline` runs).
    write_waiting: bool,
}

impl<S> TimedStream<S> {
    pub(crate) fn new(
        stream: S,
        limits: ConnectionLimits,
        activity: Arc<Activity>,
    ) -> TimedStream<S> {
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

impl<S: AsyncRead + Unpin> AsyncRead for TimedStream<S> {
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

impl<S: AsyncWrite + Unpin> AsyncWrite for TimedStream<S> {
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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    fn limits() -> ConnectionLimits {
        ConnectionLimits {
            header_timeout: Duration::from_millis(300),
            idle_timeout: Duration::from_millis(100),
            write_timeout: Duration::from_millis(100),
            ..ConnectionLimits::DEFAULT
        }
    }

    /// Runs `future` and returns its output with the time it took.
    async fn timed<T>(future: impl Future<Output = T>) -> (T, Duration) {
        let start = std::time::Instant::now();
        let output = future.await;
        (output, start.elapsed())
    }

    #[tokio::test]
    async fn an_idle_connection_times_out() {
        let (server, _client) = tokio::io::duplex(64);
        let mut stream = TimedStream::new(server, limits(), Arc::default());
        let (result, elapsed) = timed(stream.read(&mut [0u8; 16])).await;
        let error = result.expect_err("times out");
        assert_eq!(error.kind(), io::ErrorKind::TimedOut);
        assert!(error.to_string().contains("idle"), "{error}");
        assert!(elapsed >= Duration::from_millis(100), "{elapsed:?}");
        assert!(elapsed < Duration::from_secs(5), "{elapsed:?}");
    }

    #[tokio::test]
    async fn headers_must_arrive_within_their_timeout() {
        let (server, mut client) = tokio::io::duplex(64);
        let mut stream = TimedStream::new(server, limits(), Arc::default());
        client.write_all(b"G").await.expect("write");
        let mut buffer = [0u8; 16];
        assert_eq!(stream.read(&mut buffer).await.expect("a byte"), 1);
        // The header timeout (300 ms), not the idle one (100 ms), now runs.
        let (result, elapsed) = timed(stream.read(&mut buffer)).await;
        let error = result.expect_err("times out");
        assert!(error.to_string().contains("headers"), "{error}");
        assert!(elapsed >= Duration::from_millis(250), "{elapsed:?}");
        assert!(elapsed < Duration::from_secs(5), "{elapsed:?}");
    }

    #[tokio::test]
    async fn reads_are_not_timed_while_a_request_is_answered() {
        let (server, mut client) = tokio::io::duplex(64);
        let activity = Arc::new(Activity::default());
        let mut stream = TimedStream::new(server, limits(), Arc::clone(&activity));
        let in_flight = InFlight::start(&activity);
        let mut buffer = [0u8; 16];
        let waited = tokio::time::timeout(Duration::from_millis(400), stream.read(&mut buffer));
        assert!(waited.await.is_err(), "the read must still be waiting");
        drop(in_flight);
        client.write_all(b"x").await.expect("write");
        assert_eq!(stream.read(&mut buffer).await.expect("the byte"), 1);
    }

    #[tokio::test]
    async fn a_write_to_a_client_that_does_not_read_times_out() {
        let (server, _client) = tokio::io::duplex(64);
        let mut stream = TimedStream::new(server, limits(), Arc::default());
        let (result, elapsed) = timed(stream.write_all(&[0u8; 4096])).await;
        let error = result.expect_err("times out");
        assert_eq!(error.kind(), io::ErrorKind::TimedOut);
        assert!(elapsed >= Duration::from_millis(100), "{elapsed:?}");
        assert!(elapsed < Duration::from_secs(5), "{elapsed:?}");
    }
}
