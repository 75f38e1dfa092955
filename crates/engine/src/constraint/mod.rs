//! Constrained decoding: a [`Grammar`] (a JSON schema, any JSON value, a GBNF or Lark
//! grammar) compiled by the `llguidance` crate against the model's vocabulary into a
//! [`Constraint`], which masks the logits of every step to the tokens the grammar admits and
//! follows each token sampled.
//!
//! ```no_run
//! # fn demo(tokenizer: std::sync::Arc<runit_tokenizer::Tokenizer>) -> Result<(), runit_engine::constraint::ConstraintError> {
//! use runit_engine::constraint::{Grammar, GrammarCompiler};
//! let compiler = GrammarCompiler::new(tokenizer.clone(), &tokenizer.eog_ids())?;
//! let schema = serde_json::json!({"type": "object", "properties": {"a": {"type": "integer"}}});
//! let mut constraint = compiler.compile(&Grammar::JsonSchema(schema))?;
//! let mut logits = vec![0.0; tokenizer.n_vocab()];
//! constraint.mask(&mut logits)?; // disallowed tokens are now -inf
//! # Ok(()) }
//! ```

mod gbnf;

use std::sync::Arc;
use std::time::{Duration, Instant};

use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{SimpleVob, TokEnv, TokRxInfo, TokTrie, TokenizerEnv};
use llguidance::{Matcher, ParserFactory};
use runit_tokenizer::Tokenizer;
use serde_json::{json, Value};

pub use gbnf::gbnf_to_lark;

/// What generated text must match.
#[derive(Debug, Clone, PartialEq)]
pub enum Grammar {
    /// A JSON value valid under this JSON schema.
    JsonSchema(Value),
    /// Any JSON object (OpenAI's `json_object` response format).
    JsonObject,
    /// A GBNF grammar (llama.cpp's format; the rule `root` starts it).
    Gbnf(String),
    /// A grammar in llguidance's Lark dialect (the rule `start` starts it).
    Lark(String),
}

/// Why a grammar could not be compiled or followed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConstraintError {
    /// The vocabulary cannot back a grammar (no end-of-generation token, for one).
    #[error("the vocabulary cannot be used for constrained decoding: {0}")]
    Vocabulary(String),
    /// The grammar or schema does not compile; the message says where.
    #[error("the {kind} does not compile: {message}")]
    Compile { kind: &'static str, message: String },
    /// At this step the grammar admits no token of the vocabulary.
    #[error("the grammar admits no token after {generated} generated tokens{reason}")]
    NoTokenAllowed { generated: usize, reason: String },
    /// The grammar refused a token that the sampler picked.
    #[error("the grammar refused token {token}: {message}")]
    Refused { token: u32, message: String },
}

/// The model's vocabulary as llguidance sees it: token bytes in a trie (special tokens
/// marked with the 0xFF byte, as llguidance expects), and the tokenizer to encode text the
/// grammar forces.
struct VocabularyEnv {
    trie: TokTrie,
    tokenizer: Arc<Tokenizer>,
}

impl TokenizerEnv for VocabularyEnv {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, bytes: &[u8]) -> Vec<u32> {
        self.tokenizer.encode_bytes(bytes, false, false)
    }
}

/// Compiles grammars for one vocabulary; build it once per model and share it.
#[derive(Clone)]
pub struct GrammarCompiler {
    factory: Arc<ParserFactory>,
}

impl GrammarCompiler {
    /// A compiler for `tokenizer`'s vocabulary; `end_tokens` are the tokens that end
    /// generation, which the grammar admits once it is complete (at least one).
    pub fn new(
        tokenizer: Arc<Tokenizer>,
        end_tokens: &[u32],
    ) -> Result<GrammarCompiler, ConstraintError> {
        let vocab_size = tokenizer.n_vocab();
        let Some(&first_end) = end_tokens.first() else {
            return Err(ConstraintError::Vocabulary(
                "it has no end-of-generation token".into(),
            ));
        };
        if let Some(&outside) = end_tokens.iter().find(|&&id| id as usize >= vocab_size) {
            return Err(ConstraintError::Vocabulary(format!(
                "end-of-generation token {outside} is outside the vocabulary of {vocab_size}"
            )));
        }
        let words: Vec<Vec<u8>> = (0..vocab_size as u32)
            .map(|id| {
                let piece = tokenizer.token_piece(id).unwrap_or_default();
                if tokenizer.is_control(id) {
                    let mut marked = vec![TokTrie::SPECIAL_TOKEN_MARKER];
                    marked.extend_from_slice(piece);
                    marked
                } else {
                    piece.to_vec()
                }
            })
            .collect();
        let info = TokRxInfo::new(vocab_size as u32, first_end);
        let trie = TokTrie::from(&info, &words).with_eos_tokens(end_tokens);
        let env: TokEnv = Arc::new(VocabularyEnv { trie, tokenizer });
        let mut factory = ParserFactory::new_simple(&env)
            .map_err(|error| ConstraintError::Vocabulary(error.to_string()))?;
        factory.quiet();
        Ok(GrammarCompiler {
            factory: Arc::new(factory),
        })
    }

