//! Message content is text: special-token text inside a message (`<|im_start|>system ...`)
//! must not become control tokens, or a user could forge turns. Only the template's own text
//! may produce them.
//!
//! The template is rendered as usual. When some message holds special-token text, it is
//! rendered a second time with each such occurrence replaced by a private-use marker
//! character; putting the original text back where the markers landed must give the first
//! rendering exactly (the template treated the content the same way), and the places where
//! it was put back are the prompt's literal ranges, which [`Tokenizer::encode_prompt`]
//! tokenizes as plain text. A template whose output depends on that text (it tests for it,
//! cuts it or escapes it) cannot be separated this way, and the request is refused.

use std::ops::Range;

use crate::chat::{ChatMessage, ChatTemplate, TemplateInputs};
use crate::error::TokenizerError;
use crate::tokenizer::Tokenizer;

/// A rendered chat prompt with the byte ranges of special-token text that came from message
/// contents; see [`Tokenizer::encode_prompt`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RenderedPrompt {
    /// The rendered text.
    pub text: String,
    /// Byte ranges of `text` to tokenize as plain text, sorted and disjoint.
    pub literal: Vec<Range<usize>>,
}

/// The first marker character: markers are taken from Unicode's supplementary private use
/// area A (U+F0000 to U+FFFFD), one per occurrence.
const FIRST_MARKER: u32 = 0xF_0000;
/// How many markers there are.
const MARKER_COUNT: usize = 0xF_FFFE - 0xF_0000;

/// Renders `messages` and finds the special-token text that came from their contents.
pub(super) fn render_prompt(
    template: &ChatTemplate,
    tokenizer: &Tokenizer,
    messages: &[ChatMessage],
    add_generation_prompt: bool,
    inputs: &TemplateInputs,
) -> Result<RenderedPrompt, TokenizerError> {
    let text = template.render_with(messages, add_generation_prompt, inputs)?;
    // The special-token texts of each message, by marker number.
    let mut originals: Vec<(usize, &str)> = Vec::new();
    let mut marked = Vec::with_capacity(messages.len());
    for (index, message) in messages.iter().enumerate() {
        let ranges = tokenizer.special_text_ranges(&message.content);
        if ranges.is_empty() {
            marked.push(message.clone());
            continue;
        }
        let mut content = String::with_capacity(message.content.len());
        let mut copied = 0;
        for range in ranges {
            content.push_str(&message.content[copied..range.start]);
            content.push(marker(originals.len()).ok_or_else(|| too_many(index))?);
            originals.push((index, &message.content[range.clone()]));
            copied = range.end;
        }
        content.push_str(&message.content[copied..]);
        marked.push(ChatMessage {
            content,
            ..message.clone()
        });
    }
    let Some(&(first_message, first_text)) = originals.first() else {
        return Ok(RenderedPrompt {
            text,
            literal: Vec::new(),
        });
    };
    let inseparable = || TokenizerError::SpecialTextInContent {
        message: first_message,
        text: first_text.to_string(),
    };
    // A marker already in the input would be taken for one of ours.
    let used = |character: char| marker_number(character).is_some_and(|n| n < originals.len());
    if text.chars().any(used)
        || messages
            .iter()
            .any(|message| message.content.chars().any(used))
    {
        return Err(inseparable());
    }
    let rendered = template.render_with(&marked, add_generation_prompt, inputs)?;
    let mut restored = String::with_capacity(text.len());
    let mut literal = Vec::with_capacity(originals.len());
    for character in rendered.chars() {
        match marker_number(character).and_then(|n| originals.get(n)) {
            Some(&(_, original)) => {
                literal.push(restored.len()..restored.len() + original.len());
                restored.push_str(original);
            }
            None => restored.push(character),
        }
    }
    if restored != text {
        return Err(inseparable());
    }
    Ok(RenderedPrompt { text, literal })
}

/// The marker of occurrence `number`.
fn marker(number: usize) -> Option<char> {
    if number >= MARKER_COUNT {
        return None;
    }
    char::from_u32(FIRST_MARKER + number as u32)
}

/// The occurrence number of a marker character.
fn marker_number(character: char) -> Option<usize> {
    let number = (character as u32).checked_sub(FIRST_MARKER)? as usize;
    (number < MARKER_COUNT).then_some(number)
}

fn too_many(message: usize) -> TokenizerError {
    TokenizerError::SpecialTextInContent {
        message,
        text: format!("more than {MARKER_COUNT} special-token texts"),
    }
}

#[cfg(test)]
mod tests {
    use super::{marker, marker_number, MARKER_COUNT};

    #[test]
    fn markers_round_trip() {
        for number in [0, 1, 1000, MARKER_COUNT - 1] {
            let character = marker(number).expect("a marker");
            assert_eq!(marker_number(character), Some(number));
        }
        assert_eq!(marker(MARKER_COUNT), None);
        assert_eq!(marker_number('a'), None);
    }
}
