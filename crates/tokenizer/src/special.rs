//! Splitting the input at special-token text, as llama.cpp's `tokenizer_st_partition`:
//! special tokens are taken longest first; each one splits every remaining text fragment at all
//! its occurrences. Control and unknown tokens take part only when special-token parsing is on;
//! user-defined tokens always do.

use crate::vocab::{attr, Vocabulary};

/// A piece of the input: text still to be tokenized, or an already-known token.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Fragment {
    /// Byte range `start..end` of the input.
    Text { start: usize, end: usize },
    /// A special token.
    Token(u32),
}

/// Splits `text` into fragments.
pub(crate) fn partition(vocabulary: &Vocabulary, text: &[u8], parse_special: bool) -> Vec<Fragment> {
    let mut fragments = Vec::new();
    if text.is_empty() {
        return fragments;
    }
    fragments.push(Fragment::Text { start: 0, end: text.len() });
    for &id in &vocabulary.special_tokens {
        let token_attr = vocabulary.attr(id);
        if !parse_special && token_attr & (attr::CONTROL | attr::UNKNOWN) != 0 {
            continue;
        }
        let needle = vocabulary.texts[id as usize].as_bytes();
        // Cheap pre-check on the whole input: most special tokens never occur.
        if find(text, needle, 0).is_none() {
            continue;
        }
        let mut next = Vec::with_capacity(fragments.len() + 2);
        for fragment in fragments {
            let Fragment::Text { mut start, end } = fragment else {
                next.push(fragment);
                continue;
            };
            while let Some(found) = find(&text[..end], needle, start) {
                let mut left_end = found;
                if token_attr & attr::LSTRIP != 0 {
                    while left_end > start && is_c_space(text[left_end - 1]) {
                        left_end -= 1;
                    }
                }
                if left_end > start {
                    next.push(Fragment::Text { start, end: left_end });
                }
                next.push(Fragment::Token(id));
                start = found + needle.len();
                if token_attr & attr::RSTRIP != 0 {
                    while start < end && is_c_space(text[start]) {
                        start += 1;
                    }
                }
            }
            if start < end {
                next.push(Fragment::Text { start, end });
            }
        }
        fragments = next;
    }
    fragments
}

/// C's `isspace` in the "C" locale.
fn is_c_space(byte: u8) -> bool {
    matches!(byte, b' ' | b'\t' | b'\n' | 0x0B | 0x0C | b'\r')
}

/// First occurrence of `needle` in `haystack` at or after `from`.
fn find(haystack: &[u8], needle: &[u8], from: usize) -> Option<usize> {
    let first = *needle.first()?;
    let mut position = from;
    while position + needle.len() <= haystack.len() {
        let offset = haystack[position..=haystack.len() - needle.len()].iter().position(|&byte| byte == first)?;
        position += offset;
        if &haystack[position..position + needle.len()] == needle {
            return Some(position);
        }
        position += 1;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::find;

    #[test]
    fn find_locates_occurrences() {
        assert_eq!(find(b"abcabc", b"bc", 0), Some(1));
        assert_eq!(find(b"abcabc", b"bc", 2), Some(4));
        assert_eq!(find(b"abcabc", b"bd", 0), None);
        assert_eq!(find(b"ab", b"abc", 0), None);
    }
}
