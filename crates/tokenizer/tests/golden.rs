//! Token-exact agreement with llama.cpp on every vector of `tests/golden/tokenizer/`.
//! A test whose vocabulary file is absent prints a notice and passes.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use runit_gguf::GgufFile;
use runit_tokenizer::Tokenizer;
use serde_json::Value;

fn golden_dir() -> PathBuf {
    Path::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../tests/golden/tokenizer"
    ))
    .to_path_buf()
}

fn models_dir() -> PathBuf {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../../models")).to_path_buf()
}

fn load(path: &Path) -> Option<Tokenizer> {
    if !path.exists() {
        println!(
            "skipping: {} is absent (run scripts/fetch_models.py)",
            path.display()
        );
        return None;
    }
    let file = GgufFile::open(path).expect("gguf opens");
    Some(Tokenizer::from_gguf(&file).expect("tokenizer loads"))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

fn from_hex(text: &str) -> Vec<u8> {
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&text[i..i + 2], 16).expect("hex"))
        .collect()
}

fn ids_of(value: &Value) -> Vec<u32> {
    value
        .as_array()
        .expect("ids array")
        .iter()
        .map(|id| id.as_u64().expect("id") as u32)
        .collect()
}

/// Checks one record: ids, each piece, and the decoded bytes. Returns whether all agree.
fn check(
    tokenizer: &Tokenizer,
    label: &str,
    text: &[u8],
    add_special: bool,
    parse_special: bool,
    record: &Value,
) -> bool {
    let expected = ids_of(&record["ids"]);
    let ids = tokenizer.encode_bytes(text, add_special, parse_special);
    let mut ok = ids == expected;
    if !ok {
        println!("MISMATCH {label} add_special={add_special} parse_special={parse_special} text={:?}\n  expected {expected:?}\n  found    {ids:?}", String::from_utf8_lossy(text));
    }
    if let Some(pieces) = record["pieces_hex"].as_array() {
        let pieces: Vec<String> = pieces
            .iter()
            .map(|piece| piece.as_str().expect("hex").to_string())
            .collect();
        let found: Vec<String> = expected
            .iter()
            .map(|&id| hex(tokenizer.token_piece(id).expect("id in vocab")))
            .collect();
        if found != pieces {
            println!(
                "PIECE MISMATCH {label} {:?}\n  expected {pieces:?}\n  found    {found:?}",
                String::from_utf8_lossy(text)
            );
            ok = false;
        }
        let decoded = tokenizer.decode(&expected).expect("ids in vocab");
        if decoded != from_hex(&pieces.concat()) {
            println!(
                "DECODE MISMATCH {label} {:?}",
                String::from_utf8_lossy(text)
            );
            ok = false;
        }
    }
    ok
}

#[test]
fn real_vocabulary_vectors() {
    let text =
        std::fs::read_to_string(golden_dir().join("tokenizer_vectors.jsonl")).expect("golden file");
    let mut tokenizers: HashMap<String, Option<Tokenizer>> = HashMap::new();
    let (mut matched, mut total, mut skipped) = (0, 0, 0);
    for line in text.lines() {
        let record: Value = serde_json::from_str(line).expect("json line");
        let model_file = record["model_file"]
            .as_str()
            .expect("model_file")
            .to_string();
        let tokenizer = tokenizers
            .entry(model_file.clone())
            .or_insert_with(|| load(&models_dir().join(&model_file)));
        let Some(tokenizer) = tokenizer else {
            skipped += 1;
            continue;
        };
        let bytes = from_hex(record["text_utf8_hex"].as_str().expect("hex"));
        let add_special = record["add_special"].as_bool().expect("flag");
        let parse_special = record["parse_special"].as_bool().expect("flag");
        total += 1;
        if check(
            tokenizer,
            record["tokenizer"].as_str().unwrap_or("?"),
            &bytes,
            add_special,
            parse_special,
            &record,
        ) {
            matched += 1;
        }
    }
    println!("tokenizer_vectors.jsonl: {matched}/{total} records match ({skipped} skipped: vocabulary absent)");
    assert_eq!(matched, total);
}

#[test]
fn synthetic_vocabulary_vectors() {
    let path = models_dir().join("synth-qwen2-F32.gguf");
    let Some(tokenizer) = load(&path) else { return };
    assert_eq!(tokenizer.n_vocab(), 2048);
    let text = std::fs::read_to_string(golden_dir().join("synth_vocab2048_vectors.jsonl"))
        .expect("golden file");
    let (mut matched, mut total) = (0, 0);
    for line in text.lines() {
        let record: Value = serde_json::from_str(line).expect("json line");
        let input = record["text"].as_str().expect("text");
        total += 1;
        if check(&tokenizer, "synth", input.as_bytes(), true, true, &record) {
            matched += 1;
        }
    }
    println!("synth_vocab2048_vectors.jsonl: {matched}/{total} records match");
    assert_eq!(matched, total);
}

#[test]
fn llama_cpp_vocab_tests() {
    let directory = golden_dir().join("llama_cpp_vocab_tests");
    let mut inputs: Vec<PathBuf> = std::fs::read_dir(&directory)
        .expect("vocab test folder")
        .map(|entry| entry.expect("entry").path())
        .filter(|path| path.extension().is_some_and(|extension| extension == "inp"))
        .collect();
    inputs.sort();
    let (mut matched, mut total) = (0, 0);
    for input in inputs {
        let vocab_path = input.with_extension("");
        let Some(tokenizer) = load(&vocab_path) else {
            continue;
        };
        let strings = std::fs::read_to_string(&input).expect("inp");
        let outputs = std::fs::read_to_string(input.with_extension("out")).expect("out");
        let strings: Vec<&str> = strings.split("\n__ggml_vocab_test__\n").collect();
        let outputs: Vec<&str> = outputs.split('\n').collect();
        let name = vocab_path
            .file_name()
            .and_then(|name| name.to_str())
            .unwrap_or("?")
            .to_string();
        let (mut file_matched, mut file_total) = (0, 0);
        // The last split element is the empty remainder after the final separator.
        for (string, output) in strings.iter().zip(&outputs).take(strings.len() - 1) {
            let expected: Vec<u32> = output
                .split_whitespace()
                .map(|id| id.parse().expect("id"))
                .collect();
            let record = serde_json::json!({ "ids": expected });
            file_total += 1;
            if check(&tokenizer, &name, string.as_bytes(), false, false, &record) {
                file_matched += 1;
            }
        }
        println!("{name}: {file_matched}/{file_total} vectors match");
        matched += file_matched;
        total += file_total;
    }
    println!("llama_cpp_vocab_tests: {matched}/{total} vectors match");
    assert_eq!(matched, total);
}
