//! Hostile and unlucky clients over real sockets, each against short limits and each with a
//! bounded wait: slow, idle and half-sent requests are cut off, stalled bodies answered 408,
//! oversized ones 413 before they are read, a connection flood 503, every error carries an
//! OpenAI-shaped body, and shutdown drains for at most its timeout.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use runit_server::{ConnectionLimits, ServerConfig, Shutdown};
use serde_json::Value;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// A server on a free port, stopped when `stop` is sent or dropped.
struct Running {
    address: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<Result<Shutdown, runit_server::ServerError>>,
    _fixture: Fixture,
}

impl Running {
    /// Asks the server to shut down and waits (at most `within`) for it to return.
    async fn shut_down(mut self, within: Duration) -> Shutdown {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        tokio::time::timeout(within, &mut self.task)
            .await
            .expect("the server stops in time")
            .expect("the task joins")
            .expect("serving succeeds")
    }
}

async fn start(connections: ConnectionLimits, max_body_bytes: usize) -> Option<Running> {
    let config = ServerConfig {
        connections,
        max_body_bytes,
        ..ServerConfig::default()
    };
    let fixture = fixture(SYNTHETIC, scheduler_config(), config)?;
    let listener = runit_server::bind("127.0.0.1", 0).await.expect("bind");
    let address = listener.local_addr().expect("address");
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(runit_server::serve_until(
        listener,
        Arc::clone(&fixture.state),
        async move {
            let _ = stopped.await;
        },
    ));
    Some(Running {
        address,
        stop: Some(stop),
        task,
        _fixture: fixture,
    })
}

fn short_limits() -> ConnectionLimits {
    ConnectionLimits {
        header_timeout: Duration::from_millis(1500),
        body_timeout: Duration::from_millis(1000),
        idle_timeout: Duration::from_millis(1000),
        write_timeout: Duration::from_secs(5),
        max_connections: 64,
        shutdown_timeout: Duration::from_secs(5),
    }
}

/// Connects with a read timeout of `wait`.
fn connect(address: SocketAddr, wait: Duration) -> TcpStream {
    let stream = TcpStream::connect(address).expect("connect");
    stream.set_read_timeout(Some(wait)).expect("read timeout");
    stream
}

/// Reads until the server closes the connection; a reset counts as closed. Panics when the
/// read timeout passes first.
fn read_until_closed(stream: &mut TcpStream) -> Vec<u8> {
    let mut received = Vec::new();
    let mut buffer = [0u8; 4096];
    loop {
        match stream.read(&mut buffer) {
            Ok(0) => return received,
            Ok(n) => received.extend_from_slice(&buffer[..n]),
            Err(error) if error.kind() == std::io::ErrorKind::ConnectionReset => return received,
            Err(error) => panic!("the server did not close the connection: {error}"),
        }
    }
}

/// The status and JSON body of a raw HTTP/1.1 response (not chunked).
fn parse(response: &[u8]) -> (u16, Value) {
    let text = String::from_utf8_lossy(response);
    let (head, body) = text.split_once("\r\n\r\n").expect("a complete response");
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .expect("a status");
    let body = serde_json::from_str(body).unwrap_or_else(|error| panic!("{error}: {text}"));
    (status, body)
}

/// Runs blocking socket code off the runtime.
async fn blocking<T: Send + 'static>(work: impl FnOnce() -> T + Send + 'static) -> T {
    tokio::task::spawn_blocking(work).await.expect("joins")
}

fn assert_openai_error(body: &Value, status: u16) {
    let error = &body["error"];
    assert!(error["message"].is_string(), "{status}: {body}");
    assert!(error["type"].is_string(), "{status}: {body}");
    assert!(error.get("param").is_some(), "{status}: {body}");
    assert!(error.get("code").is_some(), "{status}: {body}");
}

#[tokio::test]
async fn a_client_sending_one_byte_per_second_is_cut_off() {
    let Some(server) = start(short_limits(), 4 << 20).await else {
        return;
    };
    let address = server.address;
    let (received, elapsed) = blocking(move || {
        let stream = connect(address, Duration::from_secs(10));
        let start = Instant::now();
        let mut writer = stream.try_clone().expect("clone");
        let trickle = std::thread::spawn(move || {
            for byte in b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n" {
                if writer.write_all(&[*byte]).is_err() {
                    return;
                }
                std::thread::sleep(Duration::from_secs(1));
            }
        });
        let mut reader = stream;
        let received = read_until_closed(&mut reader);
        let elapsed = start.elapsed();
        let _ = reader.shutdown(std::net::Shutdown::Both);
        let _ = trickle.join();
        (received, elapsed)
    })
    .await;
    assert!(
        received.is_empty(),
        "{}",
        String::from_utf8_lossy(&received)
    );
    assert!(elapsed < Duration::from_secs(6), "{elapsed:?}");
    server.shut_down(Duration::from_secs(10)).await;
}

