//! What the `runit serve` process tests share: starting the binary on a free port, and
//! one HTTP/1.1 request per connection over a raw socket.

// Each test binary uses a part of this module.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

pub fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

pub fn synthetic_model() -> Option<PathBuf> {
    let path = workspace().join("models/synth-qwen2-Q8_0.gguf");
    present(path)
}

pub fn smollm2_model() -> Option<PathBuf> {
    present(workspace().join("models/SmolLM2-135M-Instruct.Q4_1.gguf"))
}

fn present(path: PathBuf) -> Option<PathBuf> {
    if path.exists() {
        Some(path)
    } else {
        eprintln!("skipping: {} is absent", path.display());
        None
    }
}

/// A `runit serve` child process, killed on drop.
pub struct Server {
    child: Child,
    pub port: u16,
}

impl Server {
    /// Starts the server on a free port and waits until `/health` answers.
    pub fn start(model: &Path, extra: &[&str]) -> Server {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|listener| listener.local_addr())
            .expect("a free port")
            .port();
        let child = Command::new(env!("CARGO_BIN_EXE_runit"))
            .arg("serve")
            .arg("--model")
            .arg(model)
            .args(["--port", &port.to_string(), "--threads", "1"])
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("runit starts");
        let mut server = Server { child, port };
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            if let Some(status) = server.child.try_wait().expect("poll the child") {
                panic!("runit serve exited early with {status}");
            }
            if let Ok((200, _)) = server.request("GET", "/health", "") {
                return server;
            }
            assert!(Instant::now() < deadline, "runit serve did not come up");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    pub fn base_url(&self) -> String {
        format!("http://127.0.0.1:{}/v1", self.port)
    }

    /// One request over a fresh connection: the status and the (de-chunked) body.
    pub fn request(&self, method: &str, path: &str, body: &str) -> std::io::Result<(u16, Vec<u8>)> {
        self.raw(method, path, body.as_bytes())
    }

    pub fn raw(&self, method: &str, path: &str, body: &[u8]) -> std::io::Result<(u16, Vec<u8>)> {
        let mut stream = TcpStream::connect(("127.0.0.1", self.port))?;
        stream.set_read_timeout(Some(Duration::from_secs(60)))?;
        let head = format!(
            "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\nConnection: close\r\n\r\n",
            body.len()
        );
        stream.write_all(head.as_bytes())?;
        // A server refusing a large body may close before reading all of it; its answer is
        // still there to read.
        if let Err(error) = stream.write_all(body) {
            if !matches!(
                error.kind(),
                std::io::ErrorKind::BrokenPipe | std::io::ErrorKind::ConnectionReset
            ) {
                return Err(error);
            }
        }
        let mut response = Vec::new();
        stream.read_to_end(&mut response)?;
        parse_response(&response)
    }

    /// `/health` as JSON.
    pub fn health(&self) -> Value {
        let (status, body) = self.request("GET", "/health", "").expect("health");
        assert_eq!(status, 200);
        serde_json::from_slice(&body).expect("health JSON")
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        // The server runs until killed; errors here mean it is already gone.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn invalid(message: &str) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, message.to_string())
}

/// Splits an HTTP/1.1 response into its status and body, undoing chunked encoding.
fn parse_response(response: &[u8]) -> std::io::Result<(u16, Vec<u8>)> {
    let split = response
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| invalid("no end of headers"))?;
    let head = String::from_utf8_lossy(&response[..split]).to_ascii_lowercase();
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .ok_or_else(|| invalid("no status code"))?;
    let mut body = &response[split + 4..];
    if !head.contains("transfer-encoding: chunked") {
        return Ok((status, body.to_vec()));
    }
    let mut decoded = Vec::new();
    loop {
        let line_end = body
            .windows(2)
            .position(|w| w == b"\r\n")
            .ok_or_else(|| invalid("no chunk size"))?;
        let size = usize::from_str_radix(String::from_utf8_lossy(&body[..line_end]).trim(), 16)
            .map_err(|_| invalid("bad chunk size"))?;
        if size == 0 {
            return Ok((status, decoded));
        }
        let start = line_end + 2;
        decoded.extend_from_slice(
            body.get(start..start + size)
                .ok_or_else(|| invalid("short"))?,
        );
        body = body
            .get(start + size + 2..)
            .ok_or_else(|| invalid("short"))?;
    }
}
