//! Pre-tokenizers of byte-level BPE vocabularies: the text is cut into words before merging,
//! with the rules llama.cpp applies for each `tokenizer.ggml.pre` value (llama-vocab.cpp).
//!
//! Like llama.cpp, a pre-tokenizer is a list of regexes applied in turn, each one cutting the
//! pieces left by the previous one (unmatched stretches become pieces too). The GPT-2 and
//! llama-3 patterns run as hand-written splitters (llama.cpp's `unicode_regex_split_custom_*`);
//! the others run on fancy-regex the way llama.cpp runs them on `std::regex`:
//! * a pattern with `\p{..}` classes sees a "collapsed" text where every non-ASCII codepoint
//!   is replaced by one stand-in for its category (letter, number, ...), and `\p{L}` becomes
//!   "that stand-in or A-Za-z" -- so only ASCII is matched by literal classes there;
//! * a pattern without them sees the codepoints, with non-ASCII whitespace replaced by U+000B.

use crate::error::TokenizerError;
use crate::unicode::{self, CodepointFlags};

/// The pre-tokenizer names accepted in `tokenizer.ggml.pre`, with their llama.cpp family.
const KNOWN: &[(&str, Family)] = &[
    ("default", Family::Default),
    ("llama3", Family::Llama3),
    ("llama-v3", Family::Llama3),
    ("llama-bpe", Family::Llama3),
    ("falcon3", Family::Llama3),
    ("dbrx", Family::Llama3),
    ("smaug-bpe", Family::Llama3),
    ("qwen2", Family::Qwen2),
    ("deepseek-r1-qwen", Family::Qwen2),
    ("stablelm2", Family::Qwen2),
    ("megrez", Family::Qwen2),
    ("smollm", Family::Starcoder),
    ("starcoder", Family::Starcoder),
    ("refact", Family::Starcoder),
    ("command-r", Family::Starcoder),
    ("codeshell", Family::Starcoder),
    ("exaone", Family::Starcoder),
    ("minerva-7b", Family::Starcoder),
    ("gpt-2", Family::Gpt2),
    ("phi-2", Family::Gpt2),
    ("mpt", Family::Gpt2),
    ("olmo", Family::Gpt2),
    ("jais", Family::Gpt2),
    ("trillion", Family::Gpt2),
    ("deepseek-llm", Family::DeepseekLlm),
    ("deepseek-coder", Family::DeepseekCoder),
    ("falcon", Family::Falcon),
];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Family {
    Default,
    Llama3,
    Qwen2,
    Starcoder,
    Gpt2,
    DeepseekLlm,
    DeepseekCoder,
    Falcon,
}

const GPT2_PATTERN: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)";
const LLAMA3_PATTERN: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN2_PATTERN: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const DEEPSEEK_LLM_LETTERS: &str = "\\s?[A-Za-zµÀ-ÖØ-öø-ƺƼ-ƿǄ-ʓʕ-ʯͰ-ͳͶͷͻ-ͽͿΆΈ-ΊΌΎ-ΡΣ-ϵϷ-ҁҊ-ԯԱ-ՖႠ-ჅᎠ-Ᏽᏸ-ᏽᲐ-ᲺᲽ-Ჿᴀ-ᴫᵫ-ᵷᵹ-ᶚḀ-ἕἘ-Ἕἠ-ὅὈ-Ὅὐ-ὗὙὛὝὟ-\u{1F7D}ᾀ-ᾴᾶ-ᾼ\u{1FBE}ῂ-ῄῆ-ῌῐ-\u{1FD3}ῖ-\u{1FDB}ῠ-Ῥῲ-ῴῶ-ῼℂℇℊ-ℓℕℙ-ℝℤ\u{2126}ℨ\u{212A}-ℭℯ-ℴℹℼ-ℿⅅ-ⅉⅎↃↄⰀ-ⱻⱾ-ⳤⳫ-ⳮⳲⳳꙀ-ꙭꚀ-ꚛꜢ-ꝯꝱ-ꞇꞋ-ꞎꭰ-ꮿﬀ-ﬆﬓ-ﬗＡ-Ｚａ-ｚ𐐀-𐑏𐒰-𐓓𐓘-𐓻𐲀-𐲲𐳀-𐳲𑢠-𑣟𞤀-𞥃]+";

