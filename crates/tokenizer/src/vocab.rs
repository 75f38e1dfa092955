//! The vocabulary as plain data ([`VocabularySpec`], what a GGUF file says) and its checked,
//! indexed form ([`Vocabulary`]) with llama.cpp's load-time rules: default special ids, token
//! attributes, text-based detection of end-of-generation and FIM tokens, the special-token list.

use std::collections::{BTreeSet, HashMap};

use crate::error::TokenizerError;
use crate::special::SpecialTrie;

/// Which tokenization algorithm the vocabulary uses (`tokenizer.ggml.model`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ModelKind {
    /// `gpt2`: byte-level BPE with merges and a regex pre-tokenizer.
    BytePairGpt2,
    /// `llama`: SentencePiece-style BPE over scores with `<0xXX>` byte fallback.
    SentencePiece,
}

impl ModelKind {
    /// Parses the value of `tokenizer.ggml.model`.
    pub fn from_gguf_name(name: &str) -> Result<ModelKind, TokenizerError> {
        match name {
            "gpt2" => Ok(ModelKind::BytePairGpt2),
            "llama" => Ok(ModelKind::SentencePiece),
            other => Err(TokenizerError::UnsupportedModel {
                found: other.to_string(),
                supported: "gpt2, llama".to_string(),
            }),
        }
    }
}

/// Token type as stored in `tokenizer.ggml.token_type` (llama.cpp's `llama_token_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TokenType {
    /// 0.
    Undefined,
    /// 1.
    Normal,
    /// 2.
    Unknown,
    /// 3.
    Control,
    /// 4.
    UserDefined,
    /// 5.
    Unused,
    /// 6: a `<0xXX>` byte-fallback token.
    Byte,
}

impl TokenType {
    /// Maps the GGUF integer; unknown values are `Undefined`, as in llama.cpp.
    pub fn from_i32(value: i32) -> TokenType {
        match value {
            1 => TokenType::Normal,
            2 => TokenType::Unknown,
            3 => TokenType::Control,
            4 => TokenType::UserDefined,
            5 => TokenType::Unused,
            6 => TokenType::Byte,
            _ => TokenType::Undefined,
        }
    }
}

/// Token attribute bits (llama.cpp's `llama_token_attr`).
pub(crate) mod attr {
    pub const UNKNOWN: u32 = 1 << 0;
    pub const UNUSED: u32 = 1 << 1;
    pub const NORMAL: u32 = 1 << 2;
    pub const CONTROL: u32 = 1 << 3;
    pub const USER_DEFINED: u32 = 1 << 4;
    pub const BYTE: u32 = 1 << 5;
    pub const LSTRIP: u32 = 1 << 7;
    pub const RSTRIP: u32 = 1 << 8;
}

/// Everything the tokenizer needs, as plain data; [`crate::Tokenizer::from_gguf`] fills it from
/// the `tokenizer.*` keys, tests can write one by hand.
#[derive(Clone, Debug)]
pub struct VocabularySpec {
    /// `tokenizer.ggml.model`.
    pub model: ModelKind,
    /// `tokenizer.ggml.pre` (only used by `gpt2`; absent means `default`).
    pub pre: Option<String>,
    /// `tokenizer.ggml.tokens`, by id.
    pub tokens: Vec<String>,
    /// `tokenizer.ggml.scores` (SentencePiece merge priorities); empty when absent.
    pub scores: Vec<f32>,
    /// `tokenizer.ggml.token_type`; empty when absent (all tokens normal).
    pub token_types: Vec<i32>,
    /// `tokenizer.ggml.merges` ("left right", by rank); `gpt2` only.
    pub merges: Vec<String>,
    /// `tokenizer.ggml.bos_token_id`.
    pub bos: Option<u32>,
    /// `tokenizer.ggml.eos_token_id`.
    pub eos: Option<u32>,
    /// `tokenizer.ggml.eot_token_id`.
    pub eot: Option<u32>,
    /// `tokenizer.ggml.eom_token_id`.
    pub eom: Option<u32>,
    /// `tokenizer.ggml.unknown_token_id`.
    pub unknown: Option<u32>,
    /// `tokenizer.ggml.padding_token_id`.
    pub padding: Option<u32>,
    /// `tokenizer.ggml.add_bos_token`.
    pub add_bos: Option<bool>,
    /// `tokenizer.ggml.add_eos_token`.
    pub add_eos: Option<bool>,
    /// `tokenizer.ggml.add_space_prefix`.
    pub add_space_prefix: Option<bool>,
    /// `tokenizer.chat_template`.
    pub chat_template: Option<String>,
}

