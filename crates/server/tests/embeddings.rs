//! `POST /v1/embeddings` on SmolLM2: unit-length vectors of the model's width, the same
//! vector for a text given as a string, as token ids or inside a list, base64 equal to the
//! floats, pooling that agrees with itself (mean and last of a one-token text are its one
//! state), and refusals that name the field.

mod common;

use std::sync::Arc;

use axum::http::StatusCode;
use base64::Engine as _;
use common::*;
use runit_engine::{embed, EngineConfig, Session};
use runit_model::Pooling;
use runit_server::ServerConfig;
use serde_json::{json, Value};

fn server() -> Option<Fixture> {
    fixture(SMOLLM2, scheduler_config(), ServerConfig::default())
}

async fn vectors(f: &Fixture, body: Value) -> Vec<Vec<f32>> {
    let (status, answer) = post_json(f.router(), "/v1/embeddings", &body.to_string()).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert_eq!(answer["object"], "list");
    answer["data"]
        .as_array()
        .expect("data")
        .iter()
        .enumerate()
        .map(|(i, item)| {
            assert_eq!(item["index"], i);
            assert_eq!(item["object"], "embedding");
            match &item["embedding"] {
                Value::String(text) => base64::engine::general_purpose::STANDARD
                    .decode(text)
                    .expect("base64")
                    .chunks_exact(4)
                    .map(|bytes| f32::from_le_bytes(bytes.try_into().expect("4 bytes")))
                    .collect(),
                values => values
                    .as_array()
                    .expect("floats")
                    .iter()
                    .map(|v| v.as_f64().expect("float") as f32)
                    .collect(),
            }
        })
        .collect()
}

#[tokio::test]
async fn embeddings_are_unit_vectors_whatever_the_input_shape() {
    let Some(f) = server() else { return };
    let width = f.model.config.embedding_length;
    let text = "The cat sat on the mat.";
    let single = vectors(&f, json!({"input": text})).await;
    assert_eq!(single.len(), 1);
    assert_eq!(single[0].len(), width);
    let norm: f32 = single[0].iter().map(|v| v * v).sum::<f32>().sqrt();
    assert!((norm - 1.0).abs() < 1e-4, "norm {norm}");
    let listed = vectors(
        &f,
        json!({"input": ["Another text.", text], "model": "runit"}),
    )
    .await;
    assert_eq!(listed[1], single[0]);
    assert_ne!(listed[0], single[0]);
    let ids = f.tokenizer.encode(text, true, false);
    let by_ids = vectors(&f, json!({"input": ids})).await;
    assert_eq!(by_ids[0], single[0]);
    let encoded = vectors(&f, json!({"input": text, "encoding_format": "base64"})).await;
    assert_eq!(encoded[0], single[0]);
    let same_width = vectors(&f, json!({"input": text, "dimensions": width})).await;
    assert_eq!(same_width[0], single[0]);
}

#[test]
fn mean_and_last_pooling_of_one_token_are_its_state() {
    let Some(path) = find_model(SMOLLM2) else {
        return;
    };
    let file = Arc::new(runit_gguf::GgufFile::open(&path).expect("opens"));
    let backend = Arc::new(runit_backend_cpu::CpuBackend::new(2).expect("cpu"));
    let model = Arc::new(runit_model::Model::load(file, backend).expect("loads"));
    let config = EngineConfig {
        context_size: 64,
        batch_size: 4,
        ..EngineConfig::default()
    };
    let mut session = Session::new(model, &config).expect("session");
    let mean = embed(&mut session, &[504], Pooling::Mean).expect("mean");
    let last = embed(&mut session, &[504], Pooling::Last).expect("last");
    let first = embed(&mut session, &[504], Pooling::First).expect("first");
    assert_eq!(mean, last);
    assert_eq!(mean, first);
    // Ten tokens in chunks of four: the last token's state and the first token's differ,
    // and the first token's state does not depend on what follows it.
    let tokens: Vec<u32> = (500..510).collect();
    let last = embed(&mut session, &tokens, Pooling::Last).expect("last");
    let first = embed(&mut session, &tokens, Pooling::First).expect("first");
    let alone = embed(&mut session, &tokens[..1], Pooling::Last).expect("alone");
    assert_ne!(last, first);
    assert_eq!(first, alone);
}

#[tokio::test]
async fn bad_embedding_requests_name_the_field() {
    let Some(f) = server() else { return };
    let width = f.model.config.embedding_length;
    for (body, param) in [
        (json!({}), "input"),
        (json!({"input": []}), "input"),
        (json!({"input": "x", "dimensions": width / 2}), "dimensions"),
        (
            json!({"input": "x", "encoding_format": "int8"}),
            "encoding_format",
        ),
        (json!({"input": "x", "unknown": 1}), "unknown"),
        (json!({"input": [1, 99999999]}), "input"),
        (json!({"input": "x", "model": "other"}), "model"),
    ] {
        let (status, answer) = post_json(f.router(), "/v1/embeddings", &body.to_string()).await;
        assert!(status.is_client_error(), "{body}: {answer}");
        assert_eq!(answer["error"]["param"], param, "{body}: {answer}");
    }
}
