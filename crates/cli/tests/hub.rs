//! `runit pull`, `list`, `rm`, `-hf` and `-m NAME` against a local stand-in for the Hugging Face
//! Hub started by the test: the tree listing (`/api/models/{repo}/tree/{revision}`), `resolve`
//! URLs that redirect to a file host, Range requests, a download cut half-way, a wrong
//! checksum, a private repository (401 without the token), a repository without GGUF files.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::{Arc, Mutex};

use runit_gguf::{GgufFile, GgufWriter, Value};
use sha2::{Digest, Sha256};

const RUNIT: &str = env!("CARGO_BIN_EXE_runit");
const TOKEN: &str = "hf_test_secret";

/// What the stand-in hub serves and what it saw.
#[derive(Default)]
struct Hub {
    /// repo -> (path, bytes, listed sha256).
    repos: HashMap<String, Vec<(String, Vec<u8>, String)>>,
    /// Repositories that need `Authorization: Bearer TOKEN`.
    private: Vec<String>,
    /// File host paths whose next download stops half-way.
    cut_next: Vec<String>,
    /// Every request line, with its Range header when it had one.
    requests: Vec<String>,
}

fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect()
}

fn respond(stream: &mut TcpStream, status: &str, headers: &[(&str, String)], body: &[u8]) {
    let mut head = format!("HTTP/1.1 {status}\r\nConnection: close\r\n");
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    if !headers.iter().any(|(name, _)| *name == "Content-Length") {
        head.push_str(&format!("Content-Length: {}\r\n", body.len()));
    }
    head.push_str("\r\n");
    let _ = stream.write_all(head.as_bytes());
    let _ = stream.write_all(body);
}

fn serve_one(mut stream: TcpStream, hub: &Mutex<Hub>) {
    let mut reader = BufReader::new(stream.try_clone().expect("clone stream"));
    let mut request_line = String::new();
    if reader.read_line(&mut request_line).is_err() {
        return;
    }
    let mut headers = HashMap::new();
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).is_err() || line.trim().is_empty() {
            break;
        }
        if let Some((name, value)) = line.split_once(':') {
            headers.insert(name.trim().to_ascii_lowercase(), value.trim().to_string());
        }
    }
    let target = request_line
        .split_whitespace()
        .nth(1)
        .unwrap_or("/")
        .to_string();
    let path = target.split('?').next().unwrap_or("").to_string();
    let mut hub = hub.lock().expect("hub lock");
    hub.requests.push(match headers.get("range") {
        Some(range) => format!("{path} {range}"),
        None => path.clone(),
    });
    let authorized =
        headers.get("authorization").map(String::as_str) == Some(&*format!("Bearer {TOKEN}"));
    let repo_of = |rest: &str| {
        let mut parts = rest.splitn(3, '/');
        format!(
            "{}/{}",
            parts.next().unwrap_or(""),
            parts.next().unwrap_or("")
        )
    };
    if let Some(rest) = path.strip_prefix("/api/models/") {
        let repo = repo_of(rest);
        if hub.private.contains(&repo) && !authorized {
            return respond(
                &mut stream,
                "401 Unauthorized",
                &[],
                b"{\"error\":\"unauthorized\"}",
            );
        }
        let Some(files) = hub.repos.get(&repo) else {
            return respond(
                &mut stream,
                "404 Not Found",
                &[],
                b"{\"error\":\"not found\"}",
            );
        };
        let listing: Vec<serde_json::Value> = files
            .iter()
            .map(|(path, bytes, sha)| {
                let mut entry = serde_json::json!({"type": "file", "path": path, "size": bytes.len(), "oid": "0"});
                if path.ends_with(".gguf") {
                    entry["lfs"] = serde_json::json!({"oid": sha, "size": bytes.len(), "pointerSize": 134});
                }
                entry
            })
            .collect();
        let body = serde_json::to_vec(&listing).expect("JSON");
        return respond(
            &mut stream,
            "200 OK",
            &[("Content-Type", "application/json".into())],
            &body,
        );
    }
    if let Some(rest) = path.strip_prefix("/cdn/") {
        let Some((repo_path, file)) = rest.split_once("/-/") else {
            return respond(&mut stream, "404 Not Found", &[], b"");
        };
        let bytes = hub.repos[repo_path]
            .iter()
            .find(|(name, _, _)| name == file)
            .map(|(_, bytes, _)| bytes.clone())
            .expect("known file");
        let start = headers
            .get("range")
            .and_then(|range| range.strip_prefix("bytes="))
            .and_then(|range| range.trim_end_matches('-').parse::<usize>().ok());
        if let Some(at) = hub.cut_next.iter().position(|cut| cut == rest) {
            hub.cut_next.remove(at);
            // Promise the whole file, send half, hang up.
            let half = bytes.len() / 2;
            let head = format!(
                "HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: {}\r\n\r\n",
                bytes.len()
            );
            let _ = stream.write_all(head.as_bytes());
            let _ = stream.write_all(&bytes[..half]);
            let _ = stream.flush();
            return;
        }
        return match start {
            Some(start) => respond(
                &mut stream,
                "206 Partial Content",
                &[(
                    "Content-Range",
                    format!("bytes {start}-{}/{}", bytes.len() - 1, bytes.len()),
                )],
                &bytes[start..],
            ),
            None => respond(&mut stream, "200 OK", &[], &bytes),
        };
    }
    // /{owner}/{name}/resolve/{revision}/{path}: redirect to the file host, as the hub does.
    let rest = path.trim_start_matches('/');
    let repo = repo_of(rest);
    let Some(file) = rest
        .strip_prefix(&format!("{repo}/resolve/main/"))
        .map(str::to_string)
    else {
        return respond(&mut stream, "404 Not Found", &[], b"");
    };
    if hub.private.contains(&repo) && !authorized {
        return respond(&mut stream, "401 Unauthorized", &[], b"");
    }
    respond(
        &mut stream,
        "302 Found",
        &[("Location", format!("/cdn/{repo}/-/{file}"))],
        b"",
    );
}

