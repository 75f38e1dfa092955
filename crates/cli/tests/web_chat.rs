//! The chat page at `/` of `runit serve`, in a real browser: Debian's headless Chromium,
//! driven through its DevTools protocol, loads `/?send=Hello` (the page sends that message
//! once it is up); the test waits in real time until the page has finished answering, reads
//! the DOM and saves a screenshot to `target/web-chat.png`. (Dumping with `--dump-dom` and a
//! virtual-time budget was not reliable: virtual time could run out while the answer was
//! still streaming.) Without Chromium the test says so and passes, unless
//! `RUNIT_REQUIRE_BROWSER=1` (scripts/test.sh installs Chromium and sets it).

mod serve_harness;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use base64::Engine as _;
use serde_json::{json, Value};
use serve_harness::{synthetic_model, Server};

fn chromium() -> Option<PathBuf> {
    ["chromium", "chromium-browser", "google-chrome"]
        .into_iter()
        .find_map(|name| {
            let found = Command::new("which").arg(name).output().ok()?;
            let path = String::from_utf8_lossy(&found.stdout).trim().to_string();
            (found.status.success() && !path.is_empty()).then(|| PathBuf::from(path))
        })
}

/// A headless Chromium and a DevTools connection to its one page.
struct Browser {
    child: Child,
    socket: tungstenite::WebSocket<tungstenite::stream::MaybeTlsStream<TcpStream>>,
    next_id: u64,
}

impl Browser {
    fn launch(chromium: &Path, profile: &Path) -> Browser {
        let child = Command::new(chromium)
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--no-first-run",
                "--window-size=1000,700",
                "--remote-debugging-port=0",
            ])
            .arg(format!("--user-data-dir={}", profile.display()))
            .arg("about:blank")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("chromium starts");
        // Chromium writes its port to DevToolsActivePort once it listens.
        let started = Instant::now();
        let port = loop {
            let text =
                std::fs::read_to_string(profile.join("DevToolsActivePort")).unwrap_or_default();
            if let Some(port) = text
                .lines()
                .next()
                .and_then(|line| line.parse::<u16>().ok())
            {
                if text.lines().count() >= 2 {
                    break port;
                }
            }
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "chromium did not open its DevTools port"
            );
            std::thread::sleep(Duration::from_millis(100));
        };
        let targets = http_get_json(port, "/json/list");
        let url = targets
            .as_array()
            .and_then(|targets| targets.iter().find(|target| target["type"] == "page"))
            .and_then(|page| page["webSocketDebuggerUrl"].as_str())
            .unwrap_or_else(|| panic!("no page target: {targets}"))
            .to_string();
        let (socket, _) = tungstenite::connect(url.as_str()).expect("DevTools connection");
        if let tungstenite::stream::MaybeTlsStream::Plain(stream) = socket.get_ref() {
            stream
                .set_read_timeout(Some(Duration::from_secs(60)))
                .expect("read timeout");
        }
        Browser {
            child,
            socket,
            next_id: 1,
        }
    }

    /// Calls a DevTools method and returns its result.
    fn call(&mut self, method: &str, params: Value) -> Value {
        let id = self.next_id;
        self.next_id += 1;
        let message = json!({"id": id, "method": method, "params": params}).to_string();
        self.socket
            .send(tungstenite::Message::text(message))
            .expect("DevTools send");
        loop {
            let reply = self.socket.read().expect("DevTools reply");
            let tungstenite::Message::Text(text) = reply else {
                continue;
            };
            let reply: Value = serde_json::from_str(text.as_str()).expect("DevTools JSON");
            if reply["id"] == id {
                assert!(reply.get("error").is_none(), "{method}: {reply}");
                return reply["result"].clone();
            }
        }
    }

    /// The value of a JavaScript expression in the page.
    fn eval(&mut self, expression: &str) -> Value {
        let result = self.call(
            "Runtime.evaluate",
            json!({"expression": expression, "returnByValue": true}),
        );
        result["result"]["value"].clone()
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn http_get_json(port: u16, path: &str) -> Value {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).expect("DevTools HTTP");
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .expect("read timeout");
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n"
    )
    .expect("DevTools HTTP request");
    // Read until the body named by Content-Length has arrived (the server may keep the
    // connection open).
    let mut reply = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let text = String::from_utf8_lossy(&reply).into_owned();
        if let Some((head, body)) = text.split_once("\r\n\r\n") {
            let length = head.lines().find_map(|line| {
                let (name, value) = line.split_once(':')?;
                name.eq_ignore_ascii_case("content-length")
                    .then(|| value.trim().parse::<usize>().ok())?
            });
            if length.is_some_and(|length| body.len() >= length) {
                return serde_json::from_str(body)
                    .unwrap_or_else(|error| panic!("{error}: {text}"));
            }
        }
        let read = stream.read(&mut chunk).expect("DevTools HTTP reply");
        if read == 0 {
            let text = String::from_utf8_lossy(&reply).into_owned();
            let body = text
                .split_once("\r\n\r\n")
                .map(|(_, body)| body)
                .unwrap_or("");
            return serde_json::from_str(body).unwrap_or_else(|error| panic!("{error}: {text}"));
        }
        reply.extend_from_slice(&chunk[..read]);
    }
}

