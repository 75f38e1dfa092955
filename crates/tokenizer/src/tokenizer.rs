//! [`Tokenizer`]: encoding text to token ids and ids back to bytes, with llama.cpp's rules for
//! special tokens, BOS/EOS and the SentencePiece space prefix.

use std::ops::Range;
use std::sync::Mutex;

use crate::bpe::{BpeScratch, BytePairModel};
use crate::chat::RenderedPrompt;
use crate::error::TokenizerError;
use crate::hf::HfTokenizer;
use crate::special::{self, Fragment};
use crate::spm::{self, SpmScratch};
use crate::unicode;
use crate::vocab::{attr, ModelKind, Vocabulary, VocabularySpec};

/// The algorithm behind a tokenizer.
#[derive(Debug)]
enum Engine {
    BytePair(Box<BytePairModel>),
    SentencePiece,
}

/// A tokenizer built from GGUF metadata (or from a `tokenizer.json`).
///
/// ```no_run
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let file = runit_gguf::GgufFile::open("model.gguf")?;
/// let tokenizer = runit_tokenizer::Tokenizer::from_gguf(&file)?;
/// let ids = tokenizer.encode("Hello world", true, true);
/// assert_eq!(tokenizer.decode(&ids)?, b"Hello world");
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct Tokenizer {
    vocabulary: Vocabulary,
    engine: Engine,
    /// Bytes of each token as llama.cpp's `token_to_piece(special = true)` gives them.
    pieces: Vec<Vec<u8>>,
    /// When set, encoding goes through the HF `tokenizers` crate.
    hf: Option<HfTokenizer>,
    chat_template: Option<String>,
    scratch: Mutex<Scratch>,
}

#[derive(Default)]
struct Scratch {
    bpe: BpeScratch,
    spm: SpmScratch,
}

impl std::fmt::Debug for Scratch {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str("Scratch")
    }
}

impl Tokenizer {
    /// Builds a tokenizer from plain vocabulary data (see [`VocabularySpec`]).
    pub fn from_spec(spec: &VocabularySpec) -> Result<Tokenizer, TokenizerError> {
        let vocabulary = Vocabulary::new(spec)?;
        let engine = match spec.model {
            ModelKind::BytePairGpt2 => Engine::BytePair(Box::new(BytePairModel::new(
                &vocabulary,
                &spec.merges,
                spec.pre.as_deref(),
            )?)),
            ModelKind::SentencePiece => Engine::SentencePiece,
        };
        let pieces = (0..vocabulary.len() as u32)
            .map(|id| render_piece(&vocabulary, id))
            .collect();
        Ok(Tokenizer {
            vocabulary,
            engine,
            pieces,
            hf: None,
            chat_template: spec.chat_template.clone(),
            scratch: Mutex::new(Scratch::default()),
        })
    }

    pub(crate) fn set_hf(&mut self, hf: HfTokenizer) {
        self.hf = Some(hf);
    }

    /// Encodes UTF-8 text. `add_special` prepends BOS / appends EOS when the vocabulary asks
    /// for it (`add_bos_token` / `add_eos_token`); `parse_special` turns special-token text
    /// (`<|im_start|>`, `<bos>` ...) into those tokens instead of tokenizing it as text.
    pub fn encode(&self, text: &str, add_special: bool, parse_special: bool) -> Vec<u32> {
        self.encode_bytes(text.as_bytes(), add_special, parse_special)
    }

    /// Like [`Tokenizer::encode`], for arbitrary bytes: invalid UTF-8 is not rejected; it is
    /// handled as llama.cpp does (byte-level BPE: each bad byte becomes U+FFFD; SentencePiece:
    /// byte-fallback tokens).
    pub fn encode_bytes(&self, text: &[u8], add_special: bool, parse_special: bool) -> Vec<u32> {
        if let Some(hf) = &self.hf {
            if let Ok(ids) = hf.encode(text, add_special, parse_special) {
                return ids;
            }
        }
        let fragments = special::partition(&self.vocabulary, text, parse_special, &[]);
        self.encode_fragments(text, &fragments, add_special)
    }