/// Starts the stand-in hub on a free port; returns its endpoint.
fn start(hub: Arc<Mutex<Hub>>) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let endpoint = format!("http://{}", listener.local_addr().expect("address"));
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let hub = Arc::clone(&hub);
            std::thread::spawn(move || serve_one(stream, &hub));
        }
    });
    endpoint
}

fn model_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/synth-qwen2-Q4_0.gguf")
}

fn model_bytes() -> Option<Vec<u8>> {
    std::fs::read(model_path()).ok()
}

/// The model as two split parts, as llama.cpp's gguf-split writes them: the first with the
/// metadata and half of the tensors, the second with the rest; each carries the split keys.
fn split_in_two(path: &Path) -> (Vec<u8>, Vec<u8>) {
    let file = GgufFile::open(path).expect("model");
    let tensors = file.tensors();
    let half = tensors.len() / 2;
    let part = |number: u16, range: std::ops::Range<usize>| {
        let mut writer = GgufWriter::new();
        if number == 0 {
            for (key, value) in file.metadata() {
                writer
                    .add_metadata(key.clone(), value.clone())
                    .expect("key");
            }
        }
        writer
            .add_metadata("split.no", Value::U16(number))
            .expect("key");
        writer
            .add_metadata("split.count", Value::U16(2))
            .expect("key");
        writer
            .add_metadata("split.tensors.count", Value::I32(tensors.len() as i32))
            .expect("key");
        for info in &tensors[range.clone()] {
            writer
                .add_tensor(info.name.clone(), info.ty, info.shape.clone())
                .expect("tensor");
        }
        let mut out = Vec::new();
        writer
            .write(&mut out, |index, _| {
                Ok(std::borrow::Cow::Borrowed(
                    file.tensor_data(&tensors[range.start + index]),
                ))
            })
            .expect("write");
        out
    };
    (part(0, 0..half), part(1, half..tensors.len()))
}

struct Runit {
    home: PathBuf,
    endpoint: String,
}

