//! Model ids: `/v1/models` lists every alias, `/v1/models/{id}` answers for each and 404s
//! for others, and a request may name any of them.

mod common;

use axum::http::StatusCode;
use common::*;
use runit_server::ServerConfig;
use serde_json::Value;

#[tokio::test]
async fn every_alias_is_listed_fetched_and_accepted() {
    let Some(f) = fixture(
        SYNTHETIC,
        scheduler_config(),
        ServerConfig {
            model_name: "tiny".into(),
            aliases: vec!["small".into(), SYNTHETIC.into(), "tiny".into()],
            ..ServerConfig::default()
        },
    ) else {
        return;
    };
    let (status, body) = send(f.router(), get("/v1/models")).await;
    assert_eq!(status, StatusCode::OK);
    let models: Value = serde_json::from_slice(&body).expect("json");
    let ids: Vec<&str> = models["data"]
        .as_array()
        .expect("data")
        .iter()
        .map(|model| model["id"].as_str().expect("id"))
        .collect();
    assert_eq!(ids, ["tiny", "small", SYNTHETIC]);
    for id in &ids {
        let (status, body) = send(f.router(), get(&format!("/v1/models/{id}"))).await;
        assert_eq!(status, StatusCode::OK);
        let model: Value = serde_json::from_slice(&body).expect("json");
        assert_eq!(model["id"], *id);
        assert_eq!(model["object"], "model");
        let request = format!(r#"{{"model": "{id}", "prompt": "Hi", "max_tokens": 2}}"#);
        let (status, answer) = post_json(f.router(), "/v1/completions", &request).await;
        assert_eq!(status, StatusCode::OK, "{answer}");
    }
    let (status, body) = send(f.router(), get("/v1/models/other")).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let error: Value = serde_json::from_slice(&body).expect("json");
    assert_eq!(error["error"]["code"], "model_not_found");
    let request = r#"{"model": "other", "prompt": "Hi", "max_tokens": 2}"#;
    let (status, answer) = post_json(f.router(), "/v1/completions", request).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{answer}");
    assert_eq!(answer["error"]["param"], "model");
}
