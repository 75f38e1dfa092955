//! Byte-level BPE (`tokenizer.ggml.model = gpt2`): the text is pre-tokenized into words, each
//! word's bytes start as one symbol each (GPT-2's byte-to-character map), and the adjacent pair
//! with the lowest merge rank is merged until none is left, exactly as llama.cpp's
//! `llm_tokenizer_bpe_session` (ties go to the leftmost pair).
//!
//! The merge loop works on token ids: a merge `(left, right)` maps to `(rank, merged id)`.
//! A byte whose character has no token is dropped, as in llama.cpp.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::hash::{BuildHasherDefault, Hasher};

use crate::error::TokenizerError;
use crate::pretokenize::{PreTokenizer, SplitScratch};
use crate::unicode;
use crate::vocab::{invalid, Vocabulary};

/// A fast hasher for the `u64` pair keys of the merge table.
#[derive(Default)]
pub(crate) struct PairHasher(u64);

impl Hasher for PairHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &byte in bytes {
            self.0 =
                (self.0.rotate_left(5) ^ u64::from(byte)).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
        }
    }
    fn write_u64(&mut self, value: u64) {
        self.0 = (value ^ (value >> 29)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        self.0 ^= self.0 >> 32;
    }
}

type PairMap = HashMap<u64, Merge, BuildHasherDefault<PairHasher>>;

#[derive(Clone, Copy, Debug)]
struct Merge {
    rank: u32,
    merged: u32,
}

fn pair_key(left: u32, right: u32) -> u64 {
    (u64::from(left) << 32) | u64::from(right)
}

/// The merge table and per-byte starting tokens of a byte-level BPE vocabulary.
#[derive(Debug)]
pub struct BytePairModel {
    merges: PairMap,
    /// Token of each byte's GPT-2 character, if the vocabulary has one.
    byte_tokens: [Option<u32>; 256],
    pre_tokenizer: PreTokenizer,
    /// llama-3-style vocabularies take a whole word as one token when it exists.
    ignore_merges: bool,
}

/// Reusable buffers for one encoding call.
#[derive(Default)]
pub(crate) struct BpeScratch {
    codepoints: Vec<u32>,
    word: Vec<u8>,
    encoded: String,
    symbols: Vec<Symbol>,
    queue: BinaryHeap<Reverse<(u32, u32, u32, u32)>>,
    split: SplitScratch,
}

#[derive(Clone, Copy, Debug)]
struct Symbol {
    id: Option<u32>,
    previous: u32,
    next: u32,
    alive: bool,
}

const NO_SYMBOL: u32 = u32::MAX;

impl BytePairModel {
    /// Builds the merge table from `tokenizer.ggml.merges` ("left right" strings, by rank).
    /// A merge naming a token that is not in the vocabulary is refused.
    pub fn new(
        vocabulary: &Vocabulary,
        merges: &[String],
        pre: Option<&str>,
    ) -> Result<BytePairModel, TokenizerError> {
        const KEY: &str = "tokenizer.ggml.merges";
        if merges.is_empty() {
            return Err(invalid(
                KEY,
                "a gpt2 vocabulary needs merges; the list is empty or absent".to_string(),
            ));
        }
        let mut table = PairMap::with_capacity_and_hasher(merges.len(), Default::default());
        for (rank, merge) in merges.iter().enumerate() {
            // llama.cpp splits at the first space after the first byte.
            let split = merge
                .as_bytes()
                .iter()
                .skip(1)
                .position(|&byte| byte == b' ')
                .map(|position| position + 1)
                .ok_or_else(|| {
                    invalid(KEY, format!("merge {rank} {merge:?} is not \"left right\""))
                })?;
            let (left, right) = (&merge[..split], &merge[split + 1..]);
            let lookup = |text: &str| {
                vocabulary.token_id(text).ok_or_else(|| {
                    invalid(
                        KEY,
                        format!("merge {rank} {merge:?} names {text:?}, which is not a token"),
                    )
                })
            };
            let (left_id, right_id) = (lookup(left)?, lookup(right)?);
            let merged = lookup(&format!("{left}{right}"))?;
            table.entry(pair_key(left_id, right_id)).or_insert(Merge {
                rank: rank as u32,
                merged,
            });
        }
        let characters = unicode::byte_to_char_table();
        let mut byte_tokens = [None; 256];
        for (byte, slot) in byte_tokens.iter_mut().enumerate() {
            *slot = vocabulary.token_id(characters[byte].encode_utf8(&mut [0; 4]));
        }
        let pre_tokenizer = PreTokenizer::new(pre)?;
        let ignore_merges = matches!(
            pre.unwrap_or("default"),
            "llama3" | "llama-v3" | "llama-bpe" | "falcon3"
        );
        Ok(BytePairModel {
            merges: table,
            byte_tokens,
            pre_tokenizer,
            ignore_merges,
        })
    }