impl Runit {
    fn new(name: &str, endpoint: &str) -> Runit {
        let home = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("hub-{name}"));
        let _ = std::fs::remove_dir_all(&home);
        Runit {
            home,
            endpoint: endpoint.to_string(),
        }
    }

    fn run(&self, args: &[&str], token: Option<&str>) -> Output {
        let mut command = Command::new(RUNIT);
        command
            .args(args)
            .env("RUNIT_HOME", &self.home)
            .env("HF_ENDPOINT", &self.endpoint)
            .env_remove("HF_TOKEN");
        if let Some(token) = token {
            command.env("HF_TOKEN", token);
        }
        command.output().expect("runit runs")
    }

    /// Runs with a file-size limit of `blocks` × 512 bytes (RLIMIT_FSIZE through dash's
    /// `ulimit -f`, SIGXFSZ ignored): writes past it fail as they do on a full disk.
    fn run_on_a_small_disk(&self, args: &[&str], blocks: u64) -> Output {
        Command::new("sh")
            .arg("-c")
            .arg(format!(
                "trap '' XFSZ; ulimit -f {blocks}; exec \"$0\" \"$@\""
            ))
            .arg(RUNIT)
            .args(args)
            .env("RUNIT_HOME", &self.home)
            .env("HF_ENDPOINT", &self.endpoint)
            .env_remove("HF_TOKEN")
            .output()
            .expect("runit runs")
    }
}

