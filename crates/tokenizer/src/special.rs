//! Splitting the input at special-token text, as llama.cpp's `tokenizer_st_partition`:
//! special tokens are taken longest first; each one splits every remaining text fragment at all
//! its occurrences. Control and unknown tokens take part only when special-token parsing is on;
//! user-defined tokens always do. Byte ranges marked literal (text that came from a chat
//! message's content) never yield control or unknown tokens.

use std::ops::Range;

use crate::vocab::{attr, Vocabulary};

/// The token kinds that only special-token parsing turns into tokens.
const PARSED_ONLY: u32 = attr::CONTROL | attr::UNKNOWN;

/// A piece of the input: text still to be tokenized, or an already-known token.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Fragment {
    /// Byte range `start..end` of the input.
    Text { start: usize, end: usize },
    /// A special token.
    Token(u32),
}

/// A byte trie over the special-token texts, to find in one pass which of them occur in an
/// input (vocabularies like Gemma's have thousands of control tokens).
#[derive(Debug, Default)]
pub(crate) struct SpecialTrie {
    /// Node 0 is the root; each node's children sorted by byte.
    children: Vec<Vec<(u8, u32)>>,
    /// Position in `Vocabulary::special_tokens` of the token ending at each node.
    terminal: Vec<Option<u32>>,
}

impl SpecialTrie {
    /// Builds the trie of `texts` (indexed by their position in the list).
    pub(crate) fn new<'a>(texts: impl Iterator<Item = &'a str>) -> SpecialTrie {
        let mut trie = SpecialTrie {
            children: vec![Vec::new()],
            terminal: vec![None],
        };
        for (index, text) in texts.enumerate() {
            let mut node = 0usize;
            for &byte in text.as_bytes() {
                node = match trie.children[node].binary_search_by_key(&byte, |&(key, _)| key) {
                    Ok(found) => trie.children[node][found].1 as usize,
                    Err(insert_at) => {
                        let child = trie.children.len();
                        trie.children.push(Vec::new());
                        trie.terminal.push(None);
                        trie.children[node].insert(insert_at, (byte, child as u32));
                        child
                    }
                };
            }
            trie.terminal[node].get_or_insert(index as u32);
        }
        trie
    }

    /// Marks in `present` (one flag per special token) every token that occurs in `text`.
    fn mark_present(&self, text: &[u8], present: &mut [bool]) {
        for start in 0..text.len() {
            let mut node = 0usize;
            for &byte in &text[start..] {
                match self.children[node].binary_search_by_key(&byte, |&(key, _)| key) {
                    Ok(found) => node = self.children[node][found].1 as usize,
                    Err(_) => break,
                }
                if let Some(index) = self.terminal[node] {
                    present[index as usize] = true;
                }
            }
        }
    }

    /// The position in `Vocabulary::special_tokens` of the longest token starting at
    /// `text[0]` for which `accept` holds, with its length.
    fn longest_at(&self, text: &[u8], accept: impl Fn(u32) -> bool) -> Option<(u32, usize)> {
        let mut node = 0usize;
        let mut longest = None;
        for (length, &byte) in text.iter().enumerate() {
            match self.children[node].binary_search_by_key(&byte, |&(key, _)| key) {
                Ok(found) => node = self.children[node][found].1 as usize,
                Err(_) => break,
            }
            if let Some(index) = self.terminal[node].filter(|&index| accept(index)) {
                longest = Some((index, length + 1));
            }
        }
        longest
    }
}

/// Byte ranges of control- and unknown-token texts in `text` (the tokens that special-token
/// parsing would produce), left to right, the longest at each position, not overlapping.
pub(crate) fn parsed_only_ranges(vocabulary: &Vocabulary, text: &[u8]) -> Vec<Range<usize>> {
    let is_parsed_only =
        |index: u32| vocabulary.attr(vocabulary.special_tokens[index as usize]) & PARSED_ONLY != 0;
    let mut ranges = Vec::new();
    let mut start = 0;
    while start < text.len() {
        match vocabulary
            .special_trie
            .longest_at(&text[start..], is_parsed_only)
        {
            Some((_, length)) => {
                ranges.push(start..start + length);
                start += length;
            }
            None => start += 1,
        }
    }
    ranges
}

