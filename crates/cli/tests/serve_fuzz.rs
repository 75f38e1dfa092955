//! Malformed request bodies against `runit serve` over raw HTTP: a few hundred random,
//! truncated and wrongly typed bodies to both POST endpoints must each get an OpenAI-shaped
//! 4xx error, after which a normal request succeeds and every KV block is free again.

mod serve_harness;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use serve_harness::{synthetic_model, Server};
/// A small deterministic generator (xorshift64*), so a failing case can be replayed.
struct Random(u64);

impl Random {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    fn pick<T: Clone>(&mut self, items: &[T]) -> T {
        items[self.below(items.len())].clone()
    }

    /// Any JSON value, nested at most `depth` deep.
    fn value(&mut self, depth: usize) -> Value {
        match self.below(if depth == 0 { 5 } else { 7 }) {
            0 => Value::Null,
            1 => json!(self.below(2) == 1),
            2 => json!(self.next() as i64),
            3 => json!(f64::from_bits(self.next() >> 2)),
            4 => json!("x".repeat(self.below(40))),
            5 => Value::Array((0..self.below(4)).map(|_| self.value(depth - 1)).collect()),
            _ => {
                let fields = (0..self.below(4)).map(|i| (format!("k{i}"), self.value(depth - 1)));
                Value::Object(fields.collect())
            }
        }
    }
}

/// A value of the wrong type (or out of range) for each field both endpoints read.
fn bad_field(random: &mut Random, chat: bool) -> (&'static str, Value) {
    let not_number = [json!("1"), json!(true), json!([1]), json!({"a": 1})];
    let not_integer = [
        json!(1.5),
        json!(1e30),
        json!("3"),
        json!(false),
        json!([2]),
    ];
    let cases: Vec<(&'static str, Vec<Value>)> = vec![
        (
            "model",
            vec![json!(7), json!(["m"]), json!("no-such-model")],
        ),
        (
            "max_tokens",
            [&not_integer[..], &[json!(0), json!(-5), json!(4_000_000)]].concat(),
        ),
        (
            "max_completion_tokens",
            vec![json!(0), json!(1e300), json!({})],
        ),
        (
            "temperature",
            [&not_number[..], &[json!(2.5), json!(-1), json!(1e308)]].concat(),
        ),
        ("top_p", vec![json!(0), json!(1.5), json!("0.9")]),
        ("min_p", vec![json!(-0.1), json!(2), json!([0.1])]),
        ("top_k", vec![json!(-1), json!(0.5), json!("5")]),
        ("presence_penalty", vec![json!(3), json!("0")]),
        ("frequency_penalty", vec![json!(-3), json!(true)]),
        ("repetition_penalty", vec![json!(0), json!(11)]),
        (
            "seed",
            vec![
                json!(0.5),
                json!("42"),
                json!(18_446_744_073_709_551_615u64),
            ],
        ),
        ("n", vec![json!(0), json!(17), json!(1e9), json!("2")]),
        ("stream", vec![json!(1), json!("true"), json!([])]),
        (
            "stop",
            vec![
                json!(5),
                json!({"a": "b"}),
                json!(["a", 1]),
                json!(vec!["s"; 17]),
            ],
        ),
        (
            "stream_options",
            vec![json!(true), json!({"include_usage": "yes"})],
        ),
        ("user", vec![json!(5), json!({})]),
    ];
    let mut cases = cases;
    if chat {
        cases.push(("logprobs", vec![json!(1), json!("true")]));
        cases.push(("top_logprobs", vec![json!(21), json!(-1), json!(1.5)]));
        cases.push((
            "messages",
            vec![
                json!([]),
                json!("hi"),
                json!([1]),
                json!([{"content": "no role"}]),
                json!([{"role": "robot", "content": "x"}]),
                json!([{"role": 3, "content": "x"}]),
                json!([{"role": "user", "content": 5}]),
                json!([{"role": "user", "content": [{"type": "image_url"}]}]),
                json!([{"role": "user", "content": [{"type": "text", "text": 1}]}]),
            ],
        ));
    } else {
        cases.push(("logprobs", vec![json!(21), json!(true), json!(-1)]));
        cases.push((
            "prompt",
            vec![
                json!([]),
                json!(5),
                json!({}),
                json!([1.5]),
                json!([-1]),
                json!([1, "a"]),
                // More prompts than one request may carry (16).
                json!(vec!["a"; 17]),
                json!([["a"]]),
                json!([99_999_999_999u64]),
                json!([4_000_000_000u32]),
            ],
        ));
    }
    let (name, values) = random.pick(&cases);
    (name, random.pick(&values))
}

