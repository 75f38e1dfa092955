//! `--tokenizer tokenizer.json`: a tokenizer.json equivalent to SmolLM2's (byte-level BPE with
//! individual digits, written here from the GGUF vocabulary) loaded with the HF `tokenizers`
//! crate must give llama.cpp's ids on the golden SmolLM2 vectors.

use std::path::Path;

use runit_gguf::GgufFile;
use runit_tokenizer::Tokenizer;
use serde_json::{json, Map, Value};

fn from_hex(text: &str) -> Vec<u8> {
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&text[i..i + 2], 16).expect("hex"))
        .collect()
}

fn write_tokenizer_json(file: &GgufFile, path: &Path) {
    let tokens = file.get_str_array("tokenizer.ggml.tokens").expect("tokens");
    let types = file
        .get_i32_array("tokenizer.ggml.token_type")
        .expect("types");
    let merges = file.get_str_array("tokenizer.ggml.merges").expect("merges");
    let vocab: Map<String, Value> = tokens
        .iter()
        .enumerate()
        .map(|(id, text)| (text.clone(), json!(id)))
        .collect();
    let added: Vec<Value> = tokens
        .iter()
        .zip(types)
        .enumerate()
        .filter(|(_, (_, &kind))| kind == 3)
        .map(|(id, (text, _))| {
            json!({"id": id, "content": text, "single_word": false, "lstrip": false, "rstrip": false,
                   "normalized": false, "special": true})
        })
        .collect();
    let document = json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": null,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Digits", "individual_digits": true},
            {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true}
        ]},
        "post_processor": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": false, "use_regex": true},
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                  "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
                  "vocab": vocab, "merges": merges}
    });
    std::fs::write(path, serde_json::to_vec(&document).expect("serializes"))
        .expect("writes tokenizer.json");
}

#[test]
fn hf_tokenizer_matches_llama_cpp_on_smollm2_vectors() {
    let root = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."));
    let model = root.join("models/SmolLM2-135M-Instruct.Q4_1.gguf");
    if !model.exists() {
        println!("skipping: {} is absent", model.display());
        return;
    }
    let file = GgufFile::open(&model).expect("model opens");
    let json_path = std::env::temp_dir().join(format!(
        "runit-smollm2-tokenizer-{}.json",
        std::process::id()
    ));
    write_tokenizer_json(&file, &json_path);
    let tokenizer =
        Tokenizer::from_tokenizer_json(&json_path, &file).expect("tokenizer.json loads");
    let _ = std::fs::remove_file(&json_path);

    let golden =
        std::fs::read_to_string(root.join("tests/golden/tokenizer/tokenizer_vectors.jsonl"))
            .expect("golden");
    let (mut matched, mut total) = (0, 0);
    for line in golden.lines() {
        let record: Value = serde_json::from_str(line).expect("json");
        if record["tokenizer"] != "smollm2" {
            continue;
        }
        let bytes = from_hex(record["text_utf8_hex"].as_str().expect("hex"));
        let expected: Vec<u32> = record["ids"]
            .as_array()
            .expect("ids")
            .iter()
            .map(|id| id.as_u64().expect("id") as u32)
            .collect();
        let ids = tokenizer.encode_bytes(
            &bytes,
            record["add_special"] == true,
            record["parse_special"] == true,
        );
        total += 1;
        if ids == expected {
            matched += 1;
        } else {
            println!(
                "MISMATCH {:?} parse_special={}\n  expected {expected:?}\n  found    {ids:?}",
                String::from_utf8_lossy(&bytes),
                record["parse_special"]
            );
        }
    }
    println!("tokenizer.json (HF tokenizers) on SmolLM2 vectors: {matched}/{total} match");
    assert_eq!(matched, total);
}