impl VocabularySpec {
    /// A spec with the given model and tokens and every optional field absent.
    pub fn new(model: ModelKind, tokens: Vec<String>) -> VocabularySpec {
        VocabularySpec {
            model,
            pre: None,
            tokens,
            scores: Vec::new(),
            token_types: Vec::new(),
            merges: Vec::new(),
            bos: None,
            eos: None,
            eot: None,
            eom: None,
            unknown: None,
            padding: None,
            add_bos: None,
            add_eos: None,
            add_space_prefix: None,
            chat_template: None,
        }
    }
}

/// The checked vocabulary: token texts and attributes, lookup by text, special ids and flags.
#[derive(Debug)]
pub struct Vocabulary {
    pub(crate) model: ModelKind,
    pub(crate) texts: Vec<String>,
    pub(crate) scores: Vec<f32>,
    pub(crate) attrs: Vec<u32>,
    pub(crate) text_to_id: HashMap<String, u32>,
    pub(crate) bos: Option<u32>,
    pub(crate) eos: Option<u32>,
    pub(crate) unknown: Option<u32>,
    pub(crate) add_bos: bool,
    pub(crate) add_eos: bool,
    pub(crate) add_space_prefix: bool,
    pub(crate) end_of_generation: BTreeSet<u32>,
    /// Control, user-defined and unknown tokens, longest text first (then lowest id).
    pub(crate) special_tokens: Vec<u32>,
    pub(crate) special_trie: SpecialTrie,
    /// The fill-in-the-middle prefix, suffix and middle tokens, when the vocabulary has all
    /// three.
    pub(crate) fill_in_middle: Option<[u32; 3]>,
}

const KEY_TOKENS: &str = "tokenizer.ggml.tokens";
const KEY_SCORES: &str = "tokenizer.ggml.scores";
const KEY_TOKEN_TYPE: &str = "tokenizer.ggml.token_type";

const EOT_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "<｜end▁of▁sentence｜>",
    "<end_of_utterance>",
];
const EOM_TEXTS: &[&str] = &["<|eom_id|>"];
const FIM_PAD_TEXTS: &[&str] = &["<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"];
const FIM_REP_TEXTS: &[&str] = &[
    "<|fim_repo|>",
    "<|repo_name|>",
    "<fim-repo>",
    "<REPO>",
    "<reponame>",
];
const FIM_SEP_TEXTS: &[&str] = &["<|file_sep|>"];
const FIM_OTHER_TEXTS: [&[&str]; 3] = [
    &[
        "<|fim_prefix|>",
        "<fim-prefix>",
        "<fim_prefix>",
        "<｜fim▁begin｜>",
        "<PRE>",
        "▁<PRE>",
        "<|code_prefix|>",
        "<|prefix|>",
    ],
    &[
        "<|fim_suffix|>",
        "<fim-suffix>",
        "<fim_suffix>",
        "<｜fim▁hole｜>",
        "<SUF>",
        "▁<SUF>",
        "<|code_suffix|>",
        "<|suffix|>",
    ],
    &[
        "<|fim_middle|>",
        "<fim-middle>",
        "<fim_middle>",
        "<｜fim▁end｜>",
        "<MID>",
        "▁<MID>",
        "<|code_middle|>",
        "<|middle|>",
    ],
];
const EOG_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<eos>",
    "<turn|>",
    "<|tool_response>",
    "<｜end▁of▁sentence｜>",
    "[e~[",
];