/// Splits `text` into fragments. With `parse_special`, control and unknown tokens are split
/// out too, except where they overlap a `literal` range (sorted, not overlapping).
pub(crate) fn partition(
    vocabulary: &Vocabulary,
    text: &[u8],
    parse_special: bool,
    literal: &[Range<usize>],
) -> Vec<Fragment> {
    let mut fragments = Vec::new();
    if text.is_empty() {
        return fragments;
    }
    fragments.push(Fragment::Text {
        start: 0,
        end: text.len(),
    });
    // Most special tokens never occur: find those that do in one pass over the input.
    let mut present = vec![false; vocabulary.special_tokens.len()];
    vocabulary.special_trie.mark_present(text, &mut present);
    let occurring = vocabulary
        .special_tokens
        .iter()
        .zip(&present)
        .filter(|(_, &found)| found);
    for (&id, _) in occurring {
        let token_attr = vocabulary.attr(id);
        let parsed_only = token_attr & PARSED_ONLY != 0;
        if !parse_special && parsed_only {
            continue;
        }
        let needle = vocabulary.texts[id as usize].as_bytes();
        let mut next = Vec::with_capacity(fragments.len() + 2);
        for fragment in fragments {
            let Fragment::Text { mut start, end } = fragment else {
                next.push(fragment);
                continue;
            };
            let mut search_from = start;
            while let Some(found) = find(&text[..end], needle, search_from) {
                if parsed_only && overlaps(literal, found..found + needle.len()) {
                    search_from = found + 1;
                    continue;
                }
                let mut left_end = found;
                if token_attr & attr::LSTRIP != 0 {
                    while left_end > start && is_c_space(text[left_end - 1]) {
                        left_end -= 1;
                    }
                }
                if left_end > start {
                    next.push(Fragment::Text {
                        start,
                        end: left_end,
                    });
                }
                next.push(Fragment::Token(id));
                start = found + needle.len();
                if token_attr & attr::RSTRIP != 0 {
                    while start < end && is_c_space(text[start]) {
                        start += 1;
                    }
                }
                search_from = start;
            }
            if start < end {
                next.push(Fragment::Text { start, end });
            }
        }
        fragments = next;
    }
    fragments
}

/// Whether `range` overlaps one of the sorted, disjoint `ranges`.
fn overlaps(ranges: &[Range<usize>], range: Range<usize>) -> bool {
    let first_ending_after = ranges.partition_point(|candidate| candidate.end <= range.start);
    ranges
        .get(first_ending_after)
        .is_some_and(|candidate| candidate.start < range.end)
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
        let offset = haystack[position..=haystack.len() - needle.len()]
            .iter()
            .position(|&byte| byte == first)?;
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
    use super::{find, overlaps};

    #[test]
    fn overlaps_checks_sorted_ranges() {
        let ranges = [2..4, 8..10];
        assert!(overlaps(&ranges, 3..5));
        assert!(overlaps(&ranges, 0..3));
        assert!(overlaps(&ranges, 9..20));
        assert!(!overlaps(&ranges, 4..8));
        assert!(!overlaps(&ranges, 0..2));
        assert!(!overlaps(&[], 0..2));
    }

    #[test]
    fn find_locates_occurrences() {
        assert_eq!(find(b"abcabc", b"bc", 0), Some(1));
        assert_eq!(find(b"abcabc", b"bc", 2), Some(4));
        assert_eq!(find(b"abcabc", b"bd", 0), None);
        assert_eq!(find(b"ab", b"abc", 0), None);
    }
}