impl Family {
    fn patterns(self) -> &'static [&'static str] {
        match self {
            Family::Default => &[
                r"[\p{P}\$\+<=>\^~\|]+",
                GPT2_PATTERN,
                r"\p{N}+",
                "[0-9][0-9][0-9]",
            ],
            Family::Llama3 => &[LLAMA3_PATTERN],
            Family::Qwen2 => &[QWEN2_PATTERN],
            Family::Starcoder => &[r"\p{N}", GPT2_PATTERN],
            Family::Gpt2 => &[GPT2_PATTERN],
            Family::DeepseekLlm => &[
                "[\r\n]",
                DEEPSEEK_LLM_LETTERS,
                "\\s?[!-/:-~！-／：-～‘-‟　-。]+",
                "\\s+$",
                "[一-龥ࠀ-一가-퟿]+",
                r"\p{N}+",
            ],
            Family::DeepseekCoder => &["[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", "[一-龥ࠀ-一가-퟿]+", r"\p{N}"],
            Family::Falcon => &[
                r"[\p{P}\$\+<=>\^~\|`]+",
                GPT2_PATTERN,
                "[0-9][0-9][0-9]",
            ],
        }
    }
}

/// One splitting step.
#[derive(Debug)]
enum Rule {
    /// llama.cpp's hand-written GPT-2 splitter.
    Gpt2,
    /// llama.cpp's hand-written llama-3 splitter.
    Llama3,
    /// `\p{N}`: every number codepoint alone.
    SingleNumbers,
    /// A general regex, on collapsed text (`collapsed`) or on codepoints.
    Regex { regex: fancy_regex::Regex, collapsed: bool },
}

/// A compiled pre-tokenizer.
#[derive(Debug)]
pub struct PreTokenizer {
    name: String,
    rules: Vec<Rule>,
}

const COLLAPSED_NUMBER: u32 = 0xD1;
const COLLAPSED_LETTER: u32 = 0xD2;
const COLLAPSED_PUNCTUATION: u32 = 0xD3;
const COLLAPSED_MARK: u32 = 0xD4;
const COLLAPSED_SYMBOL: u32 = 0xD5;
const COLLAPSED_OTHER: u32 = 0xD0;

impl PreTokenizer {
    /// Builds the pre-tokenizer for a `tokenizer.ggml.pre` value (absent: `default`).
    /// An unknown name is an error that lists the known ones.
    pub fn new(name: Option<&str>) -> Result<PreTokenizer, TokenizerError> {
        let name = name.unwrap_or("default");
        let family = KNOWN
            .iter()
            .find(|(known, _)| *known == name)
            .map(|&(_, family)| family)
            .ok_or_else(|| TokenizerError::UnknownPreTokenizer {
                found: name.to_string(),
                known: KNOWN.iter().map(|(known, _)| *known).collect::<Vec<_>>().join(", "),
            })?;
        let rules = family.patterns().iter().map(|pattern| compile(pattern)).collect::<Result<_, _>>()?;
        Ok(PreTokenizer { name: name.to_string(), rules })
    }

    /// The `tokenizer.ggml.pre` name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Cuts `codepoints` into words; returns the length (in codepoints) of each word, in order.
    pub fn split(&self, codepoints: &[u32], scratch: &mut SplitScratch) -> Vec<usize> {
        let mut lengths = vec![codepoints.len()];
        if codepoints.is_empty() {
            return Vec::new();
        }
        for rule in &self.rules {
            let mut next = Vec::with_capacity(lengths.len() * 2);
            let mut start = 0;
            for &length in &lengths {
                let segment = &codepoints[start..start + length];
                match rule {
                    Rule::Gpt2 => split_gpt2(segment, &mut next),
                    Rule::Llama3 => split_llama3(segment, &mut next),
                    Rule::SingleNumbers => split_single_numbers(segment, &mut next),
                    Rule::Regex { regex, collapsed } => split_regex(regex, *collapsed, segment, scratch, &mut next),
                }
                start += length;
            }
            lengths = next;
        }
        lengths
    }
}

/// Reusable buffers for the regex rules.
#[derive(Default)]
pub struct SplitScratch {
    haystack: String,
    char_index: Vec<u32>,
}

fn compile(pattern: &'static str) -> Result<Rule, TokenizerError> {
    if pattern == GPT2_PATTERN {
        return Ok(Rule::Gpt2);
    }
    if pattern == LLAMA3_PATTERN {
        return Ok(Rule::Llama3);
    }
    if pattern == r"\p{N}" {
        return Ok(Rule::SingleNumbers);
    }
    let collapsed = pattern.contains(r"\p{");
    let translated = if collapsed { collapse_pattern(pattern) } else { pattern.to_string() };
    let regex = fancy_regex::Regex::new(&translated).map_err(|error| TokenizerError::Regex {
        pattern: pattern.to_string(),
        message: error.to_string(),
    })?;
    Ok(Rule::Regex { regex, collapsed })
}