/// One malformed body for the chat (`chat`) or completion endpoint.
fn malformed_body(random: &mut Random, chat: bool) -> Vec<u8> {
    let mut body = if chat {
        json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, "temperature": 0})
    } else {
        json!({"prompt": "Hi", "max_tokens": 4, "temperature": 0})
    };
    for i in 0..random.below(3) {
        body[format!("unknown_{i}")] = random.value(3);
    }
    match random.below(10) {
        // A truncated body (a strict prefix of an object is never valid JSON).
        0..=2 => {
            let text = body.to_string();
            text.as_bytes()[..random.below(text.len())].to_vec()
        }
        // Noise, and JSON that is not an object.
        3 => (0..1 + random.below(64))
            .map(|_| random.next() as u8)
            .collect(),
        4 => random
            .pick(&[
                "null",
                "[]",
                "42",
                "\"text\"",
                "{}",
                "{\"a\":1e400}",
                "[[[[[[[[[[[[",
            ])
            .into(),
        5 => format!("{}{}", "[".repeat(300), "]".repeat(300)).into_bytes(),
        // A well-formed object with one field wrong.
        _ => {
            let (name, value) = bad_field(random, chat);
            body[name] = value;
            body.to_string().into_bytes()
        }
    }
}

/// Asserts an OpenAI-shaped 4xx error.
fn assert_api_error(status: u16, body: &[u8], what: &str) {
    assert!((400..500).contains(&status), "{what}: status {status}");
    let value: Value = serde_json::from_slice(body)
        .unwrap_or_else(|e| panic!("{what}: error body is not JSON ({e})"));
    let error = &value["error"];
    let message = error["message"].as_str().unwrap_or_default();
    assert!(!message.is_empty(), "{what}: no message in {value}");
    assert!(error["type"].is_string(), "{what}: no type in {value}");
    let object = error.as_object().expect("error object");
    assert!(
        object.contains_key("param") && object.contains_key("code"),
        "{what}: {value}"
    );
}

/// Polls `/health` until nothing runs and every block is free again.
fn assert_blocks_return(server: &Server, free_at_start: &Value) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let health = server.health();
        if health["active"] == 0 && health["queued"] == 0 && health["free_blocks"] == *free_at_start
        {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "blocks leaked: {health} (started with {free_at_start})"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn malformed_bodies_get_api_errors_and_leak_nothing() {
    let Some(model) = synthetic_model() else {
        return;
    };
    let server = Server::start(&model, &["--parallel", "4"]);
    let start = server.health();
    let free_at_start = start["free_blocks"].clone();
    assert_eq!(free_at_start, start["total_blocks"]);
    let mut random = Random(0x5eed_1234_abcd_0001);
    for case in 0..400 {
        let chat = case % 2 == 0;
        let path = if chat {
            "/v1/chat/completions"
        } else {
            "/v1/completions"
        };
        let body = malformed_body(&mut random, chat);
        let (status, answer) = server.raw("POST", path, &body).expect("an answer");
        let what = format!("case {case} {path} {}", String::from_utf8_lossy(&body));
        assert_api_error(status, &answer, &what);
    }
    // A body over the size limit.
    let huge = format!(r#"{{"prompt": "{}"}}"#, "a".repeat(5 << 20));
    let (status, answer) = server
        .request("POST", "/v1/completions", &huge)
        .expect("answer");
    assert_eq!(status, 413);
    assert_api_error(status, &answer, "huge body");
    // A stream abandoned after its first bytes is cancelled.
    let mut abandoned = TcpStream::connect(("127.0.0.1", server.port)).expect("connect");
    let body = r#"{"prompt": "Once upon a time", "max_tokens": 400, "stream": true}"#;
    write!(
        abandoned,
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .expect("send");
    abandoned
        .read_exact(&mut [0u8; 64])
        .expect("the stream starts");
    drop(abandoned);
    // The server still answers, and every block comes back.
    let request =
        r#"{"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, "temperature": 0}"#;
    let (status, answer) = server
        .request("POST", "/v1/chat/completions", request)
        .expect("answer");
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&answer));
    let answer: Value = serde_json::from_slice(&answer).expect("JSON");
    assert!(
        answer["choices"][0]["message"]["content"].is_string(),
        "{answer}"
    );
    assert_blocks_return(&server, &free_at_start);
}
