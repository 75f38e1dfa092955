//! `runit chat` fed from a pipe (rustyline reads plain lines then): slash commands are never
//! sent to the model, multi-line messages arrive whole, `/save` writes the conversation, and
//! a conversation larger than the context drops its oldest turns, keeps the system message
//! and still answers.

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};

fn chat(input: &str, args: &[&str]) -> (String, String) {
    let model = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/synth-qwen2-Q8_0.gguf");
    let home = Path::new(env!("CARGO_TARGET_TMPDIR")).join("chat-home");
    let mut child = Command::new(env!("CARGO_BIN_EXE_runit"))
        .arg("chat")
        .arg("-m")
        .arg(&model)
        .args(["--temperature", "0", "--threads", "1"])
        .args(args)
        .env("RUNIT_HOME", &home)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("runit starts");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(input.as_bytes())
        .expect("write the input");
    let output = child.wait_with_output().expect("runit ends");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    (
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

fn present() -> bool {
    let found = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../models/synth-qwen2-Q8_0.gguf")
        .exists();
    if !found {
        eprintln!("skipping: models/synth-qwen2-Q8_0.gguf is absent (scripts/make_requants.sh)");
    }
    found
}

/// Runs a chat on `lines`, then `/save`s it and sends `after`; returns stderr and the saved
/// messages (None when the model file is absent).
fn chat_and_save(
    lines: &str,
    after: &str,
    args: &[&str],
) -> Option<(String, Vec<serde_json::Value>)> {
    if !present() {
        return None;
    }
    let saved = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!(
        "chat-{}.json",
        std::thread::current()
            .name()
            .unwrap_or("test")
            .replace("::", "-")
    ));
    let _ = std::fs::remove_file(&saved);
    let input = format!("{lines}/save {}\n{after}", saved.display());
    let (_, stderr) = chat(&input, args);
    let conversation: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&saved).expect("saved conversation")).expect("JSON");
    Some((stderr, conversation.as_array().expect("array").clone()))
}

#[test]
fn commands_stay_out_of_the_conversation() {
    let lines = "/helpme\n/system Be brief.\nHello\n\"\"\"\nfirst line\nsecond line\n\"\"\"\n";
    let Some((stderr, conversation)) = chat_and_save(lines, "/bye\nnever read\n", &["-n", "4"])
    else {
        return;
    };
    assert!(stderr.contains("unknown command /helpme"), "{stderr}");
    let roles: Vec<&str> = conversation
        .iter()
        .map(|message| message["role"].as_str().expect("role"))
        .collect();
    assert_eq!(roles, ["system", "user", "assistant", "user", "assistant"]);
    assert_eq!(conversation[0]["content"], "Be brief.");
    assert_eq!(conversation[1]["content"], "Hello");
    assert_eq!(conversation[3]["content"], "first line\nsecond line");
}

#[test]
fn a_full_context_drops_the_oldest_turns_and_still_answers() {
    let lines = "one two three four five\nsix seven eight nine\nten eleven twelve\n";
    let args = ["-c", "64", "-n", "-1", "-sys", "Be brief."];
    let Some((stderr, messages)) = chat_and_save(lines, "", &args) else {
        return;
    };
    assert!(stderr.contains("dropped the"), "{stderr}");
    assert_eq!(
        messages[0]["role"], "system",
        "the system message was dropped"
    );
    let last = &messages[messages.len() - 1];
    assert_eq!(last["role"], "assistant");
    assert!(
        !last["content"].as_str().expect("text").is_empty(),
        "no answer after the drop"
    );
    assert_eq!(messages[messages.len() - 2]["content"], "ten eleven twelve");
}
