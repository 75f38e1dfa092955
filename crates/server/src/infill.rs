//! Fill in the middle (`suffix` on completions): the prompt is the text before the gap and
//! `suffix` the text after it, laid out with the model's FIM tokens as
//! `<prefix> PROMPT <suffix> SUFFIX <middle>`, after which the model writes the middle.

use runit_tokenizer::Tokenizer;
use serde_json::{Map, Value};

use crate::error::ApiError;
use crate::request::{field, wrong_type};

/// Reads `suffix`; a model without FIM tokens cannot take one.
pub fn suffix(
    body: &Map<String, Value>,
    tokenizer: &Tokenizer,
) -> Result<Option<String>, ApiError> {
    match field(body, "suffix") {
        None => Ok(None),
        Some(Value::String(_)) if tokenizer.fill_in_middle().is_none() => Err(ApiError::invalid(
            "suffix",
            "`suffix`: this model has no fill-in-the-middle tokens, so it cannot fill a gap",
        )),
        Some(Value::String(text)) => Ok(Some(text.clone())),
        Some(other) => Err(wrong_type("suffix", "a string", other)),
    }
}

/// The prompt that asks the model for the text between `prefix` (token ids) and `suffix`.
pub fn prompt(tokenizer: &Tokenizer, prefix: &[u32], suffix: &str) -> Vec<u32> {
    let [before, after, middle] = tokenizer
        .fill_in_middle()
        .expect("`suffix` was refused for a model without FIM tokens");
    let mut ids = Vec::with_capacity(prefix.len() + suffix.len() + 4);
    if tokenizer.add_bos() {
        ids.extend(tokenizer.bos_id());
    }
    ids.push(before);
    ids.extend_from_slice(prefix);
    ids.push(after);
    ids.extend(tokenizer.encode(suffix, false, false));
    ids.push(middle);
    ids
}

#[cfg(test)]
mod tests {
    use runit_tokenizer::{ModelKind, Tokenizer, VocabularySpec};

    /// A SentencePiece vocabulary with FIM tokens in CodeLlama's spelling.
    fn tokenizer() -> Tokenizer {
        let tokens = [
            "<unk>", "<s>", "</s>", "▁<PRE>", "▁<SUF>", "▁<MID>", "a", "b", "▁",
        ];
        let mut spec =
            VocabularySpec::new(ModelKind::SentencePiece, tokens.map(String::from).to_vec());
        spec.scores = vec![0.0; tokens.len()];
        spec.token_types = (0..tokens.len())
            .map(|id| match id {
                0 => 2,
                1..=5 => 3,
                _ => 1,
            })
            .collect();
        spec.unknown = Some(0);
        spec.bos = Some(1);
        spec.eos = Some(2);
        spec.add_bos = Some(true);
        spec.add_space_prefix = Some(false);
        Tokenizer::from_spec(&spec).expect("vocabulary")
    }

    #[test]
    fn the_gap_is_laid_out_with_the_fim_tokens() {
        let tokenizer = tokenizer();
        assert_eq!(tokenizer.fill_in_middle(), Some([3, 4, 5]));
        let prefix = tokenizer.encode("ab", false, false);
        assert_eq!(
            super::prompt(&tokenizer, &prefix, "ba"),
            [1, 3, 6, 7, 4, 7, 6, 5]
        );
    }
}
