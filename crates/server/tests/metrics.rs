//! `/metrics` scraped during a load test (its counters move consistently with the answers),
//! behind the API key when one is set; and a burst of 256 requests on a small KV pool, each
//! answered or refused, with every block back afterwards.

mod common;

use std::collections::HashMap;
use std::time::Duration;

use axum::http::StatusCode;
use common::*;
use runit_engine::EngineConfig;
use runit_server::ServerConfig;
use serde_json::Value;

/// The samples of a text exposition by name (labels included), after checking that every
/// sample line follows a `# TYPE` line of its family.
fn parse(text: &str) -> HashMap<String, f64> {
    let mut samples = HashMap::new();
    let mut family = String::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            family = rest.split(' ').next().expect("a name").to_string();
            continue;
        }
        if line.starts_with('#') {
            continue;
        }
        let (name, value) = line.rsplit_once(' ').expect("name and value");
        assert!(
            name.starts_with(&family),
            "{name} outside its family {family}"
        );
        samples.insert(name.to_string(), value.parse().expect("a number"));
    }
    samples
}

async fn scrape(fixture: &Fixture) -> HashMap<String, f64> {
    let (status, body) = send(fixture.router(), get("/metrics")).await;
    assert_eq!(status, StatusCode::OK);
    parse(&String::from_utf8(body).expect("utf-8"))
}