impl Vocabulary {
    /// Checks `spec` and builds the indexed vocabulary.
    ///
    /// Refused: an empty token list, a duplicate token text, `scores`/`token_type` arrays of
    /// another length than `tokens`.
    pub fn new(spec: &VocabularySpec) -> Result<Vocabulary, TokenizerError> {
        let n_tokens = spec.tokens.len();
        if n_tokens == 0 {
            return Err(invalid(KEY_TOKENS, "the token list is empty".to_string()));
        }
        check_length(KEY_SCORES, spec.scores.len(), n_tokens)?;
        check_length(KEY_TOKEN_TYPE, spec.token_types.len(), n_tokens)?;

        let mut texts = Vec::with_capacity(n_tokens);
        let mut text_to_id = HashMap::with_capacity(n_tokens);
        for (id, text) in spec.tokens.iter().enumerate() {
            // llama.cpp renames empty tokens so that every text is unique and non-empty.
            let text = if text.is_empty() {
                format!("[EMPTY_{id}]")
            } else {
                text.clone()
            };
            if let Some(previous) = text_to_id.insert(text.clone(), id as u32) {
                return Err(invalid(
                    KEY_TOKENS,
                    format!("duplicate token {text:?} at ids {previous} and {id}"),
                ));
            }
            texts.push(text);
        }
        let scores = if spec.scores.is_empty() {
            vec![0.0; n_tokens]
        } else {
            spec.scores.clone()
        };
        let mut attrs: Vec<u32> = if spec.token_types.is_empty() {
            vec![attr::NORMAL; n_tokens]
        } else {
            spec.token_types
                .iter()
                .map(|&value| type_attr(TokenType::from_i32(value)))
                .collect()
        };

        // The ids generation stops on or starts with must be tokens: a file naming one outside
        // the vocabulary is refused (the optional unknown and padding ids outside it are unused).
        for (key, id) in [
            ("tokenizer.ggml.bos_token_id", spec.bos),
            ("tokenizer.ggml.eos_token_id", spec.eos),
            ("tokenizer.ggml.eot_token_id", spec.eot),
            ("tokenizer.ggml.eom_token_id", spec.eom),
        ] {
            if let Some(id) = id.filter(|&id| id as usize >= n_tokens) {
                return Err(invalid(
                    key,
                    format!("{id} is outside the vocabulary of {n_tokens} tokens"),
                ));
            }
        }
        let in_range = |id: Option<u32>| id.filter(|&id| (id as usize) < n_tokens);
        let (default_bos, default_eos, default_unknown, default_add_bos, default_space) =
            match spec.model {
                ModelKind::SentencePiece => (Some(1), Some(2), Some(0), true, true),
                ModelKind::BytePairGpt2 => (
                    Some(11),
                    Some(11),
                    None,
                    pre_adds_bos(spec.pre.as_deref()),
                    false,
                ),
            };
        let bos = in_range(spec.bos.or(default_bos));
        let eos = in_range(spec.eos.or(default_eos));
        let unknown = in_range(spec.unknown.or(default_unknown));
        let add_bos = spec.add_bos.unwrap_or(default_add_bos);
        let add_eos = spec.add_eos.unwrap_or(false);
        if add_bos && bos.is_none() {
            return Err(invalid(
                "tokenizer.ggml.add_bos_token",
                "is true but there is no valid tokenizer.ggml.bos_token_id".to_string(),
            ));
        }
        if add_eos && eos.is_none() {
            return Err(invalid(
                "tokenizer.ggml.add_eos_token",
                "is true but there is no valid tokenizer.ggml.eos_token_id".to_string(),
            ));
        }

        // Text-based detection, as llama.cpp does for files whose converter did not record the
        // ids: the first candidate (lowest id here) becomes the token and is forced to CONTROL.
        let mut detect = |given: Option<u32>, candidates: &[&str]| -> Option<u32> {
            if let Some(id) = in_range(given) {
                return Some(id);
            }
            let found = candidates
                .iter()
                .filter_map(|text| text_to_id.get(*text).copied())
                .min()?;
            attrs[found as usize] |= attr::CONTROL;
            Some(found)
        };
        let eot = detect(spec.eot, EOT_TEXTS);
        let eom = detect(spec.eom, EOM_TEXTS);
        let [prefix, suffix, middle] = FIM_OTHER_TEXTS.map(|candidates| detect(None, candidates));
        let fill_in_middle = prefix.zip(suffix).zip(middle).map(|((p, s), m)| [p, s, m]);
        let fim_pad = detect(None, FIM_PAD_TEXTS);
        let fim_rep = detect(None, FIM_REP_TEXTS);
        let fim_sep = detect(None, FIM_SEP_TEXTS);

        for (text, &id) in &text_to_id {
            let token_attr = &mut attrs[id as usize];
            if *token_attr & attr::CONTROL != 0 && text.contains("unused") {
                *token_attr |= attr::UNUSED;
            }
        }

        let mut end_of_generation: BTreeSet<u32> =
            [fim_pad, fim_rep, fim_sep].into_iter().flatten().collect();
        for text in EOG_TEXTS {
            if let Some(&id) = text_to_id.get(*text) {
                end_of_generation.insert(id);
                attrs[id as usize] |= attr::CONTROL;
            }
        }
        for text in ["<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"] {
            if let Some(&id) = text_to_id.get(text) {
                attrs[id as usize] = attr::USER_DEFINED;
            }
        }
        end_of_generation.extend([eos, eot, eom].into_iter().flatten());
        let has_text =
            |set: &BTreeSet<u32>, text: &str| set.iter().any(|&id| texts[id as usize] == text);
        let eog = &end_of_generation;
        if (has_text(eog, "<|return|>") && has_text(eog, "<|call|>"))
            || (has_text(eog, "<|calls|>") && has_text(eog, "<|flush|>"))
        {
            if let Some(&end) = text_to_id.get("<|end|>") {
                end_of_generation.remove(&end);
                attrs[end as usize] = attr::USER_DEFINED;
            }
        }
        if has_text(&end_of_generation, "<|tool_response>") {
            if let Some(&end) = text_to_id.get("</s>") {
                end_of_generation.remove(&end);
                attrs[end as usize] = attr::NORMAL;
            }
        }

        let mut special_tokens: Vec<u32> = (0..n_tokens as u32)
            .filter(|&id| {
                attrs[id as usize] & (attr::CONTROL | attr::USER_DEFINED | attr::UNKNOWN) != 0
            })
            .collect();
        special_tokens.sort_by(|&a, &b| {
            texts[b as usize]
                .len()
                .cmp(&texts[a as usize].len())
                .then(a.cmp(&b))
        });

        let special_trie =
            SpecialTrie::new(special_tokens.iter().map(|&id| texts[id as usize].as_str()));
        Ok(Vocabulary {
            model: spec.model,
            texts,
            scores,
            attrs,
            text_to_id,
            bos,
            eos,
            unknown,
            add_bos,
            add_eos,
            add_space_prefix: spec.add_space_prefix.unwrap_or(default_space),
            end_of_generation,
            special_tokens,
            special_trie,
            fill_in_middle,
        })
    }