#[test]
fn the_chat_page_streams_an_answer_in_a_browser() {
    let Some(chromium) = chromium() else {
        assert!(
            std::env::var_os("RUNIT_REQUIRE_BROWSER").is_none(),
            "RUNIT_REQUIRE_BROWSER is set but no Chromium was found"
        );
        eprintln!("skipping: no chromium on PATH (apt-get install chromium)");
        return;
    };
    let Some(model) = synthetic_model() else {
        eprintln!("skipping: models/synth-qwen2-Q8_0.gguf is absent (scripts/make_requants.sh)");
        return;
    };
    let server = Server::start(&model, &["--ctx-size", "256"]);
    let (status, page) = server.request("GET", "/", "").expect("GET /");
    assert_eq!(status, 200);
    let page = String::from_utf8_lossy(&page);
    assert!(page.contains("/v1/chat/completions") && page.contains("localStorage"));

    let scratch = Path::new(env!("CARGO_TARGET_TMPDIR")).join("web-chat");
    let _ = std::fs::remove_dir_all(&scratch);
    std::fs::create_dir_all(&scratch).expect("scratch folder");
    let mut browser = Browser::launch(&chromium, &scratch.join("profile"));
    let url = format!("http://127.0.0.1:{}/?send=Hello", server.port);
    browser.call("Page.navigate", json!({"url": url}));
    // Done when the answer's bubble exists and the Send button is enabled again.
    let finished = "(() => { const send = document.getElementById('send'); \
        return document.querySelectorAll('.msg.assistant').length > 0 && !!send && !send.disabled; })()";
    let started = Instant::now();
    while browser.eval(finished) != Value::Bool(true) {
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "the page did not finish answering:\n{}",
            browser.eval("document.documentElement.outerHTML")
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let dom = browser.eval("document.documentElement.outerHTML");
    let dom = dom.as_str().expect("the page's HTML");
    assert!(
        dom.contains("tokens of context"),
        "the model line is missing:\n{dom}"
    );
    assert!(
        dom.contains(r#"class="msg user""#) && dom.contains("Hello"),
        "{dom}"
    );
    let answer = browser.eval(
        "(() => { const bubbles = document.querySelectorAll('.msg.assistant'); \
         const last = bubbles[bubbles.length - 1]; \
         return last.innerText.replace(last.querySelector('.role').innerText, ''); })()",
    );
    let answer = answer.as_str().unwrap_or("");
    assert!(!answer.trim().is_empty(), "the answer is empty:\n{dom}");
    assert!(!answer.contains("Error:"), "{answer}");

    let shot = browser.call("Page.captureScreenshot", json!({"format": "png"}));
    let png = base64::engine::general_purpose::STANDARD
        .decode(shot["data"].as_str().expect("screenshot data"))
        .expect("screenshot base64");
    assert!(png.len() > 1000 && png.starts_with(b"\x89PNG"));
    let screenshot = Path::new(env!("CARGO_TARGET_TMPDIR")).join("../web-chat.png");
    std::fs::write(&screenshot, png).expect("screenshot written");
    eprintln!("screenshot: {}", screenshot.display());
}
