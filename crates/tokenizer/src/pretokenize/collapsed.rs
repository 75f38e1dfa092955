//! The general-purpose path: a regex run with fancy-regex the way llama.cpp runs it with
//! `std::regex`, on "collapsed" text when the pattern uses `\p{..}` classes.

use super::SplitScratch;
use crate::unicode::{self, CodepointFlags};

const COLLAPSED_NUMBER: u32 = 0xD1;
const COLLAPSED_LETTER: u32 = 0xD2;
const COLLAPSED_PUNCTUATION: u32 = 0xD3;
const COLLAPSED_MARK: u32 = 0xD4;
const COLLAPSED_SYMBOL: u32 = 0xD5;
const COLLAPSED_OTHER: u32 = 0xD0;

/// Rewrites `\p{X}` into the collapsed alphabet, as llama.cpp's `unicode_regex_split` does:
/// the category stand-in plus the ASCII members of the category.
pub(super) fn collapse_pattern(pattern: &str) -> String {
    let replacement = |category: &str| -> Option<String> {
        let (stand_in, ascii) = match category {
            "N" => (COLLAPSED_NUMBER, "0-9"),
            "L" => (COLLAPSED_LETTER, "A-Za-z"),
            "P" => (COLLAPSED_PUNCTUATION, r"!-#%-*,-/:-;?-@\[-\]_\{\}"),
            "M" => (COLLAPSED_MARK, ""),
            "S" => (COLLAPSED_SYMBOL, r"\$\+<->\^`\|"),
            _ => return None,
        };
        Some(format!("\\x{{{stand_in:X}}}{ascii}"))
    };
    let bytes = pattern.as_bytes();
    let mut out = String::with_capacity(pattern.len() * 2);
    let mut inside_class = false;
    let mut index = 0;
    while index < pattern.len() {
        let escaped = index > 0 && bytes[index - 1] == b'\\';
        if bytes[index] == b'[' && !escaped {
            inside_class = true;
        } else if bytes[index] == b']' && inside_class && !escaped {
            inside_class = false;
        } else if pattern[index..].starts_with(r"\p{") {
            if let Some(close) = pattern[index..].find('}') {
                if let Some(class) = replacement(&pattern[index + 3..index + close]) {
                    if inside_class {
                        out.push_str(&class);
                    } else {
                        out.push('[');
                        out.push_str(&class);
                        out.push(']');
                    }
                    index += close + 1;
                    continue;
                }
            }
        }
        let character = pattern[index..]
            .chars()
            .next()
            .expect("index is on a char boundary");
        out.push(character);
        index += character.len_utf8();
    }
    out
}

fn collapse_codepoint(codepoint: u32) -> u32 {
    if codepoint < 128 {
        return codepoint;
    }
    let flags = unicode::flags(codepoint);
    if flags.is_whitespace() {
        return 0x0B;
    }
    match flags.category() {
        CodepointFlags::NUMBER => COLLAPSED_NUMBER,
        CodepointFlags::LETTER => COLLAPSED_LETTER,
        CodepointFlags::PUNCTUATION => COLLAPSED_PUNCTUATION,
        CodepointFlags::MARK => COLLAPSED_MARK,
        CodepointFlags::SYMBOL => COLLAPSED_SYMBOL,
        _ => COLLAPSED_OTHER,
    }
}

pub(super) fn split_regex(
    regex: &fancy_regex::Regex,
    collapsed: bool,
    segment: &[u32],
    scratch: &mut SplitScratch,
    out: &mut Vec<usize>,
) {
    scratch.haystack.clear();
    scratch.char_index.clear();
    for (position, &codepoint) in segment.iter().enumerate() {
        let mapped = if collapsed {
            collapse_codepoint(codepoint)
        } else if codepoint > 0x7F && unicode::flags(codepoint).is_whitespace() {
            0x0B
        } else {
            codepoint
        };
        // Surrogates (from lenient decoding) cannot live in a `str`; U+FFFD stands in.
        let character = char::from_u32(mapped).unwrap_or(char::REPLACEMENT_CHARACTER);
        for _ in 0..character.len_utf8() {
            scratch.char_index.push(position as u32);
        }
        scratch.haystack.push(character);
    }
    scratch.char_index.push(segment.len() as u32);
    let mut previous_end = 0usize;
    let mut byte_position = 0usize;
    while byte_position <= scratch.haystack.len() {
        let found = match regex.find_from_pos(&scratch.haystack, byte_position) {
            Ok(Some(found)) => found,
            // A backtracking limit is the only failure; the rest of the segment stays one piece.
            Ok(None) | Err(_) => break,
        };
        let start = scratch.char_index[found.start()] as usize;
        let end = scratch.char_index[found.end()] as usize;
        if start > previous_end {
            out.push(start - previous_end);
        }
        if end > start {
            out.push(end - start);
        }
        previous_end = end;
        byte_position = if found.end() > found.start() {
            found.end()
        } else {
            let next_char = scratch.haystack[found.end()..]
                .chars()
                .next()
                .map_or(1, char::len_utf8);
            found.end() + next_char
        };
    }
    if segment.len() > previous_end {
        out.push(segment.len() - previous_end);
    }
}
