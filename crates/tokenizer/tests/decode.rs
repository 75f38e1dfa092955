//! Decoding and streaming: valid UTF-8 chunks when characters are split across tokens
//! (byte-level pieces and `<0xXX>` byte fallback), the SentencePiece leading space, special
//! tokens shown or skipped, ids outside the vocabulary; and bad input at load and encode time.

use std::path::Path;

use runit_tokenizer::{
    DecodeOptions, ModelKind, StreamDecoder, StreamOptions, Tokenizer, TokenizerError,
    VocabularySpec,
};

fn model(name: &str) -> Option<Tokenizer> {
    let path = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../../models")).join(name);
    if !path.exists() {
        println!("skipping: {} is absent", path.display());
        return None;
    }
    let file = runit_gguf::GgufFile::open(&path).expect("model opens");
    Some(Tokenizer::from_gguf(&file).expect("tokenizer loads"))
}

/// A small SentencePiece vocabulary: scores grow with length so that merges build words.
fn sentencepiece_spec() -> VocabularySpec {
    let mut tokens: Vec<String> = ["<unk>", "<s>", "</s>"].map(String::from).to_vec();
    let mut types = vec![2, 3, 3];
    for byte in 0..=255u8 {
        tokens.push(format!("<0x{byte:02X}>"));
        types.push(6);
    }
    let words = [
        "▁", "h", "e", "l", "o", "w", "r", "d", "▁h", "he", "el", "ll", "lo", "▁he", "llo",
        "▁hello", "▁w", "or", "ld", "orld", "▁world",
    ];
    for word in words {
        tokens.push(word.to_string());
        types.push(1);
    }
    let scores = tokens
        .iter()
        .zip(&types)
        .map(|(text, &kind)| {
            if kind == 1 {
                text.chars().count() as f32
            } else {
                0.0
            }
        })
        .collect();
    let mut spec = VocabularySpec::new(ModelKind::SentencePiece, tokens);
    spec.scores = scores;
    spec.token_types = types;
    spec
}

/// Streams `ids` one at a time; returns the chunks and how many pushes held bytes back.
fn stream(tokenizer: &Tokenizer, ids: &[u32], options: StreamOptions) -> (Vec<String>, usize) {
    let mut decoder = StreamDecoder::new(tokenizer, options);
    let mut chunks = Vec::new();
    let mut held = 0;
    for &id in ids {
        chunks.push(decoder.push(id).expect("id in vocabulary"));
        held += usize::from(decoder.pending_len() > 0);
    }
    chunks.push(decoder.finish());
    (chunks, held)
}

#[test]
fn sentencepiece_merges_byte_fallback_and_leading_space() {
    let tokenizer = Tokenizer::from_spec(&sentencepiece_spec()).expect("vocabulary");
    let id = |text: &str| tokenizer.vocabulary().token_id(text).expect("token");
    let ids = tokenizer.encode("hello world 世", true, true);
    assert_eq!(
        ids,
        [
            1,
            id("▁hello"),
            id("▁world"),
            id("▁"),
            id("<0xE4>"),
            id("<0xB8>"),
            id("<0x96>")
        ]
    );
    assert_eq!(
        tokenizer.decode(&ids).expect("decodes"),
        "<s> hello world 世".as_bytes()
    );
    let options = DecodeOptions {
        skip_special: true,
        strip_leading_space: true,
    };
    assert_eq!(
        tokenizer.decode_with(&ids, options).expect("decodes"),
        "hello world 世".as_bytes()
    );

    let (chunks, held) = stream(
        &tokenizer,
        &ids,
        StreamOptions {
            show_special: false,
            strip_leading_space: true,
        },
    );
    assert_eq!(chunks, ["", "hello", " world", " ", "", "", "世", ""]);
    assert_eq!(held, 2);
}

#[test]
fn byte_level_stream_holds_split_characters() {
    let Some(tokenizer) = model("SmolLM2-135M-Instruct.Q4_1.gguf") else {
        return;
    };
    let text = "Emoji 👋🏽 and 👨‍👩‍👧, CJK 世界你好, combining e\u{301}\u{302} and café.";
    let ids = tokenizer.encode(text, false, false);
    let (chunks, held) = stream(&tokenizer, &ids, StreamOptions::default());
    assert_eq!(chunks.concat(), text);
    assert!(
        held > 0,
        "no character was split across tokens; the test would prove nothing"
    );
    assert_eq!(tokenizer.decode(&ids).expect("decodes"), text.as_bytes());
}

