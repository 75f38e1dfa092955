//! The output builder on hand-made deltas: item order, ids, statuses and usage.

use super::*;
use crate::response::Endpoint;
use crate::tools::parse::CallDelta;

fn output() -> Output {
    let header = Header {
        id: "resp_abc".into(),
        created: 1,
        model: "m".into(),
        endpoint: Endpoint::Responses,
        prompt_tokens: 5,
        logprobs: false,
    };
    Output::new(header, Map::new())
}

/// A delta of `text` after `tokens` tokens; the counts are running totals, as a
/// choice sends them.
fn delta(text: &str, tokens: usize) -> Delta {
    Delta {
        text: text.into(),
        completion_tokens: tokens,
        ..Delta::default()
    }
}

fn kinds(events: &[Value]) -> Vec<&str> {
    events.iter().filter_map(|e| e["type"].as_str()).collect()
}

#[test]
fn reasoning_then_text_then_a_call_are_three_items_in_order() {
    let mut out = output();
    let mut events = out.start();
    events.extend(out.push(Delta {
        reasoning: "hmm".into(),
        completion_tokens: 1,
        reasoning_tokens: 1,
        ..Delta::default()
    }));
    events.extend(out.push(Delta {
        reasoning_tokens: 1,
        ..delta("Let me look.", 2)
    }));
    events.extend(out.push(Delta {
        tool_calls: vec![CallDelta {
            index: 0,
            name: Some("f".into()),
            arguments: "{\"a\":".into(),
        }],
        completion_tokens: 3,
        reasoning_tokens: 1,
        ..Delta::default()
    }));
    events.extend(out.push(Delta {
        tool_calls: vec![CallDelta {
            index: 0,
            name: None,
            arguments: " 1}".into(),
        }],
        finish_reason: Some("tool_calls"),
        completion_tokens: 4,
        reasoning_tokens: 1,
        ..Delta::default()
    }));
    let numbers: Vec<u64> = events
        .iter()
        .map(|e| e["sequence_number"].as_u64().expect("number"))
        .collect();
    assert_eq!(numbers, (0..events.len() as u64).collect::<Vec<_>>());
    assert_eq!(
        kinds(&events),
        [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.content_part.added",
            "response.reasoning_text.delta",
            "response.reasoning_text.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.output_item.added",
            "response.content_part.added",
            "response.output_text.delta",
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.output_item.added",
            "response.function_call_arguments.delta",
            "response.function_call_arguments.delta",
            "response.function_call_arguments.done",
            "response.output_item.done",
            "response.completed",
        ]
    );
    let response = out.finished();
    assert_eq!(response["status"], "completed");
    let output = &response["output"];
    assert_eq!(output[0]["id"], "rs_abc_0");
    assert_eq!(output[0]["content"][0]["text"], "hmm");
    assert_eq!(output[1]["id"], "msg_abc_1");
    assert_eq!(output[1]["content"][0]["text"], "Let me look.");
    assert_eq!(output[2]["id"], "fc_abc_2");
    assert_eq!(output[2]["call_id"], "call_abc_2");
    assert_eq!(output[2]["arguments"], "{\"a\": 1}");
    assert!(output
        .as_array()
        .expect("items")
        .iter()
        .all(|item| item["status"] == "completed"));
    let usage = &response["usage"];
    assert_eq!(usage["input_tokens"], 5);
    assert_eq!(usage["output_tokens"], 4);
    assert_eq!(usage["output_tokens_details"]["reasoning_tokens"], 1);
    assert_eq!(usage["total_tokens"], 9);
    assert_eq!(events.last().expect("last")["response"], response);
}

#[test]
fn a_cut_answer_is_incomplete_and_an_empty_one_is_an_empty_message() {
    let mut out = output();
    out.push(delta("Once", 1));
    let events = out.push(Delta {
        finish_reason: Some("length"),
        ..delta(" upon", 2)
    });
    assert_eq!(events.last().expect("last")["type"], "response.incomplete");
    let response = out.finished();
    assert_eq!(response["status"], "incomplete");
    assert_eq!(
        response["incomplete_details"]["reason"],
        "max_output_tokens"
    );
    assert_eq!(response["output"][0]["status"], "incomplete");
    assert_eq!(response["output"][0]["content"][0]["text"], "Once upon");

    let mut out = output();
    let events = out.push(Delta {
        finish_reason: Some("stop"),
        ..delta("", 1)
    });
    assert_eq!(
        kinds(&events),
        [
            "response.output_item.added",
            "response.content_part.added",
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.completed",
        ]
    );
    let response = out.finished();
    assert_eq!(response["output"][0]["type"], "message");
    assert_eq!(response["output"][0]["content"][0]["text"], "");
    assert_eq!(response["incomplete_details"], Value::Null);
}
