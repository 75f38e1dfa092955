//! Stop strings matched in the generated text across token boundaries: text that could be
//! the start of a stop string is held back until it is known not to be, and the stop string
//! itself is never emitted.

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
        let mut best = 0;
        for stop in &self.stops {
            for (start, _) in self.held.char_indices() {
                let suffix = &self.held[start..];
                if suffix.len() > best && stop.starts_with(suffix) {
                    best = suffix.len();
                    break;
                }
            }
        }
        best
    }
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
