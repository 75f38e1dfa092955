//! `runit serve` as a real process under the official `openai` Python client
//! (crates/server/tests/openai_client.py), in a venv created under the target directory;
//! skipped with a notice when Python cannot provide one, except under `CI`.

mod serve_harness;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

use serve_harness::{smollm2_model, synthetic_model, workspace, Server};

/// A venv under the target directory with `openai` installed, or `None` (with a notice)
/// when Python cannot provide one outside CI. Set up once per run: the tests run in parallel.
fn python_with_openai() -> Option<PathBuf> {
    static PYTHON: OnceLock<Option<PathBuf>> = OnceLock::new();
    PYTHON.get_or_init(set_up_venv).clone()
}

fn set_up_venv() -> Option<PathBuf> {
    let venv = Path::new(env!("CARGO_TARGET_TMPDIR")).join("openai-venv");
    let python = venv.join("bin/python");
    let ready = |python: &Path| {
        Command::new(python)
            .args(["-c", "import openai"])
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|status| status.success())
    };
    if python.exists() && ready(&python) {
        return Some(python);
    }
    let mut create = Command::new("python3");
    create.args(["-m", "venv"]).arg(&venv);
    let mut install = Command::new(&python);
    install.args(["-m", "pip", "install", "--quiet", "openai"]);
    for mut step in [create, install] {
        if !step.status().is_ok_and(|status| status.success()) {
            let notice = format!("skipping: {step:?} failed, so there is no venv with openai");
            assert!(
                std::env::var_os("CI").is_none(),
                "{notice} (required under CI)"
            );
            eprintln!("{notice}");
            return None;
        }
    }
    ready(&python).then_some(python)
}

fn run_client(python: &Path, server: &Server, suite: &str) {
    let script = workspace().join("crates/server/tests/openai_client.py");
    let status = Command::new(python)
        .arg(script)
        .args(["--base-url", &server.base_url(), "--suite", suite])
        .status()
        .expect("python runs");
    assert!(
        status.success(),
        "the openai client checks failed ({suite})"
    );
}

#[test]
fn openai_client_on_the_synthetic_model() {
    let Some(model) = synthetic_model() else {
        return;
    };
    let Some(python) = python_with_openai() else {
        return;
    };
    let server = Server::start(&model, &["--parallel", "8"]);
    run_client(&python, &server, "full");
}

#[test]
fn openai_client_smoke_on_smollm2() {
    let Some(model) = smollm2_model() else {
        return;
    };
    let Some(python) = python_with_openai() else {
        return;
    };
    let server = Server::start(&model, &["--ctx-size", "512"]);
    run_client(&python, &server, "smoke");
}

#[test]
fn openai_client_tool_loop_on_smollm2() {
    let Some(model) = smollm2_model() else {
        return;
    };
    let Some(python) = python_with_openai() else {
        return;
    };
    let template = workspace().join("crates/server/tests/data/templates/hermes.jinja");
    let template = template.to_str().expect("a UTF-8 path");
    let server = Server::start(
        &model,
        &["--ctx-size", "1024", "--chat-template-file", template],
    );
    run_client(&python, &server, "tools");
}