fn completion(prompt: &str, max_tokens: usize) -> String {
    format!(
        r#"{{"prompt": {prompt:?}, "temperature": 0, "max_tokens": {max_tokens}, "ignore_eos": true}}"#
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counters_move_consistently_under_load() {
    let Some(f) = fixture(SYNTHETIC, scheduler_config(), ServerConfig::default()) else {
        return;
    };
    let before = scrape(&f).await;
    assert_eq!(before["runit_generation_tokens_total"], 0.0);
    assert_eq!(before["runit_kv_blocks_used"], 0.0);
    let requests = 10;
    let max_tokens = 24;
    let mut tasks = Vec::new();
    for i in 0..requests {
        let router = f.router();
        // Requests 0 and 5, 1 and 6, ... share their prompts: the second finds it cached.
        let body = completion(
            &format!("Request number {} tells a story about ships", i % 5),
            max_tokens,
        );
        tasks.push(tokio::spawn(async move {
            post_json(router, "/v1/completions", &body).await
        }));
    }
    // Scrape while the load runs: gauges within their bounds, counters never falling.
    let mut previous = before;
    let mut saw_load = false;
    while !tasks.iter().all(|task| task.is_finished()) {
        let now = scrape(&f).await;
        let running = now["runit_requests_running"];
        let waiting = now["runit_requests_waiting"];
        assert!(running <= 4.0, "at most --parallel run");
        saw_load |= running + waiting > 0.0;
        assert_eq!(
            now["runit_kv_blocks_used"] + now["runit_kv_blocks_free"],
            now["runit_kv_blocks_total"]
        );
        for counter in [
            "runit_generation_tokens_total",
            "runit_prompt_tokens_total",
            "runit_time_to_first_token_seconds_count",
            "runit_inter_token_latency_seconds_count",
        ] {
            assert!(now[counter] >= previous[counter], "{counter} fell");
        }
        previous = now;
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(saw_load, "a scrape saw requests running or waiting");
    let mut prompt_tokens = 0.0;
    let mut completion_tokens = 0.0;
    for task in tasks {
        let (status, body): (StatusCode, Value) = task.await.expect("task");
        assert_eq!(status, StatusCode::OK, "{body}");
        prompt_tokens += body["usage"]["prompt_tokens"].as_f64().expect("count");
        completion_tokens += body["usage"]["completion_tokens"].as_f64().expect("count");
    }
    assert!(f.state.scheduler.wait_idle(Duration::from_secs(30)));
    let after = scrape(&f).await;
    assert_eq!(completion_tokens, (requests * max_tokens) as f64);
    assert_eq!(after["runit_generation_tokens_total"], completion_tokens);
    // Step time: every step counted ran a pass, which took part of it; the host's part
    // lies within the step's time.
    assert!(after["runit_steps_total"] > 0.0);
    let (step, pass, host) = (
        after["runit_step_seconds_total"],
        after["runit_step_pass_seconds_total"],
        after["runit_step_host_seconds_total"],
    );
    assert!(0.0 < pass && pass <= step, "{pass} of {step}");
    assert!(0.0 < host && host <= step, "{host} of {step}");
    assert_eq!(after["runit_prompt_tokens_total"], prompt_tokens);
    assert_eq!(after["runit_requests_admitted_total"], requests as f64);
    assert_eq!(
        after["runit_prefix_cache_hit_tokens_total"]
            + after["runit_prefix_cache_miss_tokens_total"],
        prompt_tokens
    );
    // One first token per request; every other token follows one.
    let first = after["runit_time_to_first_token_seconds_count"];
    assert_eq!(first, requests as f64);
    assert_eq!(
        after[r#"runit_time_to_first_token_seconds_bucket{le="+Inf"}"#],
        first
    );
    assert_eq!(
        after["runit_inter_token_latency_seconds_count"],
        completion_tokens - first
    );
    assert!(after["runit_time_to_first_token_seconds_sum"] > 0.0);
    assert_eq!(after["runit_requests_running"], 0.0);
    assert_eq!(after["runit_requests_waiting"], 0.0);
    assert_eq!(after["runit_kv_blocks_used"], 0.0, "no block leaks");
}

#[tokio::test]
async fn metrics_need_the_api_key_when_one_is_set() {
    let Some(f) = fixture(
        SYNTHETIC,
        scheduler_config(),
        ServerConfig {
            api_key: Some("secret".into()),
            ..ServerConfig::default()
        },
    ) else {
        return;
    };
    let (status, _) = send(f.router(), get("/metrics")).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let request = axum::http::Request::get("/metrics")
        .header("authorization", "Bearer secret")
        .body(axum::body::Body::empty())
        .expect("request");
    let (status, body) = send(f.router(), request).await;
    assert_eq!(status, StatusCode::OK);
    assert!(String::from_utf8_lossy(&body).contains("# TYPE runit_requests_running gauge"));
}

/// 256 requests at once on a pool of 96 cells (6 blocks of 16) with 4 running and 64
/// waiting: a prompt longer than the pool is a 400, a request beyond the queue a 503, the
/// rest wait for room and are answered; none fails, and every block returns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_256_is_answered_or_refused() {
    let Some(f) = fixture(
        SYNTHETIC,
        EngineConfig {
            context_size: 96,
            batch_size: 64,
            max_sequences: 4,
            max_queued: 64,
            ..EngineConfig::default()
        },
        ServerConfig::default(),
    ) else {
        return;
    };
    let long_prompt = "ships ".repeat(200);
    let mut tasks = Vec::new();
    for i in 0..256 {
        let router = f.router();
        let body = match i % 8 {
            // Can never fit: refused at once.
            0 => completion(&long_prompt, 4),
            // Takes the whole pool: waits until nothing else runs.
            1 => completion(&format!("Request {i}"), 80),
            _ => completion(&format!("Request {i} is short"), 6),
        };
        tasks.push(tokio::spawn(async move {
            post_json(router, "/v1/completions", &body).await
        }));
    }
    let mut by_status: HashMap<u16, usize> = HashMap::new();
    for (i, task) in tasks.into_iter().enumerate() {
        let (status, body) = task.await.expect("task");
        *by_status.entry(status.as_u16()).or_default() += 1;
        match status {
            StatusCode::OK => {
                let tokens = body["usage"]["completion_tokens"].as_u64().expect("count");
                assert!(tokens > 0, "request {i}: {body}");
            }
            StatusCode::BAD_REQUEST => assert_eq!(i % 8, 0, "request {i}: {body}"),
            StatusCode::SERVICE_UNAVAILABLE => {}
            other => panic!("request {i}: {other}: {body}"),
        }
    }
    eprintln!("answers by status: {by_status:?}");
    assert_eq!(by_status[&400], 32, "{by_status:?}");
    assert!(by_status[&200] >= 4, "{by_status:?}");
    assert_eq!(by_status.values().sum::<usize>(), 256);
    assert!(f.state.scheduler.wait_idle(Duration::from_secs(60)));
    let stats = f.state.scheduler.stats();
    assert_eq!(stats.free_blocks, stats.total_blocks, "no block leaks");
    // Still serving.
    let (status, body) = post_json(f.router(), "/v1/completions", &completion("Again", 3)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
}

/// Chats that share a long system prompt: the later ones are served from the prefix cache
/// (hits counted on `/metrics` and in each answer's `usage.prompt_tokens_details`) with the
/// answers and log-probabilities of a server without the cache.
#[tokio::test]
async fn a_shared_system_prompt_is_served_from_the_cache_unchanged() {
    let engine = |prefix_cache: bool| EngineConfig {
        context_size: 1024,
        batch_size: 64,
        max_sequences: 4,
        prefix_cache,
        ..EngineConfig::default()
    };
    let Some(cached) = fixture(SMOLLM2, engine(true), ServerConfig::default()) else {
        return;
    };
    let uncached = fixture(SMOLLM2, engine(false), ServerConfig::default()).expect("model");
    let system = "You are a careful assistant for a shipping company. ".repeat(12);
    let questions = [
        "Where is my parcel?",
        "How heavy may a box be?",
        "Where is my parcel?",
    ];
    let mut cached_tokens = Vec::new();
    for question in questions {
        let body = format!(
            r#"{{"messages": [{{"role": "system", "content": {system:?}}},
                {{"role": "user", "content": {question:?}}}],
                "temperature": 0, "max_tokens": 8, "logprobs": true}}"#
        );
        let (status, with_cache) = post_json(cached.router(), "/v1/chat/completions", &body).await;
        assert_eq!(status, StatusCode::OK, "{with_cache}");
        let (status, without) = post_json(uncached.router(), "/v1/chat/completions", &body).await;
        assert_eq!(status, StatusCode::OK, "{without}");
        assert_eq!(
            with_cache["choices"][0]["message"],
            without["choices"][0]["message"]
        );
        let cached_of = |answer: &Value| {
            answer["usage"]["prompt_tokens_details"]["cached_tokens"]
                .as_u64()
                .unwrap_or_else(|| panic!("cached_tokens in {answer}"))
        };
        assert_eq!(cached_of(&without), 0);
        cached_tokens.push(cached_of(&with_cache));
        let logprobs = &with_cache["choices"][0]["logprobs"]["content"];
        assert_eq!(logprobs.as_array().map(Vec::len), Some(8), "{with_cache}");
        assert_eq!(
            *logprobs, without["choices"][0]["logprobs"]["content"],
            "{question}"
        );
    }
    let metrics = scrape(&cached).await;
    // The system prompt is over a hundred tokens: the second and third chats reuse blocks,
    // and the answers say how many of their prompt tokens came from the cache.
    assert!(
        metrics["runit_prefix_cache_hit_tokens_total"] >= 2.0 * 64.0,
        "{metrics:?}"
    );
    assert_eq!(cached_tokens[0], 0, "{cached_tokens:?}");
    assert!(
        cached_tokens[1] >= 64 && cached_tokens[2] >= cached_tokens[1],
        "{cached_tokens:?}"
    );
    assert_eq!(
        cached_tokens.iter().sum::<u64>() as f64,
        metrics["runit_prefix_cache_hit_tokens_total"],
        "{cached_tokens:?}"
    );
    assert_eq!(
        scrape(&uncached).await["runit_prefix_cache_hit_tokens_total"],
        0.0
    );
}
