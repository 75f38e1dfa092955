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

mod collapsed;
mod splitters;

use crate::error::TokenizerError;
use collapsed::{collapse_pattern, split_regex};
use splitters::{split_gpt2, split_llama3, split_single_numbers};

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

const GPT2_PATTERN: &str =
    r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)";
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
            Family::DeepseekCoder => &[
                "[\r\n]",
                r"\s?\p{L}+",
                r"\s?\p{P}+",
                "[一-龥ࠀ-一가-퟿]+",
                r"\p{N}",
            ],
            Family::Falcon => &[r"[\p{P}\$\+<=>\^~\|`]+", GPT2_PATTERN, "[0-9][0-9][0-9]"],
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
    Regex {
        regex: fancy_regex::Regex,
        collapsed: bool,
    },
}

/// A compiled pre-tokenizer.
#[derive(Debug)]
pub struct PreTokenizer {
    name: String,
    rules: Vec<Rule>,
}

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
                known: KNOWN
                    .iter()
                    .map(|(known, _)| *known)
                    .collect::<Vec<_>>()
                    .join(", "),
            })?;
        let rules = family
            .patterns()
            .iter()
            .map(|pattern| compile(pattern))
            .collect::<Result<_, _>>()?;
        Ok(PreTokenizer {
            name: name.to_string(),
            rules,
        })
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
                    Rule::Regex { regex, collapsed } => {
                        split_regex(regex, *collapsed, segment, scratch, &mut next)
                    }
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
    let translated = if collapsed {
        collapse_pattern(pattern)
    } else {
        pattern.to_string()
    };
    let regex = fancy_regex::Regex::new(&translated).map_err(|error| TokenizerError::Regex {
        pattern: pattern.to_string(),
        message: error.to_string(),
    })?;
    Ok(Rule::Regex { regex, collapsed })
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
        assert!(
            message.contains("nope") && message.contains("qwen2") && message.contains("smollm"),
            "{message}"
        );
    }

    #[test]
    fn gpt2_splits_like_the_regex() {
        assert_eq!(
            words("gpt-2", "Hello world's  end 123!!"),
            ["Hello", " world", "'s", " ", " end", " 123", "!!"]
        );
    }

    #[test]
    fn smollm_splits_digits_first() {
        assert_eq!(
            words("smollm", "a 2024b"),
            ["a", " ", "2", "0", "2", "4", "b"]
        );
    }

    #[test]
    fn llama3_groups_three_digits_and_newlines() {
        assert_eq!(
            words("llama-bpe", "12345 I'M\n\n x"),
            ["123", "45", " I", "'M", "\n\n", " x"]
        );
    }

    #[test]
    fn qwen2_keeps_single_digits_and_unicode_letters() {
        assert_eq!(
            words("qwen2", "héllo 42 世界"),
            ["héllo", " ", "4", "2", " 世界"]
        );
    }

    /// llama.cpp replaced the GPT-2 and llama-3 regexes by hand-written code; on llama.cpp's
    /// own test strings that code must cut exactly where the regex (collapsed path) does.
    #[test]
    fn hand_written_splitters_agree_with_their_regex() {
        let golden = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/golden/tokenizer");
        let path = format!("{golden}/llama_cpp_vocab_tests/ggml-vocab-llama-bpe.gguf.inp");
        let inputs = std::fs::read_to_string(path).expect("llama.cpp test strings");
        let mut scratch = SplitScratch::default();
        let mut checked = 0;
        for (pattern, custom) in [
            (GPT2_PATTERN, split_gpt2 as fn(&[u32], &mut Vec<usize>)),
            (LLAMA3_PATTERN, split_llama3),
        ] {
            let regex = fancy_regex::Regex::new(&collapse_pattern(pattern)).expect("compiles");
            for input in inputs.split("\n__ggml_vocab_test__\n") {
                let codepoints: Vec<u32> = input.chars().map(u32::from).collect();
                let (mut by_regex, mut by_hand) = (Vec::new(), Vec::new());
                split_regex(&regex, true, &codepoints, &mut scratch, &mut by_regex);
                custom(&codepoints, &mut by_hand);
                assert_eq!(by_regex, by_hand, "{pattern} on {input:?}");
                checked += 1;
            }
        }
        assert_eq!(checked, 2 * 47);
    }
}
