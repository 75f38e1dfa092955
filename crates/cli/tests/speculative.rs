//! The speculation flags of `runit generate` and `runit bench`: prompt lookup and a draft
//! model give the greedy tokens of plain decoding and report their drafts; bad settings
//! (`--draft-max 0`, draft flags without a drafter, a draft model of another vocabulary)
//! are clean errors; `bench` with a drafter prints the acceptance and the speed-up;
//! `serve -md` drafts each sequence with the draft model and answers as without it.

mod serve_harness;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serve_harness::Server;

/// A synthetic model made by scripts/make_requants.sh.
fn golden_model(name: &str) -> PathBuf {
    serve_harness::workspace().join("models").join(name)
}

fn runit(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_runit"))
        .args(args)
        .output()
        .expect("runit runs")
}

fn generate(extra: &[&str]) -> Output {
    let model = golden_model("synth-qwen2-Q8_0.gguf");
    let mut args = vec!["generate", "-m", model.to_str().expect("utf-8 path")];
    args.extend(["-p", "one two three one two three one two", "-n", "24"]);
    args.extend(["--temperature", "0", "--output-format", "json"]);
    args.extend(extra);
    runit(&args)
}

fn json(out: &Output) -> serde_json::Value {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("one JSON object")
}

fn error(out: &Output) -> String {
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn drafters_keep_the_greedy_tokens_and_report_their_drafts() {
    let plain = json(&generate(&[]));
    assert!(plain["speculation"].is_null());
    let draft = golden_model("synth-qwen2-Q4_0.gguf");
    let draft = draft.to_str().expect("utf-8 path");
    for flags in [
        &["--draft-ngram", "2"][..],
        &["-md", draft, "--draft-p-min", "0"],
    ] {
        let speculative = json(&generate(flags));
        assert_eq!(speculative["tokens"], plain["tokens"], "{flags:?}");
        let drafted = speculative["speculation"]["drafted"].as_u64();
        assert!(drafted.is_some_and(|n| n > 0), "{flags:?}: {speculative}");
    }
}

#[test]
fn bad_speculation_settings_are_clean_errors() {
    let stderr = error(&generate(&["--draft-ngram", "2", "--draft-max", "0"]));
    assert!(stderr.contains("draft_max"), "{stderr}");
    let stderr = error(&generate(&["--draft-max", "4"]));
    assert!(stderr.contains("need a drafter"), "{stderr}");
    let stderr = error(&generate(&["--draft-ngram", "0"]));
    assert!(stderr.contains("draft_ngram"), "{stderr}");
    let smollm2 =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/SmolLM2-135M-Instruct.Q4_1.gguf");
    if smollm2.exists() {
        let stderr = error(&generate(&["-md", smollm2.to_str().expect("utf-8 path")]));
        assert!(stderr.contains("vocabulary"), "{stderr}");
    }
}

#[test]
fn bench_prints_acceptance_and_speed_up_side_by_side() {
    let dir = std::env::temp_dir().join(format!("runit-spec-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let prompt = dir.join("prompt.txt");
    std::fs::write(&prompt, "a b c d a b c d a b c d a b").expect("prompt file");
    let model = golden_model("synth-qwen2-Q8_0.gguf");
    let out = runit(&[
        "bench",
        "-m",
        model.to_str().expect("utf-8 path"),
        "--draft-ngram",
        "2",
        "--prompt-file",
        prompt.to_str().expect("utf-8 path"),
        "-n",
        "16",
        "-r",
        "1",
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("| speed-up |") && stdout.contains("| acceptance |"),
        "{stdout}"
    );
    assert!(stdout.contains("| all | ngram 2 |"), "{stdout}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn serve_drafts_with_a_draft_model_and_answers_as_without_it() {
    let target = golden_model("synth-qwen2-Q8_0.gguf");
    let draft = golden_model("synth-qwen2-Q4_0.gguf");
    if !target.exists() || !draft.exists() {
        eprintln!("skipping: the synthetic models are absent (scripts/make_requants.sh)");
        return;
    }
    let draft = draft.to_str().expect("utf-8 path");
    let plain = Server::start(&target, &["--ctx-size", "512", "--parallel", "2"]);
    let drafting = Server::start(
        &target,
        &[
            "--ctx-size",
            "512",
            "--parallel",
            "2",
            "-md",
            draft,
            "--draft-p-min",
            "0",
        ],
    );
    let body =
        r#"{"prompt": "one two three one two three one two", "max_tokens": 24, "temperature": 0}"#;
    let answer = |server: &Server| {
        let (status, reply) = server
            .request("POST", "/v1/completions", body)
            .expect("completion");
        let reply: serde_json::Value = serde_json::from_slice(&reply).expect("JSON");
        assert_eq!(status, 200, "{reply}");
        reply
    };
    let (expected, drafted) = (answer(&plain), answer(&drafting));
    assert_eq!(
        drafted["choices"][0]["text"],
        expected["choices"][0]["text"]
    );
    let details = &drafted["usage"]["completion_tokens_details"];
    let counted = details["accepted_prediction_tokens"].as_u64().unwrap_or(0)
        + details["rejected_prediction_tokens"].as_u64().unwrap_or(0);
    assert!(counted > 0, "no drafts were verified: {drafted}");
    // Two requests at once: each sequence drafts in its own draft session.
    let both = std::thread::scope(|scope| {
        let first = scope.spawn(|| answer(&drafting));
        let second = answer(&drafting);
        (first.join().expect("first request"), second)
    });
    for reply in [both.0, both.1] {
        assert_eq!(reply["choices"][0]["text"], expected["choices"][0]["text"]);
    }
}
