//! The tokenizer a synthetic model carries: a byte-level BPE (`gpt2`) vocabulary of the model's
//! exact size that the engine can load and that encodes any text.
//!
//! Layout: the model family's special tokens at their real ids, then in the free ids the 256
//! GPT-2 byte characters (so every byte has a token), the products of a few merges, and
//! filler tokens `Ġtok<id>` (decoded as ` tok<id>`) up to the vocabulary size.

use anyhow::{bail, Result};
use runit_gguf::{Array, Value};
use runit_tokenizer::CHATML_TEMPLATE;

/// The special tokens and pre-tokenizer of a model family's tokenizer.
#[derive(Debug)]
pub struct TokenizerStyle {
    /// `tokenizer.ggml.pre`.
    pub pre: &'static str,
    /// Control tokens at their real ids.
    pub specials: &'static [(u32, &'static str)],
    /// `tokenizer.ggml.bos_token_id`.
    pub bos: u32,
    /// `tokenizer.ggml.eos_token_id`.
    pub eos: u32,
    /// `tokenizer.ggml.add_bos_token`.
    pub add_bos: bool,
    /// `tokenizer.chat_template`; `None` for base models that ship none.
    pub chat_template: Option<&'static str>,
}

/// Qwen2, Qwen2.5 and Qwen3 (ChatML; `<|im_end|>` ends a turn).
pub const QWEN: TokenizerStyle = TokenizerStyle {
    pre: "qwen2",
    specials: &[
        (151_643, "<|endoftext|>"),
        (151_644, "<|im_start|>"),
        (151_645, "<|im_end|>"),
    ],
    bos: 151_643,
    eos: 151_645,
    add_bos: false,
    chat_template: Some(CHATML_TEMPLATE),
};

/// LLaMA 3 Instruct (`<|eot_id|>` ends a turn).
pub const LLAMA3: TokenizerStyle = TokenizerStyle {
    pre: "llama-bpe",
    specials: &[
        (128_000, "<|begin_of_text|>"),
        (128_001, "<|end_of_text|>"),
        (128_006, "<|start_header_id|>"),
        (128_007, "<|end_header_id|>"),
        (128_009, "<|eot_id|>"),
    ],
    bos: 128_000,
    eos: 128_009,
    add_bos: true,
    chat_template: Some(LLAMA3_TEMPLATE),
};

/// SmolLM2 Instruct (ChatML at ids 1 and 2).
pub const SMOLLM: TokenizerStyle = TokenizerStyle {
    pre: "smollm",
    specials: &[(0, "<|endoftext|>"), (1, "<|im_start|>"), (2, "<|im_end|>")],
    bos: 1,
    eos: 2,
    add_bos: false,
    chat_template: Some(CHATML_TEMPLATE),
};

/// Gemma 3 (its SentencePiece vocabulary's control tokens at their ids; the byte-level
/// vocabulary around them only stands in for its size). Base models ship no template.
pub const GEMMA: TokenizerStyle = TokenizerStyle {
    pre: "default",
    specials: &[
        (0, "<pad>"),
        (1, "<eos>"),
        (2, "<bos>"),
        (3, "<unk>"),
        (105, "<start_of_turn>"),
        (106, "<end_of_turn>"),
    ],
    bos: 2,
    eos: 1,
    add_bos: true,
    chat_template: None,
};

/// OLMo and OLMoE: GPT-NeoX-20B's BPE with the PII-masking tokens of Dolma, GPT-2's
/// pre-tokenizer (llama.cpp's `olmo`). `<|endoftext|>` both separates documents and ends them;
/// the base models add no BOS and have no chat template.
pub const OLMO: TokenizerStyle = TokenizerStyle {
    pre: "olmo",
    specials: &[
        (0, "|||IP_ADDRESS|||"),
        (1, "<|padding|>"),
        (50_277, "|||EMAIL_ADDRESS|||"),
        (50_278, "|||PHONE_NUMBER|||"),
        (50_279, "<|endoftext|>"),
    ],
    bos: 50_279,
    eos: 50_279,
    add_bos: false,
    chat_template: None,
};

/// LLaMA 3's chat format, without its date and tool preamble.
const LLAMA3_TEMPLATE: &str = "{{ bos_token }}{% for message in messages %}{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim + '<|eot_id|>' }}{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}";

/// The merges, by rank, in GPT-2 characters (`Ġ` is the space): enough that common text does
/// not stay one byte per token, few enough to build instantly.
const MERGES: [&str; 16] = [
    "Ġ t", "Ġ a", "h e", "i n", "r e", "o n", "e r", "Ġ s", "l l", "o r", "Ġ w", "Ġt he", "he ll",
    "hell o", "Ġ hello", "in g",
];

/// `tokenizer.ggml.token_type` of ordinary and control tokens.
const NORMAL: i32 = 1;
const CONTROL: i32 = 3;