    /// The pre-tokenizer's name.
    pub fn pre_tokenizer_name(&self) -> &str {
        self.pre_tokenizer.name()
    }

    /// Encodes one stretch of text (no special-token text in it) and appends the ids.
    pub(crate) fn encode(
        &self,
        vocabulary: &Vocabulary,
        text: &[u8],
        scratch: &mut BpeScratch,
        out: &mut Vec<u32>,
    ) {
        let mut codepoints = std::mem::take(&mut scratch.codepoints);
        unicode::codepoints_from_utf8(text, &mut codepoints);
        let lengths = self.pre_tokenizer.split(&codepoints, &mut scratch.split);
        let mut start = 0;
        for length in lengths {
            scratch.word.clear();
            for &codepoint in &codepoints[start..start + length] {
                unicode::push_utf8(codepoint, &mut scratch.word);
            }
            start += length;
            if self.ignore_merges {
                let characters = unicode::byte_to_char_table();
                scratch.encoded.clear();
                scratch
                    .encoded
                    .extend(scratch.word.iter().map(|&byte| characters[byte as usize]));
                if let Some(id) = vocabulary.token_id(&scratch.encoded) {
                    out.push(id);
                    continue;
                }
            }
            self.merge_word(scratch, out);
        }
        scratch.codepoints = codepoints;
    }

    fn merge_word(&self, scratch: &mut BpeScratch, out: &mut Vec<u32>) {
        let word = &scratch.word;
        let symbols = &mut scratch.symbols;
        symbols.clear();
        let count = word.len() as u32;
        for (index, &byte) in word.iter().enumerate() {
            let index = index as u32;
            symbols.push(Symbol {
                id: self.byte_tokens[byte as usize],
                previous: if index == 0 { NO_SYMBOL } else { index - 1 },
                next: if index + 1 == count {
                    NO_SYMBOL
                } else {
                    index + 1
                },
                alive: true,
            });
        }
        let queue = &mut scratch.queue;
        queue.clear();
        // Queue entries: (rank, left index, left id, right id), smallest first.
        let push_pair = |queue: &mut BinaryHeap<Reverse<(u32, u32, u32, u32)>>,
                         symbols: &[Symbol],
                         left: u32| {
            let right = symbols[left as usize].next;
            if right == NO_SYMBOL {
                return;
            }
            if let (Some(left_id), Some(right_id)) =
                (symbols[left as usize].id, symbols[right as usize].id)
            {
                if let Some(merge) = self.merges.get(&pair_key(left_id, right_id)) {
                    queue.push(Reverse((merge.rank, left, left_id, right_id)));
                }
            }
        };
        for left in 0..count.saturating_sub(1) {
            push_pair(queue, symbols, left);
        }
        while let Some(Reverse((_, left, left_id, right_id))) = queue.pop() {
            let left_symbol = symbols[left as usize];
            let right = left_symbol.next;
            if !left_symbol.alive || right == NO_SYMBOL || left_symbol.id != Some(left_id) {
                continue;
            }
            let right_symbol = symbols[right as usize];
            if right_symbol.id != Some(right_id) {
                continue;
            }
            let merged = self.merges[&pair_key(left_id, right_id)].merged;
            symbols[left as usize].id = Some(merged);
            symbols[left as usize].next = right_symbol.next;
            symbols[right as usize].alive = false;
            if right_symbol.next != NO_SYMBOL {
                symbols[right_symbol.next as usize].previous = left;
            }
            if left_symbol.previous != NO_SYMBOL {
                push_pair(queue, symbols, left_symbol.previous);
            }
            push_pair(queue, symbols, left);
        }
        let mut index = 0;
        while index != NO_SYMBOL && !symbols.is_empty() {
            let symbol = symbols[index as usize];
            if let Some(id) = symbol.id {
                out.push(id);
            }
            index = symbol.next;
        }
    }
}
