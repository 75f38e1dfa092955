//! Unicode facts the tokenizers need, with llama.cpp's conventions: codepoint category flags
//! (general categories from the Unicode tables of `regex-syntax`), its whitespace set, its
//! lenient UTF-8 decoding (an invalid byte becomes U+FFFD) and GPT-2's byte-to-character map.

use std::sync::OnceLock;

/// Number of Unicode codepoints (U+0000 ..= U+10FFFF).
const MAX_CODEPOINTS: usize = 0x11_0000;

/// The replacement character used for bytes that are not valid UTF-8.
pub const REPLACEMENT: u32 = 0xFFFD;

/// Category flags of one codepoint, as llama.cpp's `unicode_cpt_flags`.
///
/// A codepoint outside the text (past the end of a segment) has no flag at all
/// ([`CodepointFlags::NONE`]); an unassigned codepoint is [`CodepointFlags::UNDEFINED`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CodepointFlags(u16);

impl CodepointFlags {
    /// No flag: the position lies outside the segment.
    pub const NONE: CodepointFlags = CodepointFlags(0);
    /// Unassigned codepoint (`Cn`).
    pub const UNDEFINED: CodepointFlags = CodepointFlags(0x0001);
    /// `\p{N}`.
    pub const NUMBER: CodepointFlags = CodepointFlags(0x0002);
    /// `\p{L}`.
    pub const LETTER: CodepointFlags = CodepointFlags(0x0004);
    /// `\p{Z}`.
    pub const SEPARATOR: CodepointFlags = CodepointFlags(0x0008);
    /// `\p{M}`.
    pub const MARK: CodepointFlags = CodepointFlags(0x0010);
    /// `\p{P}`.
    pub const PUNCTUATION: CodepointFlags = CodepointFlags(0x0020);
    /// `\p{S}`.
    pub const SYMBOL: CodepointFlags = CodepointFlags(0x0040);
    /// `\p{C}` other than `Cn`.
    pub const CONTROL: CodepointFlags = CodepointFlags(0x0080);
    const WHITESPACE_BIT: u16 = 0x0100;
    const CATEGORY_MASK: u16 = 0x00FF;

    /// Whether the codepoint has the `White_Space` property (llama.cpp's list).
    pub fn is_whitespace(self) -> bool {
        self.0 & Self::WHITESPACE_BIT != 0
    }
    /// Whether the codepoint is a letter (`\p{L}`).
    pub fn is_letter(self) -> bool {
        self.0 & Self::LETTER.0 != 0
    }
    /// Whether the codepoint is a number (`\p{N}`).
    pub fn is_number(self) -> bool {
        self.0 & Self::NUMBER.0 != 0
    }
    /// Whether any flag is set (false only outside the segment).
    pub fn is_some(self) -> bool {
        self.0 != 0
    }
    /// The category part of the flags (one of the category constants).
    pub fn category(self) -> CodepointFlags {
        CodepointFlags(self.0 & Self::CATEGORY_MASK)
    }
}

/// Whether `codepoint` is in llama.cpp's whitespace set (the Unicode `White_Space` property).
fn is_whitespace_codepoint(codepoint: u32) -> bool {
    matches!(codepoint, 0x09..=0x0D | 0x20 | 0x85 | 0xA0 | 0x1680 | 0x2000..=0x200A)
        || matches!(codepoint, 0x2028 | 0x2029 | 0x202F | 0x205F | 0x3000)
}

/// Codepoint ranges of one Unicode property class, read from `regex-syntax`'s tables.
fn class_ranges(property: &str) -> Vec<(u32, u32)> {
    let hir = regex_syntax::Parser::new()
        .parse(&format!("\\p{{{property}}}"))
        .expect("a general category name that regex-syntax knows");
    match hir.kind() {
        regex_syntax::hir::HirKind::Class(regex_syntax::hir::Class::Unicode(class)) => class
            .ranges()
            .iter()
            .map(|range| (u32::from(range.start()), u32::from(range.end())))
            .collect(),
        _ => Vec::new(),
    }
}

