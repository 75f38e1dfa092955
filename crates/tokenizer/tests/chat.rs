//! Chat templates: the SmolLM2 template from its GGUF against llama.cpp's rendering (golden),
//! and fixture templates (Qwen2.5, Qwen3, Llama-3, Mistral, Gemma) against each format's
//! documented output, written out here.

use std::path::Path;

use runit_tokenizer::{ChatMessage, ChatTemplate, Tokenizer, TokenizerError};

fn fixture(name: &str) -> String {
    let path = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures")).join(name);
    std::fs::read_to_string(path).expect("fixture template")
}

fn conversation() -> Vec<ChatMessage> {
    vec![
        ChatMessage::system("Be brief."),
        ChatMessage::user("Hi"),
        ChatMessage::assistant("Hello!"),
        ChatMessage::user("What is 2+2?"),
    ]
}

#[test]
fn smollm2_template_matches_llama_cpp() {
    let root = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."));
    let model = root.join("models/SmolLM2-135M-Instruct.Q4_1.gguf");
    if !model.exists() {
        println!("skipping: {} is absent", model.display());
        return;
    }
    let file = runit_gguf::GgufFile::open(&model).expect("model opens");
    let template = ChatTemplate::from_gguf(&file).expect("template compiles");
    let golden_path =
        root.join("tests/golden/generation/SmolLM2-135M-Instruct.Q4_1.model-template.json");
    let golden: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(golden_path).expect("golden")).expect("json");
    let results = golden["results"].as_array().expect("results");
    for result in results {
        let prompt = result["prompt"].as_str().expect("prompt");
        let rendered = template
            .render(&[ChatMessage::user(prompt)], true)
            .expect("renders");
        assert_eq!(
            rendered,
            result["prompt_text"].as_str().expect("prompt_text")
        );
    }
    println!(
        "SmolLM2 template: {}/{} prompts rendered as llama.cpp does",
        results.len(),
        results.len()
    );
}

#[test]
fn chatml_qwen2_5() {
    let template =
        ChatTemplate::new(&fixture("qwen2.5.jinja"), "", "<|im_end|>").expect("compiles");
    let rendered = template.render(&conversation(), true).expect("renders");
    assert_eq!(
        rendered,
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n"
    );
    let default_system = template
        .render(&[ChatMessage::user("Hi")], false)
        .expect("renders");
    assert_eq!(
        default_system,
        "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
    );
}

#[test]
fn qwen3_drops_reasoning_from_history() {
    let template = ChatTemplate::new(&fixture("qwen3.jinja"), "", "<|im_end|>").expect("compiles");
    let messages = vec![
        ChatMessage::user("Hi"),
        ChatMessage::assistant("<think>\nThe user greets me.\n</think>\n\nHello!"),
        ChatMessage::user("Bye"),
    ];
    let rendered = template.render(&messages, true).expect("renders");
    assert_eq!(
        rendered,
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n<|im_start|>assistant\n"
    );
}

#[test]
fn llama3_headers_and_bos() {
    let template = ChatTemplate::new(&fixture("llama3.jinja"), "<|begin_of_text|>", "<|eot_id|>")
        .expect("compiles");
    let mut messages = conversation();
    messages[1].content = "  Hi \n".to_string();
    let rendered = template.render(&messages, true).expect("renders");
    assert_eq!(
        rendered,
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nHello!<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nWhat is 2+2?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"
    );
}

#[test]
fn mistral_inst_blocks_and_role_check() {
    let template = ChatTemplate::new(&fixture("mistral.jinja"), "<s>", "</s>").expect("compiles");
    let rendered = template
        .render(&conversation()[1..], true)
        .expect("renders");
    assert_eq!(
        rendered,
        "<s>[INST] Hi [/INST]Hello!</s>[INST] What is 2+2? [/INST]"
    );
    match template.render(&conversation(), true) {
        Err(TokenizerError::Template { line, message }) => {
            assert_eq!(line, 1);
            assert!(
                message.contains("Conversation roles must alternate"),
                "{message}"
            );
        }
        other => panic!("expected a template error, got {other:?}"),
    }
}

#[test]
fn gemma_turns_with_system_prefix() {
    let template = ChatTemplate::new(&fixture("gemma.jinja"), "<bos>", "<eos>").expect("compiles");
    let rendered = template.render(&conversation(), true).expect("renders");
    assert_eq!(
        rendered,
        "<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\nHello!<end_of_turn>\n<start_of_turn>user\nWhat is 2+2?<end_of_turn>\n<start_of_turn>model\n"
    );
}

#[test]
fn missing_template_falls_back_to_chatml() {
    let mut spec = runit_tokenizer::VocabularySpec::new(
        runit_tokenizer::ModelKind::SentencePiece,
        ["<unk>", "<s>", "</s>", "▁a"].map(String::from).to_vec(),
    );
    spec.scores = vec![0.0; 4];
    let tokenizer = Tokenizer::from_spec(&spec).expect("vocabulary");
    let template = ChatTemplate::from_tokenizer(&tokenizer).expect("fallback compiles");
    let rendered = template
        .render(&[ChatMessage::user("Hi")], true)
        .expect("renders");
    assert_eq!(
        rendered,
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    );
}
