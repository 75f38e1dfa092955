//! `runit serve`, `generate --chat` and `chat` against hostile chat templates (a model whose
//! template runs away is refused at load; one that runs away on a message is that request's
//! error), the shutdown sequence (drain for at most `--shutdown-timeout`, a second signal
//! stops at once) and the API key from a file or the environment. Each case has a bounded
//! wait.

mod serve_harness;

use std::borrow::Cow;
use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use runit_gguf::{GgufFile, GgufWriter, Value};
use serve_harness::{synthetic_model, Server};

/// Ten to the fifteenth iterations.
const LOOPS: &str = "{% for a in range(100000) %}{% for b in range(100000) %}{% for c in range(100000) %}x{% endfor %}{% endfor %}{% endfor %}";

/// A copy of the synthetic model whose chat template is `template`, removed on drop.
struct TemplatedModel(PathBuf);

impl TemplatedModel {
    fn new(name: &str, template: &str) -> Option<TemplatedModel> {
        let source = synthetic_model()?;
        let file = GgufFile::open(&source).expect("the model opens");
        let mut writer = GgufWriter::new();
        for (key, value) in file.metadata() {
            if key != "tokenizer.chat_template" {
                writer
                    .add_metadata(key.clone(), value.clone())
                    .expect("metadata");
            }
        }
        writer
            .add_metadata("tokenizer.chat_template", Value::String(template.into()))
            .expect("template");
        for tensor in file.tensors() {
            writer
                .add_tensor(tensor.name.clone(), tensor.ty, tensor.shape.clone())
                .expect("tensor");
        }
        let path = std::env::temp_dir().join(format!("runit-{name}-{}.gguf", std::process::id()));
        let tensors = file.tensors();
        writer
            .write_to_path(&path, |index, _| {
                Ok(Cow::Borrowed(file.tensor_data(&tensors[index])))
            })
            .expect("the copy is written");
        Some(TemplatedModel(path))
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TemplatedModel {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn runit(args: &[&str], model: &Path, stdin: &str) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_runit"))
        .args(args)
        .arg("-m")
        .arg(model)
        .args(["--threads", "1"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("runit runs");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(stdin.as_bytes())
        .expect("write stdin");
    child.wait_with_output().expect("runit ends")
}

fn assert_refused(output: &Output, what: &str, expected: &str) {
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{what} succeeded: {stderr}");
    assert!(stderr.contains(expected), "{what}: {stderr}");
}

#[test]
fn a_runaway_template_is_refused_at_load() {
    let Some(model) = TemplatedModel::new("runaway-template", LOOPS) else {
        return;
    };
    let start = Instant::now();
    let fuel = "fuel limit of 2000000";
    assert_refused(
        &runit(
            &["generate", "--chat", "-p", "Hi", "-n", "2"],
            model.path(),
            "",
        ),
        "generate --chat",
        fuel,
    );
    assert_refused(&runit(&["chat"], model.path(), "Hi\n"), "chat", fuel);
    assert_refused(
        &runit(&["serve", "--port", "0"], model.path(), ""),
        "serve",
        fuel,
    );
    assert!(start.elapsed() < Duration::from_secs(60));
}

#[test]
fn a_template_that_runs_away_on_a_message_fails_that_message() {
    let template = format!(
        "{{% if messages[-1].content == 'boom' %}}{LOOPS}{{% else %}}{}{{% endif %}}",
        runit_tokenizer::CHATML_TEMPLATE
    );
    let Some(model) = TemplatedModel::new("message-runaway", &template) else {
        return;
    };
    let fuel = "fuel limit of 2000000";
    assert_refused(
        &runit(
            &["generate", "--chat", "-p", "boom", "-n", "2"],
            model.path(),
            "",
        ),
        "generate --chat",
        fuel,
    );
    // The chat reports the error and goes on with the conversation.
    let output = runit(
        &["chat", "-n", "2", "--temperature", "0"],
        model.path(),
        "boom\nHi\n",
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    assert!(stderr.contains(fuel), "{stderr}");
    assert!(!output.stdout.is_empty(), "the second message is answered");
    let output = runit(
        &[
            "generate",
            "--chat",
            "-p",
            "Hi",
            "-n",
            "2",
            "--temperature",
            "0",
        ],
        model.path(),
        "",
    );
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let server = Server::start(model.path(), &[]);
    let body = r#"{"messages": [{"role": "user", "content": "boom"}], "max_tokens": 2}"#;
    let (status, answer) = server
        .request("POST", "/v1/chat/completions", body)
        .expect("an answer");
    assert_eq!(status, 400, "{}", String::from_utf8_lossy(&answer));
    let answer: serde_json::Value = serde_json::from_slice(&answer).expect("JSON");
    assert_eq!(answer["error"]["code"], "template_limit_exceeded");
    assert_eq!(server.health()["status"], "ok");
}

/// A `runit serve` child whose stderr lines arrive on a channel.
struct Watched {
    child: Child,
    port: u16,
    lines: mpsc::Receiver<String>,
}

impl Watched {
    fn start(model: &Path, extra: &[&str]) -> Watched {
        Watched::start_with_env(model, extra, &[])
    }

    fn start_with_env(model: &Path, extra: &[&str], environment: &[(&str, &str)]) -> Watched {
        let runit = Command::new(env!("CARGO_BIN_EXE_runit"));
        Watched::launch(runit, model, extra, environment)
    }

    /// `runit serve` under a limit of `descriptors` open files (`prlimit` execs it).
    fn start_with_descriptor_limit(model: &Path, extra: &[&str], descriptors: u32) -> Watched {
        let mut limited = Command::new("prlimit");
        limited
            .arg(format!("--nofile={descriptors}"))
            .arg(env!("CARGO_BIN_EXE_runit"));
        Watched::launch(limited, model, extra, &[])
    }

    /// Starts `command` (runit, or a program that execs it) with `serve` on a free port.
    fn launch(
        mut command: Command,
        model: &Path,
        extra: &[&str],
        environment: &[(&str, &str)],
    ) -> Watched {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|listener| listener.local_addr())
            .expect("a free port")
            .port();
        let mut child = command
            .arg("serve")
            .arg("-m")
            .arg(model)
            .args(["--port", &port.to_string(), "--threads", "1"])
            .args(extra)
            .env("RUST_LOG", "info")
            .envs(environment.iter().copied())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("runit starts");
        let stderr = child.stderr.take().expect("stderr");
        let (sender, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if sender.send(line).is_err() {
                    return;
                }
            }
        });
        let mut watched = Watched { child, port, lines };
        watched.wait_for("listening on");
        watched
    }

    /// Waits (at most 60 s) for a stderr line containing `text`.
    fn wait_for(&mut self, text: &str) {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) if line.contains(text) => return,
                Ok(_) => {}
                Err(_) => panic!("runit serve never logged `{text}`"),
            }
        }
    }

    fn signal(&self, name: &str) {
        let status = Command::new("kill")
            .args([&format!("-{name}"), &self.child.id().to_string()])
            .status()
            .expect("kill runs");
        assert!(status.success());
    }

    /// Waits (at most `within`) for the process to exit; returns its exit code.
    fn exit_within(&mut self, within: Duration) -> Option<i32> {
        let deadline = Instant::now() + within;
        loop {
            if let Some(status) = self.child.try_wait().expect("poll") {
                return status.code();
            }
            assert!(Instant::now() < deadline, "runit serve is still running");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Opens a request whose body never ends; it is in flight once a request on a later
    /// connection has been answered (connections are accepted in order).
    fn stalled_request(&mut self) -> TcpStream {
        let mut stream = TcpStream::connect(("127.0.0.1", self.port)).expect("connect");
        stream
            .write_all(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
            .expect("write");
        assert_eq!(self.status("/health", None), "200");
        stream
    }

    /// The status of a GET of `path` on a fresh connection, with `key` as bearer token.
    fn status(&self, path: &str, key: Option<&str>) -> String {
        let mut stream = TcpStream::connect(("127.0.0.1", self.port)).expect("connect");
        stream
            .set_read_timeout(Some(Duration::from_secs(30)))
            .expect("read timeout");
        let authorization = key
            .map(|key| format!("Authorization: Bearer {key}\r\n"))
            .unwrap_or_default();
        write!(
            stream,
            "GET {path} HTTP/1.1\r\nHost: x\r\n{authorization}Connection: close\r\n\r\n"
        )
        .expect("write");
        let mut answer = String::new();
        std::io::Read::read_to_string(&mut stream, &mut answer).expect("read");
        answer
            .split_whitespace()
            .nth(1)
            .unwrap_or_default()
            .to_string()
    }
}

impl Drop for Watched {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn shutdown_drains_for_at_most_its_timeout() {
    let Some(model) = synthetic_model() else {
        return;
    };
    let mut server = Watched::start(&model, &["--shutdown-timeout", "1", "--body-timeout", "60"]);
    let _stalled = server.stalled_request();
    server.signal("TERM");
    server.wait_for("draining");
    let start = Instant::now();
    let code = server.exit_within(Duration::from_secs(10));
    assert_eq!(code, Some(1), "requests were dropped");
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "{:?}",
        start.elapsed()
    );
}

#[test]
fn a_second_signal_stops_at_once() {
    let Some(model) = synthetic_model() else {
        return;
    };
    let mut server = Watched::start(
        &model,
        &["--shutdown-timeout", "120", "--body-timeout", "120"],
    );
    let _stalled = server.stalled_request();
    server.signal("INT");
    server.wait_for("draining");
    server.signal("TERM");
    server.wait_for("second signal");
    assert_eq!(server.exit_within(Duration::from_secs(10)), Some(1));
}

#[test]
fn the_api_key_comes_from_a_file_or_the_environment() {
    let Some(model) = synthetic_model() else {
        return;
    };
    let key_file = std::env::temp_dir().join(format!("runit-key-{}", std::process::id()));
    std::fs::write(&key_file, "from-a-file\n").expect("key file");
    let key_path = key_file.to_string_lossy().into_owned();
    let from_file = Watched::start(&model, &["--api-key-file", &key_path]);
    assert_eq!(from_file.status("/v1/models", Some("from-a-file")), "200");
    assert_eq!(from_file.status("/v1/models", Some("wrong")), "401");
    assert_eq!(from_file.status("/v1/models", None), "401");
    drop(from_file);
    let _ = std::fs::remove_file(&key_file);
    let from_environment =
        Watched::start_with_env(&model, &[], &[("RUNIT_API_KEY", "from-the-environment")]);
    assert_eq!(
        from_environment.status("/v1/models", Some("from-the-environment")),
        "200"
    );
    assert_eq!(
        from_environment.status("/v1/models", Some("from-a-file")),
        "401"
    );
}

#[test]
fn idle_sockets_beyond_the_descriptor_limit_do_not_lock_out_clients() {
    let Some(model) = synthetic_model() else {
        return;
    };
    let limits = ["--idle-timeout", "2", "--header-timeout", "2"];
    let server = Watched::start_with_descriptor_limit(&model, &limits, 128);
    // More idle connections than the process may hold descriptors: accepting fails with
    // EMFILE until the idle ones time out, and then a normal client is answered.
    let idle: Vec<TcpStream> = (0..150)
        .filter_map(|_| TcpStream::connect(("127.0.0.1", server.port)).ok())
        .collect();
    assert!(idle.len() > 128, "only {} connections opened", idle.len());
    assert_eq!(server.status("/health", None), "200");
    drop(idle);
}