fn flag_table() -> &'static [u16] {
    static TABLE: OnceLock<Vec<u16>> = OnceLock::new();
    TABLE.get_or_init(|| {
        let mut table = vec![CodepointFlags::UNDEFINED.0; MAX_CODEPOINTS];
        let categories: [(&str, CodepointFlags); 9] = [
            ("N", CodepointFlags::NUMBER),
            ("L", CodepointFlags::LETTER),
            ("Z", CodepointFlags::SEPARATOR),
            ("M", CodepointFlags::MARK),
            ("P", CodepointFlags::PUNCTUATION),
            ("S", CodepointFlags::SYMBOL),
            ("Cc", CodepointFlags::CONTROL),
            ("Cf", CodepointFlags::CONTROL),
            ("Co", CodepointFlags::CONTROL),
        ];
        for (property, flag) in categories {
            for (start, end) in class_ranges(property) {
                for slot in &mut table[start as usize..=end as usize] {
                    *slot = flag.0;
                }
            }
        }
        // Surrogates (`Cs`) cannot appear in a Rust `char` class but llama.cpp decodes them.
        for slot in &mut table[0xD800..=0xDFFF] {
            *slot = CodepointFlags::CONTROL.0;
        }
        for (codepoint, slot) in table.iter_mut().enumerate() {
            if is_whitespace_codepoint(codepoint as u32) {
                *slot |= CodepointFlags::WHITESPACE_BIT;
            }
        }
        table
    })
}

/// Category flags of `codepoint` (UNDEFINED for values past U+10FFFF).
pub fn flags(codepoint: u32) -> CodepointFlags {
    flag_table()
        .get(codepoint as usize)
        .map_or(CodepointFlags::UNDEFINED, |&bits| CodepointFlags(bits))
}

/// Byte length of a UTF-8 sequence from its first byte, as llama.cpp's `unicode_len_utf8`
/// (a continuation byte counts as 1).
pub fn utf8_len(first_byte: u8) -> usize {
    const LOOKUP: [usize; 16] = [1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4];
    LOOKUP[usize::from(first_byte >> 4)]
}

/// Decodes UTF-8 leniently like llama.cpp's `unicode_cpts_from_utf8`: each byte that does not
/// start a well-formed sequence becomes U+FFFD (overlong forms are not checked).
pub fn codepoints_from_utf8(bytes: &[u8], out: &mut Vec<u32>) {
    out.clear();
    out.reserve(bytes.len());
    let mut offset = 0;
    while offset < bytes.len() {
        match decode_one(&bytes[offset..]) {
            Some((codepoint, length)) => {
                out.push(codepoint);
                offset += length;
            }
            None => {
                out.push(REPLACEMENT);
                offset += 1;
            }
        }
    }
}

fn decode_one(bytes: &[u8]) -> Option<(u32, usize)> {
    let first = u32::from(bytes[0]);
    let continuation = |index: usize| -> Option<u32> {
        let byte = *bytes.get(index)?;
        (byte & 0xC0 == 0x80).then_some(u32::from(byte & 0x3F))
    };
    if first & 0x80 == 0 {
        return Some((first, 1));
    }
    if first & 0x40 == 0 {
        return None;
    }
    if first & 0x20 == 0 {
        return Some((((first & 0x1F) << 6) | continuation(1)?, 2));
    }
    if first & 0x10 == 0 {
        let value = ((first & 0x0F) << 12) | (continuation(1)? << 6) | continuation(2)?;
        return Some((value, 3));
    }
    if first & 0x08 == 0 {
        let value = ((first & 0x07) << 18)
            | (continuation(1)? << 12)
            | (continuation(2)? << 6)
            | continuation(3)?;
        return Some((value, 4));
    }
    None
}