#[tokio::test]
async fn idle_and_half_sent_connections_are_closed() {
    let Some(server) = start(short_limits(), 4 << 20).await else {
        return;
    };
    let address = server.address;
    let (idle, half_sent) = blocking(move || {
        let mut idle = connect(address, Duration::from_secs(10));
        let mut half_sent = connect(address, Duration::from_secs(10));
        half_sent
            .write_all(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Le")
            .expect("write");
        let start = Instant::now();
        let idle_received = read_until_closed(&mut idle);
        let idle_elapsed = start.elapsed();
        let half_received = read_until_closed(&mut half_sent);
        let half_elapsed = start.elapsed();
        ((idle_received, idle_elapsed), (half_received, half_elapsed))
    })
    .await;
    assert!(idle.0.is_empty());
    assert!(idle.1 < Duration::from_secs(5), "idle for {:?}", idle.1);
    assert!(half_sent.0.is_empty());
    assert!(
        half_sent.1 < Duration::from_secs(5),
        "half-sent for {:?}",
        half_sent.1
    );
    server.shut_down(Duration::from_secs(10)).await;
}

#[tokio::test]
async fn stalled_and_oversized_bodies_are_refused() {
    let Some(server) = start(short_limits(), 1024).await else {
        return;
    };
    let address = server.address;
    let cases: Vec<(&str, Vec<u8>, u16)> = vec![
        (
            "a stalled body",
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"pro".to_vec(),
            408,
        ),
        (
            "a Content-Length of 10^12",
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000000000\r\n\r\n"
                .to_vec(),
            413,
        ),
        (
            "a chunk size of 2^64-1, then nothing",
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nffffffffffffffff\r\n{\"p"
                .to_vec(),
            408,
        ),
        (
            "a chunk size of 2^64-1, then more than the limit",
            [
                &b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nffffffffffffffff\r\n"[..],
                &[b'x'; 4096][..],
            ]
            .concat(),
            413,
        ),
    ];
    for (case, request, expected) in cases {
        let (response, elapsed) = blocking(move || {
            let mut stream = connect(address, Duration::from_secs(10));
            let start = Instant::now();
            stream.write_all(&request).expect("write");
            let response = read_until_closed(&mut stream);
            (response, start.elapsed())
        })
        .await;
        let (status, body) = parse(&response);
        assert_eq!(status, expected, "{case}: {body}");
        assert_openai_error(&body, status);
        assert!(elapsed < Duration::from_secs(5), "{case}: {elapsed:?}");
    }
    server.shut_down(Duration::from_secs(10)).await;
}

#[tokio::test]
async fn connections_beyond_the_limit_get_503_and_the_server_recovers() {
    let limits = ConnectionLimits {
        idle_timeout: Duration::from_secs(30),
        max_connections: 4,
        ..short_limits()
    };
    let Some(server) = start(limits, 4 << 20).await else {
        return;
    };
    let address = server.address;
    blocking(move || {
        let held: Vec<TcpStream> = (0..4)
            .map(|_| connect(address, Duration::from_secs(10)))
            .collect();
        // The held connections are accepted in order; the extra ones find no room.
        for _ in 0..6 {
            let mut extra = connect(address, Duration::from_secs(10));
            let (status, body) = parse(&read_until_closed(&mut extra));
            assert_eq!(status, 503, "{body}");
            assert_eq!(body["error"]["code"], "too_many_connections");
        }
        drop(held);
        // The server notices the closed connections and serves normal clients again.
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let mut stream = connect(address, Duration::from_secs(10));
            stream
                .write_all(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                .expect("write");
            let (status, _) = parse(&read_until_closed(&mut stream));
            if status == 200 {
                break;
            }
            assert_eq!(status, 503);
            assert!(Instant::now() < deadline, "no room after the flood ended");
            std::thread::sleep(Duration::from_millis(50));
        }
    })
    .await;
    server.shut_down(Duration::from_secs(10)).await;
}

#[tokio::test]
async fn shutdown_drains_for_at_most_its_timeout() {
    let limits = ConnectionLimits {
        body_timeout: Duration::from_secs(60),
        shutdown_timeout: Duration::from_millis(800),
        ..short_limits()
    };
    let Some(server) = start(limits, 4 << 20).await else {
        return;
    };
    let address = server.address;
    // A request in flight whose body never ends.
    let mut stalled = blocking(move || {
        let mut stream = connect(address, Duration::from_secs(10));
        stream
            .write_all(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
            .expect("write");
        stream
    })
    .await;
    // The request is in flight once the server answers a request on a later connection.
    let (status, _) = blocking(move || {
        let mut stream = connect(address, Duration::from_secs(10));
        stream
            .write_all(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .expect("write");
        parse(&read_until_closed(&mut stream))
    })
    .await;
    assert_eq!(status, 200);
    let start = Instant::now();
    let outcome = server.shut_down(Duration::from_secs(10)).await;
    assert_eq!(outcome, Shutdown::TimedOut);
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "{:?}",
        start.elapsed()
    );
    blocking(move || read_until_closed(&mut stalled)).await;
}
