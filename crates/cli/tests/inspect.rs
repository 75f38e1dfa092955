//! `runit inspect` against the golden inventory: the JSON report lists every tensor with the
//! types tests/golden/MODELS.json records, and a bad file is a clean error (exit code 1).

use std::path::Path;
use std::process::Command;

fn golden() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/golden")
}

#[test]
fn json_report_matches_the_inventory() {
    let inventory: serde_json::Value =
        serde_json::from_slice(&std::fs::read(golden().join("MODELS.json")).expect("MODELS.json"))
            .expect("JSON");
    let mut checked = 0;
    for entry in inventory.as_array().expect("array") {
        let name = entry["file"].as_str().expect("file");
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../models")
            .join(name);
        if !path.exists() {
            continue;
        }
        let out = Command::new(env!("CARGO_BIN_EXE_runit"))
            .args(["inspect", "--json"])
            .arg(&path)
            .output()
            .expect("runit runs");
        assert!(
            out.status.success(),
            "{name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let report: serde_json::Value =
            serde_json::from_slice(&out.stdout).expect("one JSON object");
        assert_eq!(report["architecture"], entry["arch"], "{name}");
        let tensors = report["tensors"].as_array().expect("tensors");
        assert_eq!(
            tensors.len() as u64,
            entry["n_tensors"].as_u64().expect("n_tensors"),
            "{name}"
        );
        for t in tensors {
            let tname = t["name"].as_str().expect("name");
            assert_eq!(t["type"], entry["tensor_types"][tname], "{name}: {tname}");
        }
        assert_eq!(report["totals"]["file_size"], entry["size"], "{name}");
        checked += 1;
    }
    println!("inspected {checked} golden model files");
    assert!(checked >= 10);
}

#[test]
fn a_bad_file_is_a_clean_error() {
    let dir = std::env::temp_dir().join(format!("runit-inspect-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let bad = dir.join("bad.gguf");
    std::fs::write(&bad, b"GGUF\x03\x00\x00\x00\xff\xff").expect("write");
    let out = Command::new(env!("CARGO_BIN_EXE_runit"))
        .args(["inspect"])
        .arg(&bad)
        .output()
        .expect("runit runs");
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.starts_with("error: ") && stderr.contains("bad.gguf"),
        "{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
    let _ = std::fs::remove_dir_all(&dir);
}
