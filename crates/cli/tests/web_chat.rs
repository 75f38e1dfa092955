//! The chat page at `/` of `runit serve`, in a real browser: Debian's headless Chromium loads
//! `/?send=Hello` (the page sends that message once it is up), the test reads the page's DOM
//! after the streamed answer has arrived, and a screenshot is saved to
//! `target/web-chat.png`. Without Chromium the test says so and passes, unless
//! `RUNIT_REQUIRE_BROWSER=1` (scripts/test.sh installs Chromium and sets it).

mod serve_harness;

use std::path::{Path, PathBuf};
use std::process::Command;

use serve_harness::{synthetic_model, Server};

fn chromium() -> Option<PathBuf> {
    ["chromium", "chromium-browser", "google-chrome"]
        .into_iter()
        .find_map(|name| {
            let found = Command::new("which").arg(name).output().ok()?;
            let path = String::from_utf8_lossy(&found.stdout).trim().to_string();
            (found.status.success() && !path.is_empty()).then(|| PathBuf::from(path))
        })
}

fn browser(chromium: &Path, profile: &Path, args: &[&str]) -> std::process::Output {
    Command::new(chromium)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--no-first-run",
            "--window-size=1000,700",
            "--virtual-time-budget=20000",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(args)
        .output()
        .expect("chromium runs")
}

#[test]
fn the_chat_page_streams_an_answer_in_a_browser() {
    let Some(chromium) = chromium() else {
        assert!(
            std::env::var_os("RUNIT_REQUIRE_BROWSER").is_none(),
            "RUNIT_REQUIRE_BROWSER is set but no Chromium was found"
        );
        eprintln!("skipping: no chromium on PATH (apt-get install chromium)");
        return;
    };
    let Some(model) = synthetic_model() else {
        eprintln!("skipping: models/synth-qwen2-Q8_0.gguf is absent (scripts/make_requants.sh)");
        return;
    };
    let server = Server::start(&model, &["--ctx-size", "256"]);
    let (status, page) = server.request("GET", "/", "").expect("GET /");
    assert_eq!(status, 200);
    let page = String::from_utf8_lossy(&page);
    assert!(page.contains("/v1/chat/completions") && page.contains("localStorage"));

    let url = format!("http://127.0.0.1:{}/?send=Hello", server.port);
    let scratch = Path::new(env!("CARGO_TARGET_TMPDIR")).join("web-chat");
    let _ = std::fs::remove_dir_all(&scratch);
    std::fs::create_dir_all(&scratch).expect("scratch folder");
    // Headless Chromium's virtual time may end the page (and dump it) while the streamed
    // answer is still arriving (the Send button still disabled): dump again, with a fresh
    // profile, until the page has finished answering.
    let mut attempt = 0;
    let (dom, dom_text) = loop {
        let dom = browser(
            &chromium,
            &scratch.join(format!("profile-dom-{attempt}")),
            &["--dump-dom", &url],
        );
        let text = String::from_utf8_lossy(&dom.stdout).into_owned();
        let answering = text.contains(r#"id="send" type="submit" disabled"#);
        attempt += 1;
        if !answering || attempt == 8 {
            break (dom, text);
        }
    };
    assert!(
        dom.status.success(),
        "chromium: {}",
        String::from_utf8_lossy(&dom.stderr)
    );
    assert!(
        dom_text.contains("tokens of context"),
        "the model line is missing:\n{dom_text}"
    );
    assert!(
        dom_text.contains(r#"class="msg user""#) && dom_text.contains("Hello"),
        "{dom_text}"
    );
    // The answer's bubble holds streamed text after its role line.
    let answer = dom_text
        .split(r#"<div class="msg assistant">"#)
        .nth(1)
        .and_then(|rest| rest.split("</div></div>").next())
        .unwrap_or_else(|| panic!("no answer in the page:\n{dom_text}"));
    let text = answer
        .split("</div>")
        .nth(1)
        .unwrap_or("")
        .replace("<p>", "")
        .replace("</p>", "");
    assert!(!text.trim().is_empty(), "the answer is empty:\n{dom_text}");
    assert!(!answer.contains("Error:"), "{answer}");

    let screenshot = Path::new(env!("CARGO_TARGET_TMPDIR")).join("../web-chat.png");
    let shot = browser(
        &chromium,
        &scratch.join("profile-shot"),
        &[&format!("--screenshot={}", screenshot.display()), &url],
    );
    assert!(
        shot.status.success(),
        "{}",
        String::from_utf8_lossy(&shot.stderr)
    );
    assert!(std::fs::metadata(&screenshot).is_ok_and(|meta| meta.len() > 1000));
    eprintln!("screenshot: {}", screenshot.display());
}
