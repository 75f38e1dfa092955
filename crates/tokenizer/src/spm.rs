//! SentencePiece-style BPE (`tokenizer.ggml.model = llama`), as llama.cpp's
//! `llm_tokenizer_spm_session`: spaces become `▁`, every UTF-8 character starts as a symbol,
//! and the adjacent pair whose concatenation is the highest-scoring token is merged first
//! (ties go to the leftmost pair). A symbol that is not a token is emitted as `<0xXX>` byte
//! tokens (or the unknown token when the vocabulary has no byte token).

use std::collections::BinaryHeap;

use crate::unicode;
use crate::vocab::Vocabulary;

/// Reusable buffers for one encoding call.
#[derive(Default)]
pub(crate) struct SpmScratch {
    text: Vec<u8>,
    symbols: Vec<Symbol>,
    queue: BinaryHeap<Bigram>,
}

#[derive(Clone, Copy, Debug)]
struct Symbol {
    start: usize,
    length: usize,
    previous: isize,
    next: isize,
}

#[derive(Clone, Copy, Debug)]
struct Bigram {
    score: f32,
    left: isize,
    right: isize,
    size: usize,
}

impl PartialEq for Bigram {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == std::cmp::Ordering::Equal
    }
}
impl Eq for Bigram {}
impl PartialOrd for Bigram {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Bigram {
    /// Higher score first, then lower left index (a max-heap pops the greatest).
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.score
            .total_cmp(&other.score)
            .then_with(|| other.left.cmp(&self.left))
    }
}

/// The `<0xXX>` token of a byte, else the token whose text is that byte, else the unknown token.
pub(crate) fn byte_token(vocabulary: &Vocabulary, byte: u8) -> Option<u32> {
    vocabulary
        .token_id(&format!("<0x{byte:02X}>"))
        .or_else(|| {
            std::str::from_utf8(&[byte])
                .ok()
                .and_then(|text| vocabulary.token_id(text))
        })
        .or(vocabulary.unknown)
}

/// Encodes one stretch of text (spaces not yet escaped) and appends the ids.
pub(crate) fn encode(
    vocabulary: &Vocabulary,
    text: &[u8],
    add_space_prefix: bool,
    scratch: &mut SpmScratch,
    out: &mut Vec<u32>,
) {
    let escaped = &mut scratch.text;
    escaped.clear();
    if add_space_prefix {
        escaped.extend_from_slice("▁".as_bytes());
    }
    for &byte in text {
        if byte == b' ' {
            escaped.extend_from_slice("▁".as_bytes());
        } else {
            escaped.push(byte);
        }
    }
    let text = &scratch.text[..];
    let symbols = &mut scratch.symbols;
    symbols.clear();
    let mut offset = 0;
    while offset < text.len() {
        let length = unicode::utf8_len(text[offset]).min(text.len() - offset);
        let index = symbols.len() as isize;
        offset += length;
        symbols.push(Symbol {
            start: offset - length,
            length,
            previous: index - 1,
            next: if offset == text.len() { -1 } else { index + 1 },
        });
    }
    let queue = &mut scratch.queue;
    queue.clear();
    let try_add =
        |queue: &mut BinaryHeap<Bigram>, symbols: &[Symbol], left: isize, right: isize| {
            if left < 0 || right < 0 {
                return;
            }
            let (left_symbol, right_symbol) = (symbols[left as usize], symbols[right as usize]);
            let size = left_symbol.length + right_symbol.length;
            let piece = &text[left_symbol.start..left_symbol.start + size];
            let Some(id) = std::str::from_utf8(piece)
                .ok()
                .and_then(|piece| vocabulary.token_id(piece))
            else {
                return;
            };
            queue.push(Bigram {
                score: vocabulary.scores[id as usize],
                left,
                right,
                size,
            });
        };
    for index in 1..symbols.len() as isize {
        try_add(queue, symbols, index - 1, index);
    }
    while let Some(bigram) = queue.pop() {
        let (left, right) = (
            symbols[bigram.left as usize],
            symbols[bigram.right as usize],
        );
        if left.length == 0 || right.length == 0 || left.length + right.length != bigram.size {
            continue;
        }
        symbols[bigram.left as usize].length += right.length;
        symbols[bigram.right as usize].length = 0;
        symbols[bigram.left as usize].next = right.next;
        if right.next >= 0 {
            symbols[right.next as usize].previous = bigram.left;
        }
        try_add(queue, symbols, left.previous, bigram.left);
        try_add(queue, symbols, bigram.left, right.next);
    }
    let mut index: isize = if symbols.is_empty() { -1 } else { 0 };
    while index >= 0 {
        let symbol = symbols[index as usize];
        let piece = &text[symbol.start..symbol.start + symbol.length];
        match std::str::from_utf8(piece)
            .ok()
            .and_then(|piece| vocabulary.token_id(piece))
        {
            Some(id) => out.push(id),
            None => out.extend(
                piece
                    .iter()
                    .filter_map(|&byte| byte_token(vocabulary, byte)),
            ),
        }
        index = symbol.next;
    }
}