    /// Encodes a rendered chat prompt: special-token text is parsed (the template's turn
    /// markers become control tokens) except in the prompt's literal ranges, the special-token
    /// text that came from message contents, which is tokenized as plain text. Without
    /// literal ranges this is `encode(text, add_special, true)`.
    pub fn encode_prompt(&self, prompt: &RenderedPrompt, add_special: bool) -> Vec<u32> {
        let text = prompt.text.as_bytes();
        if prompt.literal.is_empty() {
            return self.encode_bytes(text, add_special, true);
        }
        let fragments = special::partition(&self.vocabulary, text, true, &prompt.literal);
        let Some(hf) = &self.hf else {
            return self.encode_fragments(text, &fragments, add_special);
        };
        // The HF pipeline cannot be told which occurrences to parse: it tokenizes each text
        // fragment as plain text, and BOS/EOS follow the GGUF vocabulary's flags.
        let mut out = Vec::with_capacity(text.len() / 3 + 2);
        if add_special && self.vocabulary.add_bos {
            out.extend(self.vocabulary.bos);
        }
        for fragment in &fragments {
            match *fragment {
                Fragment::Token(id) => out.push(id),
                Fragment::Text { start, end } => match hf.encode(&text[start..end], false, false) {
                    Ok(ids) => out.extend(ids),
                    Err(_) => {
                        let piece = [Fragment::Text { start, end }];
                        out.extend(self.encode_fragments(text, &piece, false));
                    }
                },
            }
        }
        if add_special && self.vocabulary.add_eos {
            out.extend(self.vocabulary.eos);
        }
        out
    }

    /// Byte ranges of `text` that special-token parsing would turn into control or unknown
    /// tokens (left to right, longest first at each position, not overlapping).
    pub fn special_text_ranges(&self, text: &str) -> Vec<Range<usize>> {
        special::parsed_only_ranges(&self.vocabulary, text.as_bytes())
    }

    /// Tokenizes the text fragments of `text` with the vocabulary's own algorithm.
    fn encode_fragments(&self, text: &[u8], fragments: &[Fragment], add_special: bool) -> Vec<u32> {
        let vocabulary = &self.vocabulary;
        // Another thread holding the shared buffers gets fresh ones instead of waiting.
        let mut guard;
        let mut local;
        let scratch: &mut Scratch = match self.scratch.try_lock() {
            Ok(locked) => {
                guard = locked;
                &mut guard
            }
            Err(_) => {
                local = Scratch::default();
                &mut local
            }
        };
        let mut out = Vec::with_capacity(text.len() / 3 + 2);
        if add_special && vocabulary.add_bos {
            out.extend(vocabulary.bos);
        }
        let mut previous_is_special = true;
        for fragment in fragments {
            match *fragment {
                Fragment::Token(id) => {
                    out.push(id);
                    previous_is_special = true;
                }
                Fragment::Text { start, end } => {
                    let piece = &text[start..end];
                    match &self.engine {
                        Engine::BytePair(model) => {
                            model.encode(vocabulary, piece, &mut scratch.bpe, &mut out)
                        }
                        Engine::SentencePiece => {
                            let prefix = vocabulary.add_space_prefix && previous_is_special;
                            spm::encode(vocabulary, piece, prefix, &mut scratch.spm, &mut out);
                        }
                    }
                    previous_is_special = false;
                }
            }
        }
        if add_special && vocabulary.add_eos {
            out.extend(vocabulary.eos);
        }
        out
    }

    /// The bytes of one token, special tokens rendered as their text (llama.cpp's
    /// `token_to_piece(special = true)`); an id outside the vocabulary is an error.
    pub fn token_piece(&self, id: u32) -> Result<&[u8], TokenizerError> {
        self.pieces
            .get(id as usize)
            .map(Vec::as_slice)
            .ok_or(TokenizerError::TokenOutOfRange {
                id,
                n_vocab: self.pieces.len(),
            })
    }

    /// Concatenated pieces of `ids` (special tokens shown).
    pub fn decode(&self, ids: &[u32]) -> Result<Vec<u8>, TokenizerError> {
        self.decode_with(ids, DecodeOptions::default())
    }

    /// Decodes with options: hide control tokens, drop the SentencePiece leading space.
    pub fn decode_with(
        &self,
        ids: &[u32],
        options: DecodeOptions,
    ) -> Result<Vec<u8>, TokenizerError> {
        let mut out = Vec::with_capacity(ids.len() * 4);
        let mut at_start = true;
        for &id in ids {
            let piece = self.token_piece(id)?;
            if options.skip_special && self.vocabulary.is_control(id) {
                continue;
            }
            let piece =
                if at_start && options.strip_leading_space && self.vocabulary.add_space_prefix {
                    piece.strip_prefix(b" ").unwrap_or(piece)
                } else {
                    piece
                };
            at_start = false;
            out.extend_from_slice(piece);
        }
        Ok(out)
    }

    /// Vocabulary size.
    pub fn n_vocab(&self) -> usize {
        self.vocabulary.len()
    }