    /// Number of tokens.
    pub fn len(&self) -> usize {
        self.texts.len()
    }

    /// Whether the vocabulary has no token (never true for a checked vocabulary).
    pub fn is_empty(&self) -> bool {
        self.texts.is_empty()
    }

    /// The id of the token whose text is exactly `text`.
    pub fn token_id(&self, text: &str) -> Option<u32> {
        self.text_to_id.get(text).copied()
    }

    /// The token's text as stored in the vocabulary (byte-level or `▁`-escaped form).
    pub fn token_text(&self, id: u32) -> Option<&str> {
        self.texts.get(id as usize).map(String::as_str)
    }

    pub(crate) fn attr(&self, id: u32) -> u32 {
        self.attrs[id as usize]
    }

    /// Whether `id` is a control token (rendered only when special tokens are shown).
    pub fn is_control(&self, id: u32) -> bool {
        self.attrs
            .get(id as usize)
            .is_some_and(|&bits| bits & (attr::CONTROL | attr::UNKNOWN) != 0)
    }
}

/// llama.cpp turns `add_bos` on by default for the llama-3-style pre-tokenizers.
fn pre_adds_bos(pre: Option<&str>) -> bool {
    matches!(
        pre,
        Some(
            "llama3"
                | "llama-v3"
                | "llama-bpe"
                | "falcon3"
                | "falcon-h1"
                | "pixtral"
                | "midm-2.0"
                | "lfm2"
                | "tekken"
                | "chameleon"
        )
    )
}

fn type_attr(token_type: TokenType) -> u32 {
    match token_type {
        TokenType::Undefined => 0,
        TokenType::Normal => attr::NORMAL,
        TokenType::Unknown => attr::UNKNOWN,
        TokenType::Control => attr::CONTROL,
        TokenType::UserDefined => attr::USER_DEFINED,
        TokenType::Unused => attr::UNUSED,
        TokenType::Byte => attr::BYTE,
    }
}

fn check_length(key: &str, found: usize, expected: usize) -> Result<(), TokenizerError> {
    if found != 0 && found != expected {
        return Err(invalid(
            key,
            format!("has {found} entries, expected {expected} (one per token in {KEY_TOKENS})"),
        ));
    }
    Ok(())
}

pub(crate) fn invalid(key: &str, message: String) -> TokenizerError {
    TokenizerError::InvalidMetadata {
        key: key.to_string(),
        message,
    }
}