/// The `tokenizer.*` metadata of a vocabulary of `vocab_size` tokens in `style`.
pub fn tokenizer_metadata(style: &TokenizerStyle, vocab_size: u64) -> Result<Vec<(String, Value)>> {
    let (tokens, types) = tokens(style, vocab_size)?;
    let merges: Vec<String> = MERGES.iter().map(|merge| merge.to_string()).collect();
    let mut entries = vec![
        ("tokenizer.ggml.model", Value::String("gpt2".to_string())),
        ("tokenizer.ggml.pre", Value::String(style.pre.to_string())),
        ("tokenizer.ggml.tokens", Value::Array(Array::String(tokens))),
        ("tokenizer.ggml.token_type", Value::Array(Array::I32(types))),
        ("tokenizer.ggml.merges", Value::Array(Array::String(merges))),
        ("tokenizer.ggml.bos_token_id", Value::U32(style.bos)),
        ("tokenizer.ggml.eos_token_id", Value::U32(style.eos)),
        ("tokenizer.ggml.add_bos_token", Value::Bool(style.add_bos)),
    ];
    if let Some(template) = style.chat_template {
        entries.push((
            "tokenizer.chat_template",
            Value::String(template.to_string()),
        ));
    }
    Ok(entries
        .into_iter()
        .map(|(key, value)| (key.to_string(), value))
        .collect())
}

/// Token texts and types, `vocab_size` of each.
fn tokens(style: &TokenizerStyle, vocab_size: u64) -> Result<(Vec<String>, Vec<i32>)> {
    let size = usize::try_from(vocab_size)?;
    let mut texts: Vec<Option<String>> = vec![None; size];
    let mut types = vec![NORMAL; size];
    for &(id, text) in style.specials {
        match texts.get_mut(id as usize) {
            Some(slot) => *slot = Some(text.to_string()),
            None => bail!("special token {text} has id {id}, outside the vocabulary of {size}"),
        }
        types[id as usize] = CONTROL;
    }
    let bytes = runit_tokenizer::unicode::byte_to_char_table()
        .iter()
        .map(char::to_string);
    let merged = MERGES.iter().map(|merge| merge.replace(' ', ""));
    let mut ordinary = bytes.chain(merged);
    let mut filled = 0;
    for (id, slot) in texts.iter_mut().enumerate() {
        if slot.is_none() {
            *slot = Some(ordinary.next().unwrap_or_else(|| format!("Ġtok{id}")));
            filled += 1;
        }
    }
    if ordinary.next().is_some() {
        bail!("a vocabulary of {size} tokens ({filled} free ids) cannot hold the 256 byte tokens and the merges");
    }
    let texts = texts
        .into_iter()
        .map(|text| text.expect("every id was filled above"))
        .collect();
    Ok((texts, types))
}

#[cfg(test)]
mod tests {
    use super::*;
    use runit_tokenizer::{Tokenizer, VocabularySpec};

    fn tokenizer(style: &TokenizerStyle, vocab_size: u64) -> Tokenizer {
        let mut writer = runit_gguf::GgufWriter::new();
        for (key, value) in tokenizer_metadata(style, vocab_size).expect("metadata") {
            writer.add_metadata(key, value).expect("new key");
        }
        let mut bytes = Vec::new();
        writer
            .write(&mut bytes, |_, _| unreachable!("no tensors"))
            .expect("write to memory");
        let file = runit_gguf::GgufFile::from_bytes(bytes).expect("read back");
        assert_eq!(
            VocabularySpec::from_gguf(&file).expect("spec").tokens.len() as u64,
            vocab_size
        );
        Tokenizer::from_gguf(&file).expect("the engine's tokenizer loads it")
    }

    #[test]
    fn every_family_loads_and_round_trips_text() {
        for (style, size) in [
            (&QWEN, 151_936),
            (&LLAMA3, 128_256),
            (&SMOLLM, 49_152),
            (&OLMO, 50_304),
            (&GEMMA, 262_144),
        ] {
            let tokenizer = tokenizer(style, size);
            assert_eq!(tokenizer.n_vocab() as u64, size);
            let text = "hello the world, ünïcödé 123!";
            let ids = tokenizer.encode(text, false, false);
            assert!(ids.len() < text.len(), "merges apply: {ids:?}");
            let decoded = tokenizer.decode(&ids).expect("decode");
            assert_eq!(String::from_utf8_lossy(&decoded), text);
            assert!(tokenizer.eog_ids().contains(&style.eos));
            assert_eq!(tokenizer.chat_template(), style.chat_template);
        }
    }

    #[test]
    fn too_small_a_vocabulary_is_refused() {
        assert!(tokens(&SMOLLM, 200).is_err());
        assert!(tokens(&QWEN, 1000).is_err());
    }
}