    /// Compiles `grammar` into a fresh [`Constraint`].
    pub fn compile(&self, grammar: &Grammar) -> Result<Constraint, ConstraintError> {
        let (kind, top_level) = match grammar {
            Grammar::JsonSchema(schema) => ("JSON schema", json_grammar(schema.clone())),
            Grammar::JsonObject => (
                "JSON object grammar",
                json_grammar(json!({"type": "object"})),
            ),
            Grammar::Gbnf(source) => (
                "GBNF grammar",
                TopLevelGrammar::from_lark(gbnf_to_lark(source).map_err(|message| {
                    ConstraintError::Compile {
                        kind: "GBNF grammar",
                        message,
                    }
                })?),
            ),
            Grammar::Lark(source) => ("Lark grammar", TopLevelGrammar::from_lark(source.clone())),
        };
        let parser =
            self.factory
                .create_parser(top_level)
                .map_err(|error| ConstraintError::Compile {
                    kind,
                    message: error.to_string(),
                })?;
        let matcher = Matcher::new(Ok(parser));
        if let Some(message) = matcher_error(&matcher) {
            return Err(ConstraintError::Compile { kind, message });
        }
        Ok(Constraint {
            matcher,
            grammar: Arc::new(grammar.clone()),
            prepared: None,
            generated: 0,
            mask_time: Duration::ZERO,
            masks: 0,
        })
    }
}

/// A JSON-schema grammar with fixed separators and no free whitespace, so that a model
/// cannot spend its tokens on blank space between values.
fn json_grammar(mut schema: Value) -> TopLevelGrammar {
    if let Value::Object(object) = &mut schema {
        object.entry("x-guidance").or_insert(json!({
            "whitespace_flexible": false,
            "item_separator": ", ",
            "key_separator": ": ",
        }));
    }
    TopLevelGrammar::from_json_schema(schema)
}

fn matcher_error(matcher: &Matcher) -> Option<String> {
    matcher
        .is_error()
        .then(|| matcher.get_error().unwrap_or_default())
}

/// One generation's grammar state: masks logits and follows the sampled tokens. A clone
/// starts from the state it was cloned in.
#[derive(Clone)]
pub struct Constraint {
    matcher: Matcher,
    grammar: Arc<Grammar>,
    /// The mask of the current state computed ahead by [`Constraint::prepare`] (or why none
    /// could be), taken by the next [`Constraint::mask`].
    prepared: Option<Result<SimpleVob, String>>,
    generated: usize,
    mask_time: Duration,
    masks: usize,
}

impl std::fmt::Debug for Constraint {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("Constraint")
            .field("grammar", &self.grammar)
            .field("generated", &self.generated)
            .finish()
    }
}

/// Two constraints are equal when they compile the same grammar and have followed as many
/// tokens (the parser state itself has no equality).
impl PartialEq for Constraint {
    fn eq(&self, other: &Constraint) -> bool {
        self.grammar == other.grammar && self.generated == other.generated
    }
}

impl Constraint {
    /// The grammar this constraint follows.
    pub fn grammar(&self) -> &Grammar {
        &self.grammar
    }

    /// Computes the mask of the current state ahead of [`Constraint::mask`], so that it can
    /// run while the forward pass whose logits it will mask runs (the scheduler does this
    /// on a thread of its own). Does nothing when a mask is already prepared.
    pub fn prepare(&mut self) {
        if self.prepared.is_none() {
            let mask = self.compute();
            self.prepared = Some(mask);
        }
    }

    /// The mask of the current state (timed).
    fn compute(&mut self) -> Result<SimpleVob, String> {
        let started = Instant::now();
        let allowed = self
            .matcher
            .compute_mask_or_eos()
            .map_err(|error| error.to_string());
        self.mask_time += started.elapsed();
        self.masks += 1;
        allowed
    }

    /// Sets the logits of the tokens the grammar does not admit now to -inf (the tokens
    /// beyond the vocabulary too), with the mask [`Constraint::prepare`] computed if it did.
    /// Fails when it admits none.
    pub fn mask(&mut self, logits: &mut [f32]) -> Result<(), ConstraintError> {
        let allowed = match self.prepared.take() {
            Some(prepared) => prepared,
            None => self.compute(),
        }
        .map_err(|error| self.no_token(format!(": {error}")))?;
        let mut any = false;
        for (id, logit) in logits.iter_mut().enumerate() {
            if allowed.is_allowed(id as u32) {
                any |= *logit > f32::NEG_INFINITY;
            } else {
                *logit = f32::NEG_INFINITY;
            }
        }
        if any {
            Ok(())
        } else {
            Err(self.no_token(String::new()))
        }
    }

    /// Follows `token`, sampled from masked logits. Once the grammar is complete its mask
    /// admits only the end of generation, which needs no following.
    pub fn accept(&mut self, token: u32) -> Result<(), ConstraintError> {
        // A prepared mask belongs to the state before this token.
        self.prepared = None;
        if self.matcher.is_stopped() && !self.matcher.is_error() {
            self.generated += 1;
            return Ok(());
        }
        self.matcher
            .consume_token(token)
            .map_err(|error| ConstraintError::Refused {
                token,
                message: error.to_string(),
            })?;
        self.generated += 1;
        Ok(())
    }

    /// True once the grammar is complete and admits only the end of generation.
    pub fn is_finished(&self) -> bool {
        self.matcher.is_stopped()
    }

    /// The mean time of one mask computation so far (zero before the first).
    pub fn mean_mask_time(&self) -> Duration {
        match u32::try_from(self.masks) {
            Ok(masks) if masks > 0 => self.mask_time / masks,
            _ => Duration::ZERO,
        }
    }

    fn no_token(&self, reason: String) -> ConstraintError {
        ConstraintError::NoTokenAllowed {
            generated: self.generated,
            reason,
        }
    }
}