/// Rewrites `\p{X}` into the collapsed alphabet, as llama.cpp's `unicode_regex_split` does:
/// the category stand-in plus the ASCII members of the category.
fn collapse_pattern(pattern: &str) -> String {
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
        let character = pattern[index..].chars().next().expect("index is on a char boundary");
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

fn split_regex(
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
            let next_char = scratch.haystack[found.end()..].chars().next().map_or(1, char::len_utf8);
            found.end() + next_char
        };
    }
    if segment.len() > previous_end {
        out.push(segment.len() - previous_end);
    }
}

fn split_single_numbers(segment: &[u32], out: &mut Vec<usize>) {
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
        self.segment.get(position).map_or(CodepointFlags::NONE, |&codepoint| unicode::flags(codepoint))
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
fn split_gpt2(segment: &[u32], out: &mut Vec<usize>) {
    let mut cursor = Cursor { segment, previous_end: 0, out };
    let end = segment.len();
    let mut position = 0;
    while position < end {
        let codepoint = cursor.codepoint(position);
        let flags = cursor.flags(position);
        if codepoint == u32::from(b'\'') && position + 1 < end {
            let next = cursor.codepoint(position + 1);
            if [b's', b't', b'm', b'd'].iter().any(|&c| next == u32::from(c)) {
                position += cursor.add(position + 2);
                continue;
            }
            if position + 2 < end {
                let pair = (next, cursor.codepoint(position + 2));
                if [(b'r', b'e'), (b'v', b'e'), (b'l', b'l')].iter().any(|&(a, b)| pair == (u32::from(a), u32::from(b))) {
                    position += cursor.add(position + 3);
                    continue;
                }
            }
        }
        let space = codepoint == u32::from(b' ');
        let mut flags2 = if space { cursor.flags(position + 1) } else { flags };
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
fn split_llama3(segment: &[u32], out: &mut Vec<usize>) {
    let mut cursor = Cursor { segment, previous_end: 0, out };
    let end = segment.len();
    let is_newline = |codepoint: u32| codepoint == u32::from(b'\r') || codepoint == u32::from(b'\n');
    let mut position = 0;
    while position < end {
        let codepoint = cursor.codepoint(position);
        let flags = cursor.flags(position);
        if codepoint == u32::from(b'\'') && position + 1 < end {
            let next = ascii_lowercase(cursor.codepoint(position + 1));
            if [b's', b't', b'm', b'd'].iter().any(|&c| next == u32::from(c)) {
                position += cursor.add(position + 2);
                continue;
            }
            if position + 2 < end {
                let pair = (next, ascii_lowercase(cursor.codepoint(position + 2)));
                if [(b'r', b'e'), (b'v', b'e'), (b'l', b'l')].iter().any(|&(a, b)| pair == (u32::from(a), u32::from(b))) {
                    position += cursor.add(position + 3);
                    continue;
                }
            }
        }
        if !(is_newline(codepoint) || flags.is_number()) && (flags.is_letter() || cursor.flags(position + 1).is_letter()) {
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
        let mut flags2 = if space { cursor.flags(position + 1) } else { flags };
        if !(flags2.is_whitespace() || flags2.is_letter() || flags2.is_number()) && flags.is_some() {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn words(pre: &str, text: &str) -> Vec<String> {
        let pre = PreTokenizer::new(Some(pre)).expect("known pre-tokenizer");
        let codepoints: Vec<u32> = text.chars().map(u32::from).collect();
        let mut start = 0;
        pre.split(&codepoints, &mut SplitScratch::default())
            .into_iter()
            .map(|length| {
                let word: String = text.chars().skip(start).take(length).collect();
                start += length;
                word
            })
            .collect()
    }

    #[test]
    fn every_known_pattern_compiles() {
        for (name, _) in KNOWN {
            PreTokenizer::new(Some(name)).expect("pattern compiles");
        }
    }

    #[test]
    fn unknown_name_lists_the_known_ones() {
        let error = PreTokenizer::new(Some("nope")).expect_err("unknown");
        let message = error.to_string();
        assert!(message.contains("nope") && message.contains("qwen2") && message.contains("smollm"), "{message}");
    }

    #[test]
    fn gpt2_splits_like_the_regex() {
        assert_eq!(words("gpt-2", "Hello world's  end 123!!"), ["Hello", " world", "'s", " ", " end", " 123", "!!"]);
    }

    #[test]
    fn smollm_splits_digits_first() {
        assert_eq!(words("smollm", "a 2024b"), ["a", " ", "2", "0", "2", "4", "b"]);
    }

    #[test]
    fn llama3_groups_three_digits_and_newlines() {
        assert_eq!(words("llama-bpe", "12345 I'M\n\n x"), ["123", "45", " I", "'M", "\n\n", " x"]);
    }

    #[test]
    fn qwen2_keeps_single_digits_and_unicode_letters() {
        assert_eq!(words("qwen2", "héllo 42 世界"), ["héllo", " ", "4", "2", " 世界"]);
    }
}
