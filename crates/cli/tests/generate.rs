//! `runit generate --prompt-ids`: a token-id prompt is evaluated exactly as given (the same
//! completion as the text that tokenizes to those ids), and an id outside the vocabulary is a
//! clean error (exit code 1); `--ignore-eos` generates past the end-of-generation token.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn model() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/synth-qwen2-Q8_0.gguf")
}

fn generate(prompt: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_runit"))
        .arg("generate")
        .arg("-m")
        .arg(model())
        .args(prompt)
        .args(["-n", "8", "--temperature", "0", "--output-format", "json"])
        .output()
        .expect("runit runs")
}

fn json(out: &Output) -> serde_json::Value {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("one JSON object")
}

#[test]
fn token_ids_replay_the_tokenized_prompt() {
    let text = json(&generate(&[
        "-p",
        "<|im_start|>user\nWhat is 2+2?<|im_end|>\n",
    ]));
    let ids: Vec<String> = text["prompt_ids"]
        .as_array()
        .expect("prompt_ids")
        .iter()
        .map(|id| id.to_string())
        .collect();
    let replay = json(&generate(&["--prompt-ids", &ids.join(",")]));
    assert_eq!(replay["prompt_ids"], text["prompt_ids"]);
    assert_eq!(replay["tokens"], text["tokens"]);
}

#[test]
fn an_id_outside_the_vocabulary_is_a_clean_error() {
    let out = generate(&["--prompt-ids", "1,2,4000000"]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("4000000") && stderr.contains("vocabulary"),
        "{stderr}"
    );
}

/// `--ignore-eos` generates all `-n` tokens past the end-of-turn token that stops the plain
/// run.
#[test]
fn ignore_eos_generates_every_requested_token() {
    let smollm2 =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/SmolLM2-135M-Instruct.Q4_1.gguf");
    if !smollm2.exists() {
        eprintln!("skipping: {} is absent", smollm2.display());
        return;
    }
    let run = |extra: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_runit"))
            .args(["generate", "-m"])
            .arg(&smollm2)
            .args([
                "--chat",
                "-p",
                "Reply with one word: yes or no. Is the sky blue?",
            ])
            .args(["-n", "24", "--temperature", "0", "--output-format", "json"])
            .args(extra)
            .output()
            .expect("runit runs");
        json(&out)
    };
    let plain = run(&[]);
    assert_eq!(plain["stop"], "eos", "{plain}");
    let ignoring = run(&["--ignore-eos"]);
    assert_eq!(ignoring["stop"], "limit", "{ignoring}");
    assert_eq!(ignoring["tokens"].as_array().map(Vec::len), Some(24));
    let plain_tokens = plain["tokens"].as_array().expect("tokens");
    assert_eq!(
        &ignoring["tokens"].as_array().expect("tokens")[..plain_tokens.len()],
        &plain_tokens[..]
    );
}

/// `--batch-invariant` names `--exact`: accepted by every model command, and on the CPU (always
/// exact and batch-invariant) the same tokens as without it.
#[test]
fn batch_invariant_is_the_exact_mode() {
    let prompt = ["-p", "<|im_start|>user\nName a colour.<|im_end|>\n"];
    let plain = json(&generate(&prompt));
    let invariant = json(&generate(&[prompt[0], prompt[1], "--batch-invariant"]));
    assert_eq!(invariant["tokens"], plain["tokens"]);
    let help = Command::new(env!("CARGO_BIN_EXE_runit"))
        .args(["serve", "--help"])
        .output()
        .expect("runit runs");
    let help = String::from_utf8_lossy(&help.stdout);
    assert!(help.contains("--batch-invariant"), "{help}");
}
