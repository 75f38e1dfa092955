//! llama.cpp's hand-written splitters (`unicode_regex_split_custom_gpt2` / `_llama3`) and the
//! trivial `\p{N}` rule: the fast paths for the most common pre-tokenizers.

use crate::unicode::{self, CodepointFlags};

pub(super) fn split_single_numbers(segment: &[u32], out: &mut Vec<usize>) {
    let mut run = 0;
    for &codepoint in segment {
        if unicode::flags(codepoint).is_number() {
            if run > 0 {
                out.push(run);
                run = 0;
            }
            out.push(1);
        } else {
            run += 1;
        }
    }
    if run > 0 {
        out.push(run);
    }
}

/// Position helpers shared by the two hand-written splitters: a position past the segment has
/// no codepoint and no flags.
struct Cursor<'a> {
    segment: &'a [u32],
    previous_end: usize,
    out: &'a mut Vec<usize>,
}

const OUT_OF_RANGE: u32 = u32::MAX;

impl Cursor<'_> {
    fn codepoint(&self, position: usize) -> u32 {
        self.segment.get(position).copied().unwrap_or(OUT_OF_RANGE)
    }
    fn flags(&self, position: usize) -> CodepointFlags {
        self.segment
            .get(position)
            .map_or(CodepointFlags::NONE, |&codepoint| unicode::flags(codepoint))
    }
    /// Ends a word at `end`; returns its length.
    fn add(&mut self, end: usize) -> usize {
        let length = end - self.previous_end;
        if length > 0 {
            self.out.push(length);
        }
        self.previous_end = end;
        length
    }
}

fn is_other(flags: CodepointFlags) -> bool {
    !(flags.is_whitespace() || flags.is_letter() || flags.is_number()) && flags.is_some()
}

/// `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`
pub(super) fn split_gpt2(segment: &[u32], out: &mut Vec<usize>) {
    let mut cursor = Cursor {
        segment,
        previous_end: 0,
        out,
    };
    let end = segment.len();
    let mut position = 0;
    while position < end {
        let codepoint = cursor.codepoint(position);
        let flags = cursor.flags(position);
        if codepoint == u32::from(b'\'') && position + 1 < end {
            let next = cursor.codepoint(position + 1);
            if [b's', b't', b'm', b'd']
                .iter()
                .any(|&c| next == u32::from(c))
            {
                position += cursor.add(position + 2);
                continue;
            }
            if position + 2 < end {
                let pair = (next, cursor.codepoint(position + 2));
                if [(b'r', b'e'), (b'v', b'e'), (b'l', b'l')]
                    .iter()
                    .any(|&(a, b)| pair == (u32::from(a), u32::from(b)))
                {
                    position += cursor.add(position + 3);
                    continue;
                }
            }
        }
        let space = codepoint == u32::from(b' ');
        let mut flags2 = if space {
            cursor.flags(position + 1)
        } else {
            flags
        };
        if flags2.is_letter() {
            position += usize::from(space);
            while flags2.is_letter() {
                position += 1;
                flags2 = cursor.flags(position);
            }
            cursor.add(position);
            continue;
        }
        if flags2.is_number() {
            position += usize::from(space);
            while flags2.is_number() {
                position += 1;
                flags2 = cursor.flags(position);
            }
            cursor.add(position);
            continue;
        }
        if is_other(flags2) {
            position += usize::from(space);
            while is_other(flags2) {
                position += 1;
                flags2 = cursor.flags(position);
            }
            cursor.add(position);
            continue;
        }
        let mut whitespace = 0;
        while cursor.flags(position + whitespace).is_whitespace() {
            whitespace += 1;
        }
        if whitespace > 1 && cursor.codepoint(position + whitespace) != OUT_OF_RANGE {
            position += whitespace - 1;
            cursor.add(position);
            continue;
        }
        if whitespace > 0 {
            position += whitespace;
            cursor.add(position);
            continue;
        }
        position += 1;
        cursor.add(position);
    }
}

fn ascii_lowercase(codepoint: u32) -> u32 {
    char::from_u32(codepoint)
        .and_then(|character| {
            let mut lower = character.to_lowercase();
            match (lower.next(), lower.next()) {
                (Some(single), None) => Some(u32::from(single)),
                _ => None,
            }
        })
        .unwrap_or(codepoint)
}

/// `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
pub(super) fn split_llama3(segment: &[u32], out: &mut Vec<usize>) {
    let mut cursor = Cursor {
        segment,
        previous_end: 0,
        out,
    };
    let end = segment.len();
    let is_newline =
        |codepoint: u32| codepoint == u32::from(b'\r') || codepoint == u32::from(b'\n');
    let mut position = 0;
    while position < end {
        let codepoint = cursor.codepoint(position);
        let flags = cursor.flags(position);
        if codepoint == u32::from(b'\'') && position + 1 < end {
            let next = ascii_lowercase(cursor.codepoint(position + 1));
            if [b's', b't', b'm', b'd']
                .iter()
                .any(|&c| next == u32::from(c))
            {
                position += cursor.add(position + 2);
                continue;
            }
            if position + 2 < end {
                let pair = (next, ascii_lowercase(cursor.codepoint(position + 2)));
                if [(b'r', b'e'), (b'v', b'e'), (b'l', b'l')]
                    .iter()
                    .any(|&(a, b)| pair == (u32::from(a), u32::from(b)))
                {
                    position += cursor.add(position + 3);
                    continue;
                }
            }
        }
        if !(is_newline(codepoint) || flags.is_number())
            && (flags.is_letter() || cursor.flags(position + 1).is_letter())
        {
            position += 1;
            while cursor.flags(position).is_letter() {
                position += 1;
            }
            cursor.add(position);
            continue;
        }
        if flags.is_number() {
            let mut run_start = position;
            while cursor.flags(position).is_number() {
                position += 1;
                if position - run_start >= 3 {
                    cursor.add(position);
                    run_start = position;
                }
            }
            cursor.add(position);
            continue;
        }
        let space = codepoint == u32::from(b' ');
        let mut flags2 = if space {
            cursor.flags(position + 1)
        } else {
            flags
        };
        if !(flags2.is_whitespace() || flags2.is_letter() || flags2.is_number()) && flags.is_some()
        {
            position += usize::from(space);
            while is_other(flags2) {
                position += 1;
                flags2 = cursor.flags(position);
            }
            while is_newline(cursor.codepoint(position)) {
                position += 1;
            }
            cursor.add(position);
            continue;
        }
        let mut whitespace = 0;
        let mut last_newline_end = 0;
        while cursor.flags(position + whitespace).is_whitespace() {
            if is_newline(cursor.codepoint(position + whitespace)) {
                last_newline_end = position + whitespace + 1;
            }
            whitespace += 1;
        }
        if last_newline_end > 0 {
            position = last_newline_end;
            cursor.add(position);
            continue;
        }
        if whitespace > 1 && cursor.codepoint(position + whitespace) != OUT_OF_RANGE {
            position += whitespace - 1;
            cursor.add(position);
            continue;
        }
        if whitespace > 0 {
            position += whitespace;
            cursor.add(position);
            continue;
        }
        position += 1;
        cursor.add(position);
    }
}
