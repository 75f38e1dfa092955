//! A `tokenizer.json` loaded with the HF `tokenizers` crate, used for encoding instead of the
//! GGUF tokenizer when the user gives one (`--tokenizer`). Token pieces, special ids and the
//! chat template still come from the GGUF vocabulary, which must describe the same tokens.

use std::path::Path;

use crate::error::TokenizerError;

/// Two copies of the HF tokenizer: one that splits out special-token text (llama.cpp's
/// `parse_special = true`) and one that tokenizes it as plain text.
pub(crate) struct HfTokenizer {
    path: String,
    parsing: tokenizers::Tokenizer,
    literal: tokenizers::Tokenizer,
}

impl std::fmt::Debug for HfTokenizer {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("HfTokenizer")
            .field("path", &self.path)
            .finish()
    }
}

impl HfTokenizer {
    /// Loads `tokenizer.json`.
    pub(crate) fn open(path: &Path) -> Result<HfTokenizer, TokenizerError> {
        let display = path.display().to_string();
        let failure = |message: String| TokenizerError::TokenizerJson {
            path: display.clone(),
            message,
        };
        let parsing =
            tokenizers::Tokenizer::from_file(path).map_err(|error| failure(error.to_string()))?;
        let mut literal = parsing.clone();
        literal.set_encode_special_tokens(true);
        Ok(HfTokenizer {
            path: display,
            parsing,
            literal,
        })
    }

    /// Vocabulary size including added tokens.
    pub(crate) fn vocab_size(&self) -> usize {
        self.parsing.get_vocab_size(true)
    }

    /// Encodes with the HF pipeline; `add_special` runs its post-processor (BOS/EOS templates).
    pub(crate) fn encode(
        &self,
        text: &[u8],
        add_special: bool,
        parse_special: bool,
    ) -> Result<Vec<u32>, TokenizerError> {
        let failure = |message: String| TokenizerError::TokenizerJson {
            path: self.path.clone(),
            message,
        };
        let text = std::str::from_utf8(text)
            .map_err(|error| failure(format!("input is not UTF-8: {error}")))?;
        let tokenizer = if parse_special {
            &self.parsing
        } else {
            &self.literal
        };
        let encoding = tokenizer
            .encode(text, add_special)
            .map_err(|error| failure(error.to_string()))?;
        Ok(encoding.get_ids().to_vec())
    }
}
