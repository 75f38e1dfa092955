//! The one log line every finished request writes. Alone in its test binary, so that no
//! other test's thread caches the tracing call sites' interest while the subscriber is set.

mod common;

use std::io::Write;
use std::sync::{Arc, Mutex};

use axum::http::StatusCode;
use common::*;
use runit_server::ServerConfig;

const PROMPT: &str = "Once upon a time";

/// A log sink the test reads back.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("log buffer").extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Captured {
    fn lines(&self) -> Vec<String> {
        let bytes = self.0.lock().expect("log buffer");
        String::from_utf8_lossy(&bytes)
            .lines()
            .map(str::to_string)
            .collect()
    }
}

/// The value of `key=` in a log line.
fn field<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    let start = [' ', '{']
        .iter()
        .find_map(|before| line.find(&format!("{before}{key}=")))?
        + key.len()
        + 2;
    line[start..].split([' ', '}', ':']).next()
}

// A current-thread runtime, so the streaming task logs into this thread's subscriber.
#[tokio::test(flavor = "current_thread")]
async fn every_finished_request_logs_one_info_line() {
    let Some(f) = fixture(SYNTHETIC, scheduler_config(), ServerConfig::default()) else {
        return;
    };
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_env_filter("runit_server=info")
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);

    let prompt_tokens = f.tokenizer.encode(PROMPT, true, false).len();
    let whole = format!(
        r#"{{"prompt": {:?}, "temperature": 0, "max_tokens": 6}}"#,
        PROMPT
    );
    let (status, body) = post_json(f.router(), "/v1/completions", &whole).await;
    assert_eq!(status, StatusCode::OK);
    let streamed = whole.replace("\"temperature\"", "\"stream\": true, \"temperature\"");
    let (status, _) = send(f.router(), post("/v1/completions", &streamed)).await;
    assert_eq!(status, StatusCode::OK);
    let (status, _) = post_json(f.router(), "/v1/completions", r#"{"prompt": 5}"#).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);

    let lines = captured.lines();
    let finished: Vec<&String> = lines
        .iter()
        .filter(|l| l.contains("request finished"))
        .collect();
    assert_eq!(finished.len(), 2, "{lines:#?}");
    let generated = body["usage"]["completion_tokens"].as_u64().expect("count");
    let reason = body["choices"][0]["finish_reason"]
        .as_str()
        .expect("reason");
    for line in &finished {
        assert!(line.contains("INFO"), "{line}");
        assert!(
            field(line, "id").is_some_and(|id| id.starts_with("cmpl-")),
            "{line}"
        );
        assert_eq!(field(line, "endpoint"), Some("/v1/completions"), "{line}");
        assert_eq!(
            field(line, "prompt_tokens"),
            Some(&*prompt_tokens.to_string()),
            "{line}"
        );
        assert_eq!(
            field(line, "generated_tokens"),
            Some(&*generated.to_string()),
            "{line}"
        );
        assert_eq!(field(line, "finish_reason"), Some(reason), "{line}");
        for number in ["ttft_ms", "decode_tps"] {
            let value: f64 = field(line, number)
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("{number} in {line}"));
            assert!(value >= 0.0, "{line}");
        }
    }
    assert_ne!(field(finished[0], "id"), field(finished[1], "id"));
    let rejected: Vec<&String> = lines
        .iter()
        .filter(|l| l.contains("request rejected"))
        .collect();
    assert_eq!(rejected.len(), 1, "{lines:#?}");
    assert_eq!(field(rejected[0], "status"), Some("400"), "{}", rejected[0]);
}
