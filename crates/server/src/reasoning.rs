//! Reasoning models (Qwen 3, DeepSeek R1) think inside `<think>…</think>` before they
//! answer; [`ThinkFilter`] moves that text into `reasoning_content` (OpenAI-compatible
//! servers' field, as llama.cpp and vLLM answer it), whole or as it streams.

use runit_engine::stop::partial_match_len;
use runit_tokenizer::Tokenizer;

const OPEN: &str = "<think>";
const CLOSE: &str = "</think>";

/// Where the filter is in the text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Part {
    /// Nothing but blank space yet: a `<think>` may still open.
    Start,
    Thinking,
    /// After `</think>`: blank space before the answer is dropped.
    Closed,
    Answering,
}

/// Text split into reasoning and content.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Split {
    pub content: String,
    pub reasoning: String,
}

/// Splits a choice's text into reasoning and content as it arrives.
#[derive(Debug, Clone)]
pub struct ThinkFilter {
    part: Part,
    held: String,
}

impl ThinkFilter {
    /// A filter for text that starts before the `<think>` (or inside the reasoning, when
    /// the prompt itself ends with `<think>`, as some templates write it).
    pub fn new(prompt_opens_thinking: bool) -> ThinkFilter {
        ThinkFilter {
            part: if prompt_opens_thinking {
                Part::Thinking
            } else {
                Part::Start
            },
            held: String::new(),
        }
    }

    /// True when `template_source` writes or expects `<think>` blocks.
    pub fn applies_to(template_source: &str) -> bool {
        template_source.contains(CLOSE)
    }

    /// True inside a `<think>` block (after its opening tag, before its closing one).
    pub fn is_thinking(&self) -> bool {
        self.part == Part::Thinking
    }

    /// Takes the next piece of text; returns what can go out now.
    pub fn push(&mut self, text: &str) -> Split {
        self.held.push_str(text);
        let mut split = Split::default();
        loop {
            match self.part {
                Part::Start => {
                    let trimmed = self.held.trim_start();
                    if let Some(rest) = trimmed.strip_prefix(OPEN) {
                        self.held = rest.to_string();
                        self.part = Part::Thinking;
                        continue;
                    }
                    if trimmed.is_empty() || OPEN.starts_with(trimmed) {
                        return split;
                    }
                    self.part = Part::Answering;
                }
                Part::Thinking => {
                    if let Some(at) = self.held.find(CLOSE) {
                        split.reasoning.push_str(&self.held[..at]);
                        self.held.drain(..at + CLOSE.len());
                        self.part = Part::Closed;
                        continue;
                    }
                    let keep = partial_match_len(&self.held, CLOSE);
                    let out: String = self.held.drain(..self.held.len() - keep).collect();
                    split.reasoning.push_str(&out);
                    return split;
                }
                Part::Closed => {
                    self.held = self.held.trim_start().to_string();
                    if self.held.is_empty() {
                        return split;
                    }
                    self.part = Part::Answering;
                }
                Part::Answering => {
                    split.content.push_str(&std::mem::take(&mut self.held));
                    return split;
                }
            }
        }
    }

    /// Ends the text: what is still held, where it belongs.
    pub fn finish(&mut self) -> Split {
        let held = std::mem::take(&mut self.held);
        match self.part {
            Part::Thinking => Split {
                reasoning: held,
                content: String::new(),
            },
            Part::Start | Part::Closed | Part::Answering => Split {
                content: held,
                reasoning: String::new(),
            },
        }
    }
}

/// True when the prompt ends inside an open `<think>` (the template opened it).
pub fn opens_thinking(tokenizer: &Tokenizer, prompt: &[u32]) -> bool {
    let tail = &prompt[prompt.len().saturating_sub(4)..];
    tokenizer.decode(tail).is_ok_and(|bytes| {
        String::from_utf8_lossy(&bytes)
            .trim_end()
            .ends_with("<think>")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(opens: bool, pieces: &[&str]) -> Split {
        let mut filter = ThinkFilter::new(opens);
        let mut splits: Vec<Split> = pieces.iter().map(|piece| filter.push(piece)).collect();
        splits.push(filter.finish());
        let mut whole = Split::default();
        for split in splits {
            whole.content.push_str(&split.content);
            whole.reasoning.push_str(&split.reasoning);
        }
        whole
    }

    #[test]
    fn thinking_goes_to_reasoning_in_any_pieces() {
        let text = "<think>\nThe sky is blue.\n</think>\n\nBlue.";
        let characters: Vec<String> = text.chars().map(String::from).collect();
        let pieces: Vec<&str> = characters.iter().map(String::as_str).collect();
        for pieces in [vec![text], pieces] {
            let split = run(false, &pieces);
            assert_eq!(split.reasoning, "\nThe sky is blue.\n");
            assert_eq!(split.content, "Blue.");
        }
        let split = run(true, &["Hmm.</th", "ink>Yes."]);
        assert_eq!(
            (split.reasoning.as_str(), split.content.as_str()),
            ("Hmm.", "Yes.")
        );
    }

    #[test]
    fn text_without_thinking_is_content() {
        for text in [
            "Plain answer.",
            "  <thin is not a tag",
            "<think>never closed",
        ] {
            let split = run(false, &[text]);
            let expected = if text.starts_with("<think>") {
                ("never closed", "")
            } else {
                ("", text)
            };
            assert_eq!((split.reasoning.as_str(), split.content.as_str()), expected);
        }
    }
}