    /// Beginning-of-sequence token.
    pub fn bos_id(&self) -> Option<u32> {
        self.vocabulary.bos
    }

    /// End-of-sequence token.
    pub fn eos_id(&self) -> Option<u32> {
        self.vocabulary.eos
    }

    /// Whether the vocabulary asks for BOS at the start of a prompt.
    pub fn add_bos(&self) -> bool {
        self.vocabulary.add_bos
    }

    /// Whether generation ends at `id` (llama.cpp's end-of-generation set: EOS, EOT,
    /// `<|im_end|>`, `<|endoftext|>`, `<end_of_turn>`, FIM pad/repo/separator ...).
    pub fn is_eog(&self, id: u32) -> bool {
        self.vocabulary.end_of_generation.contains(&id)
    }

    /// The end-of-generation ids, ascending.
    pub fn eog_ids(&self) -> Vec<u32> {
        self.vocabulary.end_of_generation.iter().copied().collect()
    }

    /// The fill-in-the-middle tokens `[prefix, suffix, middle]`, when the vocabulary has
    /// them (`<fim_prefix>`, `<|fim_prefix|>`, `<PRE>` ...).
    pub fn fill_in_middle(&self) -> Option<[u32; 3]> {
        self.vocabulary.fill_in_middle
    }

    /// Whether `id` is a control (or unknown) token, hidden when special tokens are skipped.
    pub fn is_control(&self, id: u32) -> bool {
        self.vocabulary.is_control(id)
    }

    /// The checked vocabulary.
    pub fn vocabulary(&self) -> &Vocabulary {
        &self.vocabulary
    }

    /// `tokenizer.chat_template`, when the file has one.
    pub fn chat_template(&self) -> Option<&str> {
        self.chat_template.as_deref()
    }

    /// The text of a token as a string for templates (`bos_token`, `eos_token`).
    pub fn token_text(&self, id: Option<u32>) -> String {
        id.and_then(|id| self.vocabulary.token_text(id))
            .unwrap_or_default()
            .to_string()
    }

    /// The pre-tokenizer name of a byte-level BPE vocabulary.
    pub fn pre_tokenizer(&self) -> Option<&str> {
        match &self.engine {
            Engine::BytePair(model) => Some(model.pre_tokenizer_name()),
            Engine::SentencePiece => None,
        }
    }

    /// Whether the SentencePiece space prefix applies (`add_space_prefix`).
    pub fn adds_space_prefix(&self) -> bool {
        self.vocabulary.add_space_prefix
    }
}

/// Options of [`Tokenizer::decode_with`].
#[derive(Clone, Copy, Debug, Default)]
pub struct DecodeOptions {
    /// Leave control and unknown tokens out.
    pub skip_special: bool,
    /// With `add_space_prefix` vocabularies, drop the space the encoder put in front.
    pub strip_leading_space: bool,
}

/// llama.cpp's `token_to_piece(token, special = true)`.
fn render_piece(vocabulary: &Vocabulary, id: u32) -> Vec<u8> {
    let text = &vocabulary.texts[id as usize];
    let token_attr = vocabulary.attr(id);
    if token_attr & (attr::CONTROL | attr::UNKNOWN | attr::USER_DEFINED) != 0 {
        return text.as_bytes().to_vec();
    }
    if token_attr & attr::NORMAL != 0 {
        return match vocabulary.model {
            ModelKind::SentencePiece => text.replace('▁', " ").into_bytes(),
            ModelKind::BytePairGpt2 => decode_byte_level(text),
        };
    }
    if token_attr & attr::BYTE != 0 {
        return text
            .get(3..5)
            .and_then(|hex| u8::from_str_radix(hex, 16).ok())
            .map(|byte| vec![byte])
            .unwrap_or_default();
    }
    Vec::new()
}

/// Maps GPT-2 byte-level characters back to bytes; a character outside the map is rendered as
/// llama.cpp does (`[UNK_BYTE_0x..text]`).
fn decode_byte_level(text: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(text.len());
    for character in text.chars() {
        match unicode::char_to_byte(character) {
            Some(byte) => out.push(byte),
            None => {
                out.extend_from_slice(b"[UNK_BYTE_0x");
                let mut utf8 = [0u8; 4];
                for byte in character.encode_utf8(&mut utf8).as_bytes() {
                    out.extend_from_slice(format!("{byte:02x}").as_bytes());
                }
                out.extend_from_slice(text.as_bytes());
                out.push(b']');
            }
        }
    }
    out
}