fn text(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

#[test]
fn an_interrupted_pull_resumes_and_the_cache_serves_every_command() {
    let Some(bytes) = model_bytes() else {
        eprintln!("skipping: models/synth-qwen2-Q4_0.gguf is absent (scripts/make_requants.sh)");
        return;
    };
    let (first, second) = split_in_two(&model_path());
    let hub = Arc::new(Mutex::new(Hub::default()));
    {
        let mut hub = hub.lock().expect("lock");
        let sha = sha256_hex(&bytes);
        hub.repos.insert(
            "test/tiny-GGUF".into(),
            vec![
                ("README.md".into(), b"# tiny".to_vec(), String::new()),
                ("tiny-Q4_0.gguf".into(), bytes.clone(), sha.clone()),
                (
                    "sub/tiny-Q8_0-00001-of-00002.gguf".into(),
                    first.clone(),
                    sha256_hex(&first),
                ),
                (
                    "sub/tiny-Q8_0-00002-of-00002.gguf".into(),
                    second.clone(),
                    sha256_hex(&second),
                ),
            ],
        );
        hub.cut_next.push("test/tiny-GGUF/-/tiny-Q4_0.gguf".into());
    }
    let runit = Runit::new("resume", &start(Arc::clone(&hub)));

    let first = runit.run(&["pull", "test/tiny-GGUF:q4_0"], None);
    assert_eq!(first.status.code(), Some(1), "{}", text(&first));
    assert!(text(&first).contains("resume"), "{}", text(&first));
    let listed = runit.run(&["list"], None);
    assert!(
        text(&listed).contains("no cached models"),
        "a half download is listed: {}",
        text(&listed)
    );

    let second = runit.run(&["pull", "test/tiny-GGUF:q4_0"], None);
    assert!(second.status.success(), "{}", text(&second));
    let requests = hub.lock().expect("lock").requests.clone();
    let half = bytes.len() / 2;
    assert!(
        requests.iter().any(
            |request| *request == format!("/cdn/test/tiny-GGUF/-/tiny-Q4_0.gguf bytes={half}-")
        ),
        "no resumed Range request: {requests:?}"
    );
    let path = String::from_utf8_lossy(&second.stdout).trim().to_string();
    assert_eq!(std::fs::read(&path).expect("pulled file"), bytes);

    let listed = runit.run(&["list"], None);
    let listing = text(&listed);
    assert!(
        listing.contains("test/tiny-GGUF:Q4_0")
            && listing.contains("qwen2")
            && listing.contains("KiB"),
        "{listing}"
    );

    // -m NAME and -hf use the cached copy without asking the hub.
    let before = hub.lock().expect("lock").requests.len();
    for model_flag in [
        ["-m", "test/tiny-GGUF:Q4_0"],
        ["-hf", "test/tiny-GGUF:Q4_0"],
    ] {
        let generated = runit.run(
            &[
                "generate",
                model_flag[0],
                model_flag[1],
                "-p",
                "Hello",
                "-n",
                "2",
                "--temperature",
                "0",
            ],
            None,
        );
        assert!(
            generated.status.success(),
            "{model_flag:?}: {}",
            text(&generated)
        );
    }
    assert_eq!(
        hub.lock().expect("lock").requests.len(),
        before,
        "the hub was asked again"
    );

    // A split model: its parts are joined into the file it was split from.
    let split = runit.run(&["pull", "test/tiny-GGUF:Q8_0"], None);
    assert!(split.status.success(), "{}", text(&split));
    let folder = runit.home.join("models/test/tiny-GGUF/Q8_0");
    assert_eq!(
        std::fs::read(folder.join("tiny-Q8_0.gguf")).expect("merged"),
        bytes
    );
    assert!(!folder.join("tiny-Q8_0-00001-of-00002.gguf").exists());
    let again = runit.run(&["pull", "test/tiny-GGUF:Q8_0"], None);
    assert!(text(&again).contains("up to date"), "{}", text(&again));
    let verified = runit.run(&["list", "--verify"], None);
    assert!(verified.status.success(), "{}", text(&verified));

    // A corrupted file is found by --verify; rm deletes the model.
    let mut corrupted = bytes.clone();
    corrupted[bytes.len() - 1] ^= 1;
    std::fs::write(&path, &corrupted).expect("corrupt");
    let verified = runit.run(&["list", "--verify"], None);
    assert_eq!(verified.status.code(), Some(1), "{}", text(&verified));
    assert!(text(&verified).contains("sha256"), "{}", text(&verified));
    for name in ["test/tiny-GGUF:Q4_0", "test/tiny-GGUF:Q8_0"] {
        let removed = runit.run(&["rm", name], None);
        assert!(removed.status.success(), "{}", text(&removed));
    }
    assert!(text(&runit.run(&["list"], None)).contains("no cached models"));
    let missing = runit.run(&["rm", "test/tiny-GGUF:Q4_0"], None);
    assert_eq!(missing.status.code(), Some(1));
}

#[test]
fn a_disk_that_fills_keeps_the_partial_file_and_installs_nothing() {
    let Some(bytes) = model_bytes() else {
        eprintln!("skipping: models/synth-qwen2-Q4_0.gguf is absent (scripts/make_requants.sh)");
        return;
    };
    let hub = Arc::new(Mutex::new(Hub::default()));
    hub.lock().expect("lock").repos.insert(
        "test/full-GGUF".into(),
        vec![("tiny-Q4_0.gguf".into(), bytes.clone(), sha256_hex(&bytes))],
    );
    let runit = Runit::new("full-disk", &start(Arc::clone(&hub)));
    // 256 KiB fit, the file (about 1 MiB) does not.
    let full = runit.run_on_a_small_disk(&["pull", "test/full-GGUF:Q4_0"], 512);
    assert_eq!(full.status.code(), Some(1), "{}", text(&full));
    assert!(
        text(&full).contains("cannot write") && text(&full).contains("free space"),
        "{}",
        text(&full)
    );
    let folder = runit.home.join("models/test/full-GGUF/Q4_0");
    let partial = folder.join("tiny-Q4_0.gguf.partial");
    let kept = std::fs::metadata(&partial)
        .map(|meta| meta.len())
        .unwrap_or(0);
    assert_eq!(kept, 256 * 1024, "the partial file holds what was written");
    assert!(
        !folder.join("tiny-Q4_0.gguf").exists(),
        "a half file was installed"
    );
    let listed = runit.run(&["list"], None);
    assert!(
        text(&listed).contains("no cached models"),
        "{}",
        text(&listed)
    );

    // With space again the same command resumes from the kept bytes.
    let resumed = runit.run(&["pull", "test/full-GGUF:Q4_0"], None);
    assert!(resumed.status.success(), "{}", text(&resumed));
    let requests = hub.lock().expect("lock").requests.clone();
    assert!(
        requests
            .iter()
            .any(|request| request.ends_with(&format!("bytes={kept}-"))),
        "no resumed Range request: {requests:?}"
    );
    assert_eq!(
        std::fs::read(folder.join("tiny-Q4_0.gguf")).expect("pulled file"),
        bytes
    );
}

#[test]
fn bad_repositories_and_tags_are_clear_errors() {
    let bytes = b"GGUF not really a model".to_vec();
    let hub = Arc::new(Mutex::new(Hub::default()));
    {
        let mut hub = hub.lock().expect("lock");
        hub.repos.insert(
            "test/bad-sum".into(),
            vec![("m-Q4_K_M.gguf".into(), bytes.clone(), "0".repeat(64))],
        );
        hub.repos.insert(
            "test/no-gguf".into(),
            vec![("model.safetensors".into(), bytes.clone(), String::new())],
        );
        hub.repos.insert(
            "test/private".into(),
            vec![("m-Q4_K_M.gguf".into(), bytes.clone(), sha256_hex(&bytes))],
        );
        hub.private.push("test/private".into());
    }
    let runit = Runit::new("errors", &start(hub));

    let wrong = runit.run(&["pull", "test/bad-sum"], None);
    assert_eq!(wrong.status.code(), Some(1));
    assert!(text(&wrong).contains("does not match"), "{}", text(&wrong));
    let folder = runit.home.join("models/test/bad-sum/Q4_K_M");
    assert!(
        !folder.join("m-Q4_K_M.gguf").exists() && !folder.join("m-Q4_K_M.gguf.partial").exists()
    );

    let no_gguf = runit.run(&["pull", "test/no-gguf"], None);
    assert_eq!(no_gguf.status.code(), Some(1));
    assert!(
        text(&no_gguf).contains("no GGUF model file"),
        "{}",
        text(&no_gguf)
    );

    let no_match = runit.run(&["pull", "test/private:Q8_0"], Some(TOKEN));
    assert_eq!(no_match.status.code(), Some(1));
    assert!(
        text(&no_match).contains("matches the quant `Q8_0`")
            && text(&no_match).contains("test/private:Q4_K_M"),
        "{}",
        text(&no_match)
    );

    let refused = runit.run(&["pull", "test/private"], None);
    assert_eq!(refused.status.code(), Some(1));
    assert!(text(&refused).contains("HF_TOKEN"), "{}", text(&refused));
    let allowed = runit.run(&["pull", "test/private"], Some(TOKEN));
    assert!(allowed.status.success(), "{}", text(&allowed));

    let bad_name = runit.run(&["pull", "not-a-repo"], None);
    assert_eq!(bad_name.status.code(), Some(1));
    assert!(
        text(&bad_name).contains("OWNER/NAME"),
        "{}",
        text(&bad_name)
    );
}

#[test]
fn llama_cpp_flags_are_read_or_refused_clearly() {
    let misspelled = Command::new(RUNIT)
        .args(["generate", "-tmep", "0.5"])
        .output()
        .expect("runs");
    assert_eq!(misspelled.status.code(), Some(2));
    assert!(
        text(&misspelled).contains("did you mean `--temp"),
        "{}",
        text(&misspelled)
    );
    let hf_help = Command::new(RUNIT)
        .args(["generate", "-hf"])
        .output()
        .expect("runs");
    assert_ne!(
        hf_help.status.code(),
        Some(0),
        "-hf without a value must not print the help and succeed"
    );
    if !cfg!(feature = "cuda") {
        let ngl = Command::new(RUNIT)
            .args(["generate", "-m", "x.gguf", "-ngl", "99", "-p", "hi"])
            .output()
            .expect("runs");
        assert_eq!(ngl.status.code(), Some(1));
        assert!(text(&ngl).contains("without CUDA"), "{}", text(&ngl));
    }
}

/// The body reader of a download sees the hub's bytes, not a partially read buffer.
#[test]
fn the_stand_in_hub_answers_ranges() {
    let hub = Arc::new(Mutex::new(Hub::default()));
    hub.lock().expect("lock").repos.insert(
        "a/b".into(),
        vec![("f.gguf".into(), b"0123456789".to_vec(), String::new())],
    );
    let endpoint = start(hub);
    let mut stream = TcpStream::connect(endpoint.trim_start_matches("http://")).expect("connect");
    stream
        .write_all(b"GET /cdn/a/b/-/f.gguf HTTP/1.1\r\nRange: bytes=4-\r\n\r\n")
        .expect("write");
    let mut answer = String::new();
    stream.read_to_string(&mut answer).expect("read");
    assert!(
        answer.starts_with("HTTP/1.1 206") && answer.ends_with("456789"),
        "{answer}"
    );
}