#[test]
fn gemma_stream_round_trips_rare_characters() {
    let Some(tokenizer) = model("gemma-3-270m-q4_k_m.gguf") else {
        return;
    };
    let text = "Hieroglyph 𓀀𓀁, emoji 🫠🦀, Hangul 한국어, e\u{301}";
    let ids = tokenizer.encode(text, true, true);
    assert_eq!(ids[0], tokenizer.bos_id().expect("gemma has bos"));
    let (chunks, _) = stream(&tokenizer, &ids, StreamOptions::default());
    assert_eq!(chunks.concat(), text);
}

#[test]
fn special_tokens_shown_or_skipped() {
    let Some(tokenizer) = model("SmolLM2-135M-Instruct.Q4_1.gguf") else {
        return;
    };
    let text = "<|im_start|>user\nHi<|im_end|>\n";
    let ids = tokenizer.encode(text, false, true);
    let (shown, _) = stream(
        &tokenizer,
        &ids,
        StreamOptions {
            show_special: true,
            strip_leading_space: false,
        },
    );
    assert_eq!(shown.concat(), text);
    let (hidden, _) = stream(&tokenizer, &ids, StreamOptions::default());
    assert_eq!(hidden.concat(), "user\nHi\n");
    let im_end = tokenizer
        .vocabulary()
        .token_id("<|im_end|>")
        .expect("ChatML token");
    assert!(tokenizer.is_eog(im_end));
    assert!(tokenizer.is_eog(tokenizer.eos_id().expect("eos")));
    assert!(!tokenizer.is_eog(ids[1]));
}

#[test]
fn ids_outside_the_vocabulary_are_errors() {
    let tokenizer = Tokenizer::from_spec(&sentencepiece_spec()).expect("vocabulary");
    let outside = tokenizer.n_vocab() as u32;
    assert!(matches!(
        tokenizer.token_piece(outside),
        Err(TokenizerError::TokenOutOfRange { .. })
    ));
    assert!(matches!(
        tokenizer.decode(&[1, outside]),
        Err(TokenizerError::TokenOutOfRange { .. })
    ));
    let mut decoder = StreamDecoder::new(&tokenizer, StreamOptions::default());
    assert!(decoder.push(u32::MAX).is_err());
}

#[test]
fn invalid_utf8_is_encoded_not_rejected() {
    let tokenizer = Tokenizer::from_spec(&sentencepiece_spec()).expect("vocabulary");
    let id = |text: &str| tokenizer.vocabulary().token_id(text).expect("token");
    assert_eq!(
        tokenizer.encode_bytes(b"he\xFF", false, false),
        [id("▁he"), id("<0xFF>")]
    );
    let Some(tokenizer) = model("SmolLM2-135M-Instruct.Q4_1.gguf") else {
        return;
    };
    // llama.cpp replaces each invalid byte by U+FFFD before byte-level BPE.
    assert_eq!(
        tokenizer.encode_bytes(b"ab\xFFcd\xE2\x82", false, false),
        tokenizer.encode("ab\u{FFFD}cd\u{FFFD}\u{FFFD}", false, false)
    );
}

#[test]
fn inconsistent_metadata_is_refused_with_the_key() {
    let mut spec = sentencepiece_spec();
    spec.scores.pop();
    let error = Tokenizer::from_spec(&spec).expect_err("short scores");
    assert!(
        error.to_string().contains("tokenizer.ggml.scores"),
        "{error}"
    );

    let mut spec = sentencepiece_spec();
    spec.token_types.push(1);
    let error = Tokenizer::from_spec(&spec).expect_err("long token types");
    assert!(
        error.to_string().contains("tokenizer.ggml.token_type"),
        "{error}"
    );

    let mut spec = VocabularySpec::new(
        ModelKind::BytePairGpt2,
        ["a", "b", "ab"].map(String::from).to_vec(),
    );
    spec.pre = Some("gpt-2".to_string());
    spec.merges = vec!["a b".to_string(), "a c".to_string()];
    let error = Tokenizer::from_spec(&spec).expect_err("merge names an unknown token");
    let message = error.to_string();
    assert!(
        message.contains("tokenizer.ggml.merges") && message.contains("\"c\""),
        "{message}"
    );

    spec.merges.pop();
    spec.pre = Some("mystery".to_string());
    let message = Tokenizer::from_spec(&spec)
        .expect_err("unknown pre-tokenizer")
        .to_string();
    assert!(
        message.contains("tokenizer.ggml.pre")
            && message.contains("mystery")
            && message.contains("llama-bpe"),
        "{message}"
    );

    spec.pre = Some("gpt-2".to_string());
    let tokenizer = Tokenizer::from_spec(&spec).expect("consistent now");
    assert_eq!(tokenizer.encode("ab", false, false), [2]);
}
