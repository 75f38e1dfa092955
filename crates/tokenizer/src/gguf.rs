//! Reading the `tokenizer.*` keys of a GGUF file into a [`VocabularySpec`]: the only place
//! where GGUF key strings appear.

use std::path::Path;

use runit_gguf::{Array, GgufFile};

use crate::chat::ChatTemplate;
use crate::error::TokenizerError;
use crate::hf::HfTokenizer;
use crate::tokenizer::Tokenizer;
use crate::vocab::{invalid, ModelKind, VocabularySpec};

const KEY_MODEL: &str = "tokenizer.ggml.model";
const KEY_SCORES: &str = "tokenizer.ggml.scores";
const KEY_TOKEN_TYPE: &str = "tokenizer.ggml.token_type";

impl VocabularySpec {
    /// Reads the vocabulary keys of `file`.
    pub fn from_gguf(file: &GgufFile) -> Result<VocabularySpec, TokenizerError> {
        let model_name =
            file.get_str_opt(KEY_MODEL)?
                .ok_or_else(|| TokenizerError::MissingKey {
                    key: KEY_MODEL.to_string(),
                })?;
        let model = ModelKind::from_gguf_name(model_name)?;
        let tokens = file.get_str_array("tokenizer.ggml.tokens")?.to_vec();
        let mut spec = VocabularySpec::new(model, tokens);
        spec.pre = file.get_str_opt("tokenizer.ggml.pre")?.map(str::to_string);
        spec.scores = match file.get_array_opt(KEY_SCORES)? {
            None => Vec::new(),
            Some(Array::F32(scores)) => scores.clone(),
            Some(Array::I32(scores)) => scores.iter().map(|&score| score as f32).collect(),
            Some(other) => {
                return Err(invalid(
                    KEY_SCORES,
                    format!(
                        "expected an array of f32 or i32, found {}",
                        other.type_description()
                    ),
                ))
            }
        };
        spec.token_types = match file.get_array_opt(KEY_TOKEN_TYPE)? {
            None => Vec::new(),
            Some(Array::I32(types)) => types.clone(),
            Some(other) => {
                return Err(invalid(
                    KEY_TOKEN_TYPE,
                    format!(
                        "expected an array of i32, found {}",
                        other.type_description()
                    ),
                ))
            }
        };
        if model == ModelKind::BytePairGpt2 {
            spec.merges = file
                .get_str_array_opt("tokenizer.ggml.merges")?
                .ok_or_else(|| TokenizerError::MissingKey {
                    key: "tokenizer.ggml.merges".to_string(),
                })?
                .to_vec();
        }
        spec.bos = file.get_u32_opt("tokenizer.ggml.bos_token_id")?;
        spec.eos = file.get_u32_opt("tokenizer.ggml.eos_token_id")?;
        spec.eot = file.get_u32_opt("tokenizer.ggml.eot_token_id")?;
        spec.eom = file.get_u32_opt("tokenizer.ggml.eom_token_id")?;
        spec.unknown = file.get_u32_opt("tokenizer.ggml.unknown_token_id")?;
        spec.padding = file.get_u32_opt("tokenizer.ggml.padding_token_id")?;
        spec.add_bos = file.get_bool_opt("tokenizer.ggml.add_bos_token")?;
        spec.add_eos = file.get_bool_opt("tokenizer.ggml.add_eos_token")?;
        spec.add_space_prefix = file.get_bool_opt("tokenizer.ggml.add_space_prefix")?;
        spec.chat_template = file
            .get_str_opt("tokenizer.chat_template")?
            .map(str::to_string);
        Ok(spec)
    }
}

impl Tokenizer {
    /// Builds the tokenizer from the GGUF metadata alone.
    pub fn from_gguf(file: &GgufFile) -> Result<Tokenizer, TokenizerError> {
        Tokenizer::from_spec(&VocabularySpec::from_gguf(file)?)
    }

    /// Encodes with the HF `tokenizers` crate reading `tokenizer_json`; pieces, special ids,
    /// the end-of-generation set and the chat template still come from `file`.
    pub fn from_tokenizer_json(
        tokenizer_json: impl AsRef<Path>,
        file: &GgufFile,
    ) -> Result<Tokenizer, TokenizerError> {
        let mut tokenizer = Tokenizer::from_gguf(file)?;
        let hf = HfTokenizer::open(tokenizer_json.as_ref())?;
        if hf.vocab_size() != tokenizer.n_vocab() {
            tracing::warn!(
                "tokenizer.json has {} tokens, the GGUF vocabulary {}; decoding uses the GGUF pieces",
                hf.vocab_size(),
                tokenizer.n_vocab()
            );
        }
        tokenizer.set_hf(hf);
        Ok(tokenizer)
    }
}

impl ChatTemplate {
    /// The template of `file` (`tokenizer.chat_template`) with its BOS/EOS texts; ChatML with
    /// a warning when the file has none.
    pub fn from_gguf(file: &GgufFile) -> Result<ChatTemplate, TokenizerError> {
        ChatTemplate::from_tokenizer(&Tokenizer::from_gguf(file)?)
    }
}
