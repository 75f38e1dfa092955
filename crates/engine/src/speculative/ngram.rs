//! Prompt lookup (`--draft-ngram N`): the continuation of the most recent earlier
//! occurrence of the sequence's last N tokens, with no second model. A caller's predicted
//! output (OpenAI's `prediction`) is drafted from while the output follows it, and
//! searched before the sequence itself once it does not.
//!
//! A copy that the output leaves for an edit (a word replaced) would otherwise have no draft
//! until N tokens past the edit, when the key lies after it again. So the lookup remembers
//! where in the history its last draft came from, and for up to N steps where the N-gram
//! finds nothing it resumes the copy where the output would be in it had it kept step (the
//! edit as long as what it replaced), within [`RESYNC_WINDOW`] tokens either way: after the
//! nearest occurrence there of the output's last token, one token past the edit.

use super::Drafter;
use crate::EngineError;

/// How far (in tokens, either way) from where a left copy would have continued the lookup
/// looks for the output's last token to resume it.
pub const RESYNC_WINDOW: usize = 4;

/// The prompt-lookup drafter.
#[derive(Debug, Clone)]
pub struct PromptLookup {
    ngram: usize,
    /// Text the caller expects the output to resemble, searched first.
    reference: Vec<u32>,
    /// Where the output starts in the history: while the output so far begins the
    /// reference, the reference's next tokens are the draft.
    output_start: usize,
    /// The last draft from the history: where in the history it started, and the history's
    /// length then.
    anchor: Option<(usize, usize)>,
    /// Drafting calls since the anchor's that found nothing.
    misses: usize,
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
            anchor: None,
            misses: 0,
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
        if let Some((from, _)) = continuation(&self.reference, key, self.reference.len(), max) {
            self.anchor = None;
            let end = self.reference.len().min(from + max);
            return Ok(self.reference[from..end].to_vec());
        }
        // Earlier occurrences only: the key's own place ends the history.
        let earlier = history.len() - 1;
        let found = continuation(history, key, earlier, max)
            .map(|(from, _)| from)
            .or_else(|| self.resync(history));
        match found {
            Some(from) => {
                self.anchor = Some((from, history.len()));
                self.misses = 0;
            }
            None => {
                self.misses += 1;
                if self.misses > self.ngram {
                    self.anchor = None;
                }
            }
        }
        Ok(found.map_or_else(Vec::new, |from| {
            history[from..history.len().min(from + max)].to_vec()
        }))
    }
}

impl PromptLookup {
    /// Where the copy of the last draft resumes (see the module's notes): the nearest
    /// position `p` to where it would be now, within [`RESYNC_WINDOW`], whose previous token
    /// is the output's last and that has a token after it in the history.
    fn resync(&self, history: &[u32]) -> Option<usize> {
        let (from, then) = self.anchor?;
        let (&last, _) = history.split_last()?;
        let advanced = history.len().checked_sub(then)?;
        let expected = from + advanced;
        // `p - 1` lies before the output's last token, and a token follows `p - 1`.
        let earlier = history.len() - 1;
        (0..=RESYNC_WINDOW)
            .flat_map(|distance| {
                [
                    expected.checked_sub(distance),
                    expected.checked_add(distance),
                ]
            })
            .flatten()
            .find(|&p| p >= 1 && p < earlier && history[p - 1] == last)
    }
}

/// Where the up to `max` tokens after the most recent occurrence of `key` in `tokens` that
/// ends before `end` start, and those tokens; `None` when there is none or nothing follows
/// it.
fn continuation<'a>(
    tokens: &'a [u32],
    key: &[u32],
    end: usize,
    max: usize,
) -> Option<(usize, &'a [u32])> {
    let last_start = end.checked_sub(key.len())?;
    (0..=last_start)
        .rev()
        .find(|&start| &tokens[start..start + key.len()] == key)
        .map(|start| {
            let from = start + key.len();
            (from, &tokens[from..tokens.len().min(from + max)])
        })
        .filter(|(_, found)| !found.is_empty())
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
    fn a_copy_resumes_after_an_edit() {
        let mut lookup = PromptLookup::new(2).expect("n > 0");
        // The source 10..=17, then the output copying it: 10 11 12, a draft of 13 14 15,
        // of which the target keeps 13 and replaces 14 with 40 (one token for one).
        let mut history = vec![10, 11, 12, 13, 14, 15, 16, 17, 9, 10, 11, 12];
        assert_eq!(lookup.draft(&history, 3).expect("draft"), [13, 14, 15]);
        history.extend([13, 40]);
        // No earlier "13 40", and 40 is not in the source: no draft yet.
        assert!(lookup.draft(&history, 3).expect("draft").is_empty());
        // One token past the edit the copy resumes, after that token's place in it.
        history.push(15);
        assert_eq!(lookup.draft(&history, 3).expect("draft"), [16, 17, 9]);
        // An edit one token longer than what it replaced (41 42 for 17): found within the
        // window, one token after it.
        history.extend([16, 41]);
        assert!(lookup.draft(&history, 2).expect("draft").is_empty());
        history.push(42);
        assert!(lookup.draft(&history, 2).expect("draft").is_empty());
        history.push(9);
        assert_eq!(lookup.draft(&history, 2).expect("draft"), [10, 11]);
        // Nothing near where the copy would be: no draft.
        let mut lost = PromptLookup::new(2).expect("n > 0");
        let mut history = vec![10, 11, 12, 13, 14, 15, 16, 17, 9, 10, 11];
        assert_eq!(lost.draft(&history, 2).expect("draft"), [12, 13]);
        history.extend([50, 51]);
        assert!(lost.draft(&history, 2).expect("draft").is_empty());
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