/// Appends the UTF-8 encoding of `codepoint`, as llama.cpp's `unicode_cpt_to_utf8`
/// (surrogates are encoded as three bytes; values past U+10FFFF become U+FFFD).
pub fn push_utf8(codepoint: u32, out: &mut Vec<u8>) {
    match codepoint {
        0..=0x7F => out.push(codepoint as u8),
        0x80..=0x7FF => {
            out.push(0xC0 | ((codepoint >> 6) & 0x1F) as u8);
            out.push(0x80 | (codepoint & 0x3F) as u8);
        }
        0x800..=0xFFFF => {
            out.push(0xE0 | ((codepoint >> 12) & 0x0F) as u8);
            out.push(0x80 | ((codepoint >> 6) & 0x3F) as u8);
            out.push(0x80 | (codepoint & 0x3F) as u8);
        }
        0x1_0000..=0x10_FFFF => {
            out.push(0xF0 | ((codepoint >> 18) & 0x07) as u8);
            out.push(0x80 | ((codepoint >> 12) & 0x3F) as u8);
            out.push(0x80 | ((codepoint >> 6) & 0x3F) as u8);
            out.push(0x80 | (codepoint & 0x3F) as u8);
        }
        _ => push_utf8(REPLACEMENT, out),
    }
}

/// GPT-2's reversible byte-to-character map: printable Latin-1 bytes map to themselves, the
/// 68 others to U+0100.. in byte order.
pub fn byte_to_char_table() -> &'static [char; 256] {
    static TABLE: OnceLock<[char; 256]> = OnceLock::new();
    TABLE.get_or_init(|| {
        let mut table = ['\0'; 256];
        let mut next_extra = 256u32;
        for (byte, slot) in table.iter_mut().enumerate() {
            let printable = matches!(byte, 0x21..=0x7E | 0xA1..=0xAC | 0xAE..=0xFF);
            let codepoint = if printable {
                byte as u32
            } else {
                let value = next_extra;
                next_extra += 1;
                value
            };
            *slot = char::from_u32(codepoint).expect("codepoints below U+0144 are valid chars");
        }
        table
    })
}

/// Inverse of [`byte_to_char_table`]: the byte a GPT-2 byte-level character stands for.
pub fn char_to_byte(character: char) -> Option<u8> {
    static INVERSE: OnceLock<[Option<u8>; 0x144]> = OnceLock::new();
    let inverse = INVERSE.get_or_init(|| {
        let mut inverse = [None; 0x144];
        for (byte, &character) in byte_to_char_table().iter().enumerate() {
            inverse[character as usize] = Some(byte as u8);
        }
        inverse
    });
    inverse.get(character as usize).copied().flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn categories_follow_unicode() {
        assert!(flags('a' as u32).is_letter());
        assert!(flags('é' as u32).is_letter());
        assert!(flags('中' as u32).is_letter());
        assert!(flags('7' as u32).is_number());
        assert!(flags('½' as u32).is_number());
        assert_eq!(flags('!' as u32).category(), CodepointFlags::PUNCTUATION);
        assert_eq!(flags('$' as u32).category(), CodepointFlags::SYMBOL);
        assert_eq!(flags(0x301).category(), CodepointFlags::MARK);
        assert_eq!(flags(0x200B).category(), CodepointFlags::CONTROL);
        assert!(flags(0xA0).is_whitespace());
        assert!(flags(0x3000).is_whitespace());
        assert!(!flags(0x200B).is_whitespace());
        assert_eq!(flags(0x0378), CodepointFlags::UNDEFINED);
    }

    #[test]
    fn lenient_decoding_replaces_each_bad_byte() {
        let mut out = Vec::new();
        codepoints_from_utf8(b"a\xE2\x82\xACb\xE2\x82", &mut out);
        assert_eq!(out, vec![0x61, 0x20AC, 0x62, REPLACEMENT, REPLACEMENT]);
    }

    #[test]
    fn byte_map_round_trips() {
        let table = byte_to_char_table();
        assert_eq!(table[b' ' as usize], 'Ġ');
        assert_eq!(table[b'\n' as usize], 'Ċ');
        for byte in 0..=255u8 {
            assert_eq!(char_to_byte(table[byte as usize]), Some(byte));
        }
    }
}
