//! Shared helpers of the server tests: loading a model into an app state, sending requests
//! through the router, and reading JSON and server-sent-event bodies.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::Arc;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use axum::Router;
use http_body_util::BodyExt;
use runit_engine::scheduler::Scheduler;
use runit_engine::{generate, EngineConfig, GenerateParams, Sampler, SamplerParams, Session};
use runit_model::Model;
use runit_server::{AppState, ServerConfig};
use runit_tokenizer::{ChatTemplate, Tokenizer};
use serde_json::Value;
use tower::ServiceExt;

pub const SYNTHETIC: &str = "synth-qwen2-Q8_0.gguf";
pub const SMOLLM2: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
pub const CONTEXT: usize = 256;

/// The path of model file `name` among the golden and fetched models, if present.
pub fn find_model(name: &str) -> Option<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    [root.join("models")]
        .into_iter()
        .map(|dir| dir.join(name))
        .find(|path| path.exists())
}

/// A loaded model with what the server needs next to it.
pub struct Fixture {
    pub model: Arc<Model>,
    pub tokenizer: Arc<Tokenizer>,
    pub state: Arc<AppState>,
}

/// Loads `name` (None, with a notice, when the file is absent) behind a server.
pub fn fixture(name: &str, scheduler: EngineConfig, config: ServerConfig) -> Option<Fixture> {
    fixture_with_template(name, scheduler, config, None)
}

/// The text of the template fixture `tests/data/templates/{name}.jinja`.
pub fn template_fixture(name: &str) -> String {
    let path = format!(
        "{}/tests/data/templates/{name}.jinja",
        env!("CARGO_MANIFEST_DIR")
    );
    std::fs::read_to_string(&path).unwrap_or_else(|error| panic!("{path}: {error}"))
}

/// SmolLM2 with the template fixture `name` and room for tool conversations (a context of
/// 1,024, two sequences).
pub fn with_template_fixture(name: &str) -> Option<Fixture> {
    let config = runit_engine::EngineConfig {
        context_size: 1024,
        batch_size: 256,
        max_sequences: 2,
        ..runit_engine::EngineConfig::default()
    };
    fixture_with_template(
        SMOLLM2,
        config,
        ServerConfig::default(),
        Some(&template_fixture(name)),
    )
}

/// Like [`fixture`], with the chat template `template` instead of the model's.
pub fn fixture_with_template(
    name: &str,
    scheduler: EngineConfig,
    config: ServerConfig,
    template: Option<&str>,
) -> Option<Fixture> {
    let Some(path) = find_model(name) else {
        eprintln!("skipping: {name} not found");
        return None;
    };
    let file = Arc::new(runit_gguf::GgufFile::open(&path).expect("model opens"));
    let backend = Arc::new(runit_backend_cpu::CpuBackend::new(2).expect("cpu backend"));
    let model = Arc::new(Model::load(Arc::clone(&file), backend).expect("model loads"));
    let tokenizer = Arc::new(Tokenizer::from_gguf(&file).expect("tokenizer"));
    let template = match template {
        Some(source) => ChatTemplate::new(source, "", "").expect("template compiles"),
        None => ChatTemplate::from_tokenizer(&tokenizer).expect("template"),
    };
    let scheduler = Scheduler::start(Arc::clone(&model), &scheduler).expect("scheduler");
    let context_size = scheduler.context_size();
    let state = Arc::new(
        AppState::new(scheduler, Arc::clone(&tokenizer), template, config)
            .with_embeddings(Arc::clone(&model), context_size),
    );
    Some(Fixture {
        model,
        tokenizer,
        state,
    })
}

/// The scheduler settings of most tests.
pub fn scheduler_config() -> EngineConfig {
    EngineConfig {
        context_size: CONTEXT,
        batch_size: 64,
        max_sequences: 4,
        ..EngineConfig::default()
    }
}

impl Fixture {
    pub fn router(&self) -> Router {
        runit_server::router(Arc::clone(&self.state))
    }

    /// Greedy tokens of `prompt` generated alone through a `Session`, as text.
    pub fn alone(&self, prompt: &[u32], max_tokens: usize) -> String {
        let config = EngineConfig {
            context_size: CONTEXT,
            batch_size: 64,
            ..EngineConfig::default()
        };
        let mut session = Session::new(Arc::clone(&self.model), &config).expect("session");
        let mut sampler = Sampler::new(SamplerParams::greedy()).expect("sampler");
        let params = GenerateParams {
            max_tokens,
            end_of_generation: self.tokenizer.eog_ids(),
            top_logprobs: 0,
        };
        let out =
            generate(&mut session, &mut sampler, prompt, &params, |_| true).expect("generate");
        let text = self
            .tokenizer
            .decode_with(
                &out.tokens,
                runit_tokenizer::DecodeOptions {
                    skip_special: true,
                    strip_leading_space: false,
                },
            )
            .expect("decode");
        String::from_utf8_lossy(&text).into_owned()
    }

    /// The chat prompt's token ids, as the server builds them.
    pub fn chat_prompt(&self, user: &str) -> Vec<u32> {
        let template = ChatTemplate::from_tokenizer(&self.tokenizer).expect("template");
        let text = template
            .render(&[runit_tokenizer::ChatMessage::user(user)], true)
            .expect("render");
        self.tokenizer.encode(&text, true, true)
    }
}

/// Sends a request and returns the status and the whole body.
pub async fn send(router: Router, request: Request<Body>) -> (StatusCode, Vec<u8>) {
    let response = router.oneshot(request).await.expect("router answers");
    let status = response.status();
    let body = response
        .into_body()
        .collect()
        .await
        .expect("body")
        .to_bytes();
    (status, body.to_vec())
}

/// A JSON POST to `path`.
pub fn post(path: &str, body: &str) -> Request<Body> {
    Request::post(path)
        .header("content-type", "application/json")
        .body(Body::from(body.to_string()))
        .expect("request")
}

/// A GET of `path`.
pub fn get(path: &str) -> Request<Body> {
    Request::get(path).body(Body::empty()).expect("request")
}

/// Posts and parses the JSON answer.
pub async fn post_json(router: Router, path: &str, body: &str) -> (StatusCode, Value) {
    let (status, bytes) = send(router, post(path, body)).await;
    let value = serde_json::from_slice(&bytes).unwrap_or_else(|error| {
        panic!(
            "{path} answered non-JSON ({error}): {}",
            String::from_utf8_lossy(&bytes)
        )
    });
    (status, value)
}

/// The `data:` payloads of a server-sent-event body.
pub fn sse_data(body: &[u8]) -> Vec<String> {
    String::from_utf8_lossy(body)
        .lines()
        .filter_map(|line| line.strip_prefix("data: ").or(line.strip_prefix("data:")))
        .map(str::to_string)
        .collect()
}

/// `value` without its `id`s and `call_id`s (which differ from one response to the next).
pub fn without_ids(value: &Value) -> Value {
    match value {
        Value::Object(map) => map
            .iter()
            .filter(|(key, _)| *key != "id" && *key != "call_id")
            .map(|(key, value)| (key.clone(), without_ids(value)))
            .collect(),
        Value::Array(items) => items.iter().map(without_ids).collect(),
        other => other.clone(),
    }
}
