//! Incremental detokenization: ids arrive one at a time, text leaves in chunks that are always
//! valid UTF-8. Bytes of a character split across tokens (byte-level BPE pieces, `<0xXX>`
//! byte-fallback tokens) are held back until the character is complete.

use crate::error::TokenizerError;
use crate::tokenizer::Tokenizer;

/// Options of a [`StreamDecoder`].
#[derive(Clone, Copy, Debug, Default)]
pub struct StreamOptions {
    /// Render control tokens (`<|im_end|>` ...) as their text instead of skipping them.
    pub show_special: bool,
    /// For SentencePiece vocabularies with `add_space_prefix`, drop the leading space of the
    /// first text piece (use when the stream starts at the beginning of the text, not when it
    /// continues a prompt).
    pub strip_leading_space: bool,
}

/// Turns a stream of token ids into UTF-8 text chunks.
#[derive(Debug)]
pub struct StreamDecoder<'a> {
    tokenizer: &'a Tokenizer,
    options: StreamOptions,
    pending: Vec<u8>,
    at_start: bool,
}

impl<'a> StreamDecoder<'a> {
    /// A decoder at the start of a stream.
    pub fn new(tokenizer: &'a Tokenizer, options: StreamOptions) -> StreamDecoder<'a> {
        StreamDecoder {
            tokenizer,
            options,
            pending: Vec::new(),
            at_start: true,
        }
    }

    /// Adds one token; returns the text that became complete (often empty).
    pub fn push(&mut self, id: u32) -> Result<String, TokenizerError> {
        let piece = self.tokenizer.token_piece(id)?;
        if !self.options.show_special && self.tokenizer.is_control(id) {
            return Ok(String::new());
        }
        let piece = if self.at_start
            && self.options.strip_leading_space
            && self.tokenizer.adds_space_prefix()
        {
            piece.strip_prefix(b" ").unwrap_or(piece)
        } else {
            piece
        };
        if !piece.is_empty() {
            self.at_start = false;
        }
        self.pending.extend_from_slice(piece);
        Ok(self.take_complete())
    }

    /// Ends the stream: bytes still held back (an unfinished character) come out as U+FFFD.
    pub fn finish(&mut self) -> String {
        let rest = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        rest
    }

    /// Number of bytes held back, waiting for the rest of a character.
    pub fn pending_len(&self) -> usize {
        self.pending.len()
    }

    fn take_complete(&mut self) -> String {
        let mut out = String::new();
        let mut consumed = 0;
        loop {
            match std::str::from_utf8(&self.pending[consumed..]) {
                Ok(text) => {
                    out.push_str(text);
                    consumed = self.pending.len();
                    break;
                }
                Err(error) => {
                    let valid = error.valid_up_to();
                    let text = std::str::from_utf8(&self.pending[consumed..consumed + valid])
                        .expect("valid_up_to marks a valid prefix");
                    out.push_str(text);
                    consumed += valid;
                    match error.error_len() {
                        // Invalid bytes can never become a character: replace them now.
                        Some(length) => {
                            out.push(char::REPLACEMENT_CHARACTER);
                            consumed += length;
                        }
                        // An unfinished character at the end: hold it back.
                        None => break,
                    }
                }
            }
        }
        self.pending.drain(..consumed);
        out
    }
}
