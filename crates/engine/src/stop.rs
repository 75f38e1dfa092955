//! When a generation ends, in one place: the token rules that `generate` and the scheduler
//! share ([`StopCondition`]: an end-of-generation token, a cancelled receiver, the token limit,
//! the context end) and stop strings matched in the generated text across token boundaries
//! ([`StopMatcher`], for front ends that turn tokens into text): text that could be the start
//! of a stop string is held back until it is known not to be, and the stop string itself is
//! never emitted.

/// Why generation stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopReason {
    /// An end-of-generation token was produced (it is the last generated token).
    EndOfGeneration,
    /// The requested number of tokens was generated, or the context is full.
    Limit,
    /// The caller's callback asked to stop (or the receiver went away).
    Cancelled,
}

/// The token rules that end a generation.
#[derive(Debug, Clone, Copy)]
pub struct StopCondition<'a> {
    /// Tokens that end generation (EOS, EOT, `<|im_end|>` ...).
    pub end_of_generation: &'a [u32],
    /// Most tokens to generate.
    pub max_tokens: usize,
    /// Cells of the sequence's context.
    pub context_size: usize,
}

impl StopCondition<'_> {
    /// Why generation ends after token `id`, the `generated`-th, was produced with `cached`
    /// positions in the cache (`id` not among them) and handed to the caller (`delivered`
    /// false: the caller asked to stop); `None` to go on. The rules, in order: an
    /// end-of-generation token, the caller's stop, the token limit, and the context end (the
    /// cache must hold `id` and one more cell to go on).
    pub fn after_token(
        &self,
        id: u32,
        delivered: bool,
        generated: usize,
        cached: usize,
    ) -> Option<StopReason> {
        if self.end_of_generation.contains(&id) {
            Some(StopReason::EndOfGeneration)
        } else if !delivered {
            Some(StopReason::Cancelled)
        } else if generated >= self.max_tokens || cached + 2 > self.context_size {
            Some(StopReason::Limit)
        } else {
            None
        }
    }
}

/// Finds the first stop string in a stream of text chunks.
#[derive(Debug, Clone, Default)]
pub struct StopMatcher {
    stops: Vec<String>,
    held: String,
}

/// The result of feeding a chunk to a [`StopMatcher`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StopCheck {
    /// Text that is safe to emit now.
    pub text: String,
    /// True when a stop string was found (`text` ends right before it).
    pub stopped: bool,
}

impl StopMatcher {
    /// A matcher for `stops` (empty strings are ignored).
    pub fn new(stops: Vec<String>) -> StopMatcher {
        StopMatcher {
            stops: stops.into_iter().filter(|s| !s.is_empty()).collect(),
            held: String::new(),
        }
    }

    /// Adds `chunk`; returns the text that can be emitted and whether a stop string ended it.
    pub fn push(&mut self, chunk: &str) -> StopCheck {
        self.held.push_str(chunk);
        let first_match = self
            .stops
            .iter()
            .filter_map(|stop| self.held.find(stop.as_str()))
            .min();
        if let Some(at) = first_match {
            let mut text = std::mem::take(&mut self.held);
            text.truncate(at);
            return StopCheck {
                text,
                stopped: true,
            };
        }
        let keep = self.partial_suffix_len();
        let text = self.held[..self.held.len() - keep].to_string();
        self.held.drain(..self.held.len() - keep);
        StopCheck {
            text,
            stopped: false,
        }
    }

    /// The text still held back, at the end of generation.
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.held)
    }

    /// Length of the longest suffix of the held text that begins some stop string.
    fn partial_suffix_len(&self) -> usize {
        self.stops
            .iter()
            .map(|stop| partial_match_len(&self.held, stop))
            .max()
            .unwrap_or(0)
    }
}

/// Length of the longest end of `text` that begins `pattern` (and could become it as more
/// text comes): what a matcher must hold back before it knows.
pub fn partial_match_len(text: &str, pattern: &str) -> usize {
    text.char_indices()
        .map(|(start, _)| &text[start..])
        .find(|suffix| pattern.starts_with(suffix))
        .map_or(0, str::len)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(stops: &[&str], chunks: &[&str]) -> (String, bool) {
        let mut matcher = StopMatcher::new(stops.iter().map(|s| s.to_string()).collect());
        let mut out = String::new();
        for chunk in chunks {
            let check = matcher.push(chunk);
            out.push_str(&check.text);
            if check.stopped {
                return (out, true);
            }
        }
        out.push_str(&matcher.finish());
        (out, false)
    }

    #[test]
    fn matches_across_chunks_and_never_emits_the_stop() {
        assert_eq!(
            run(&["END"], &["hello E", "N", "D world"]),
            ("hello ".into(), true)
        );
        assert_eq!(run(&["\n\n"], &["a\n", "\nb"]), ("a".into(), true));
    }

    #[test]
    fn releases_held_text_that_turns_out_not_to_stop() {
        let mut matcher = StopMatcher::new(vec!["END".into()]);
        assert_eq!(matcher.push("so E").text, "so ");
        assert_eq!(matcher.push("x").text, "Ex");
        assert_eq!(run(&["END"], &["E", "N"]), ("EN".into(), false));
    }

    #[test]
    fn earliest_of_several_stops_wins() {
        assert_eq!(run(&["b", "a"], &["xxab"]), ("xx".into(), true));
        assert_eq!(run(&["", "é"], &["caf", "é!"]), ("caf".into(), true));
    }
}
