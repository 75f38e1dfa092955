//! Prompt lookup (`--draft-ngram N`): the continuation of the most recent earlier
//! occurrence of the sequence's last N tokens, with no second model. A caller's predicted
//! output (OpenAI's `prediction`) is drafted from while the output follows it, and
//! searched before the sequence itself once it does not.

use super::Drafter;
use crate::EngineError;

/// The prompt-lookup drafter.
#[derive(Debug, Clone)]
pub struct PromptLookup {
    ngram: usize,
    /// Text the caller expects the output to resemble, searched first.
    reference: Vec<u32>,
    /// Where the output starts in the history: while the output so far begins the
    /// reference, the reference's next tokens are the draft.
    output_start: usize,
}

impl PromptLookup {
    /// A drafter matching the last `ngram` tokens (at least 1).
    pub fn new(ngram: usize) -> Result<PromptLookup, EngineError> {
        if ngram == 0 {
            return Err(EngineError::InvalidParameter {
                name: "draft_ngram",
                message: "an n-gram of 0 tokens matches nothing".into(),
            });
        }
        Ok(PromptLookup {
            ngram,
            reference: Vec::new(),
            output_start: 0,
        })
    }

    /// This drafter, also drawing on `reference`, the output the caller predicts for the
    /// output that starts at `output_start` in the history (after the prompt).
    pub fn with_reference(self, reference: Vec<u32>, output_start: usize) -> PromptLookup {
        PromptLookup {
            reference,
            output_start,
            ..self
        }
    }
}

impl Drafter for PromptLookup {
    fn draft(&mut self, history: &[u32], max: usize) -> Result<Vec<u32>, EngineError> {
        let n = self.ngram.min(history.len());
        if n == 0 || max == 0 {
            return Ok(Vec::new());
        }
        let output = history.get(self.output_start..).unwrap_or_default();
        if let Some(rest) = self.reference.strip_prefix(output) {
            if !rest.is_empty() {
                return Ok(rest[..rest.len().min(max)].to_vec());
            }
        }
        let key = &history[history.len() - n..];
        if let Some(found) = continuation(&self.reference, key, self.reference.len(), max) {
            return Ok(found.to_vec());
        }
        // Earlier occurrences only: the key's own place ends the history.
        let earlier = history.len() - 1;
        Ok(continuation(history, key, earlier, max).map_or_else(Vec::new, <[u32]>::to_vec))
    }
}

/// The up to `max` tokens after the most recent occurrence of `key` in `tokens` that ends
/// before `end`; `None` when there is none or nothing follows it.
fn continuation<'a>(tokens: &'a [u32], key: &[u32], end: usize, max: usize) -> Option<&'a [u32]> {
    let last_start = end.checked_sub(key.len())?;
    (0..=last_start)
        .rev()
        .find(|&start| &tokens[start..start + key.len()] == key)
        .map(|start| {
            let from = start + key.len();
            &tokens[from..tokens.len().min(from + max)]
        })
        .filter(|found| !found.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn continues_the_most_recent_earlier_occurrence() {
        let mut lookup = PromptLookup::new(2).expect("n > 0");
        let history = [1, 2, 3, 4, 9, 1, 2, 5, 6, 7, 1, 2];
        assert_eq!(lookup.draft(&history, 3).expect("draft"), [5, 6, 7]);
        assert_eq!(lookup.draft(&history, 1).expect("draft"), [5]);
        assert!(lookup.draft(&[1, 2, 3], 4).expect("draft").is_empty());
        // The continuation may run up to the end of the history.
        assert_eq!(lookup.draft(&[7, 7, 7], 4).expect("draft"), [7]);
    }

    #[test]
    fn the_prediction_is_searched_first() {
        let mut lookup = PromptLookup::new(1)
            .expect("n > 0")
            .with_reference(vec![5, 8, 9, 10], 2);
        // The output so far (after 2 prompt tokens) begins the prediction: its next tokens.
        assert_eq!(lookup.draft(&[3, 4], 3).expect("draft"), [5, 8, 9]);
        assert_eq!(lookup.draft(&[3, 4, 5, 8], 3).expect("draft"), [9, 10]);
        // It has left the prediction: n-gram lookup, in the prediction first.
        assert_eq!(lookup.draft(&[3, 4, 7, 8], 2).expect("draft"), [9, 10]);
        assert_eq!(lookup.draft(&[3, 1, 3], 2).expect("draft"), [1, 3]);
        assert!(PromptLookup::new(0).is_err());
    }
}
