//! A draft model (`-md FILE`): a smaller model of the same vocabulary, in a session of its
//! own, drafts greedily. Its cache follows the target's sequence: each draft first rolls
//! back what the target rejected and evaluates what was accepted since. The prompt is
//! evaluated by `prepare`, in the prompt's time; when the drafter has fallen further
//! behind than [`CATCH_UP_LIMIT`] tokens (many plain steps, when drafting did not pay), it
//! starts afresh from the last that many, so that a probe costs little. A sequence longer
//! than the draft session's context is drafted from its most recent tokens only.
//!
//! [`DraftModelPool`] gives the scheduler's sequences their own draft sessions.

/// Most tokens a drafting call evaluates to catch up with the sequence.
pub const CATCH_UP_LIMIT: usize = 16;

use std::sync::{Arc, Mutex};

use runit_model::Model;
use runit_tokenizer::Tokenizer;

use super::Drafter;
use crate::{EngineConfig, EngineError, Session};

/// How a draft model's vocabulary differs from the target's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VocabularyMismatch {
    #[error("the draft model has {draft} tokens, the target {target}: a draft model must share the target's vocabulary")]
    Size { draft: usize, target: usize },
    #[error("token {id} is {draft:?} in the draft model and {target:?} in the target: a draft model must share the target's vocabulary")]
    Token {
        id: u32,
        draft: String,
        target: String,
    },
}

/// Checks, token by token, that `draft` has `target`'s vocabulary (each id's text and
/// whether it is a control token), as speculative decoding needs: a drafted id is
/// verified as the target's token of that id.
pub fn check_vocabularies(target: &Tokenizer, draft: &Tokenizer) -> Result<(), VocabularyMismatch> {
    let (target_size, draft_size) = (target.n_vocab(), draft.n_vocab());
    if target_size != draft_size {
        return Err(VocabularyMismatch::Size {
            draft: draft_size,
            target: target_size,
        });
    }
    for id in 0..target_size as u32 {
        let (t, d) = (
            target.token_piece(id).unwrap_or_default(),
            draft.token_piece(id).unwrap_or_default(),
        );
        if t != d || target.is_control(id) != draft.is_control(id) {
            let text = |piece: &[u8]| String::from_utf8_lossy(piece).into_owned();
            return Err(VocabularyMismatch::Token {
                id,
                draft: text(d),
                target: text(t),
            });
        }
    }
    Ok(())
}

/// The draft-model drafter.
pub struct DraftModel {
    session: Session,
    /// The tokens whose cells the draft session holds, in order: `history[offset..]`.
    cached: Vec<u32>,
    offset: usize,
    p_min: f32,
}

impl DraftModel {
    /// A drafter running `model` (whose vocabulary the caller checked with
    /// [`check_vocabularies`]) in a session of `config`, stopping a draft at a token it
    /// gives less than probability `p_min`, for a target whose logits cover `target_vocab`
    /// tokens (the draft's must cover as many).
    pub fn new(
        model: Arc<Model>,
        config: &EngineConfig,
        p_min: f32,
        target_vocab: usize,
    ) -> Result<DraftModel, EngineError> {
        let draft_vocab = model.config.vocab_size;
        if draft_vocab != target_vocab {
            return Err(EngineError::InvalidParameter {
                name: "model_draft",
                message: VocabularyMismatch::Size {
                    draft: draft_vocab,
                    target: target_vocab,
                }
                .to_string(),
            });
        }
        Ok(DraftModel {
            session: Session::new(model, config)?,
            cached: Vec::new(),
            offset: 0,
            p_min,
        })
    }
}

impl Drafter for DraftModel {
    fn prepare(&mut self, history: &[u32]) -> Result<(), EngineError> {
        self.session.reset();
        self.cached.clear();
        if let Some((_, head)) = history.split_last() {
            // At most half the draft context, so that drafting has room to continue.
            self.offset = head.len().saturating_sub(self.session.context_size() / 2);
            let head = &head[self.offset..];
            if !head.is_empty() {
                self.session.eval(head, false, None)?;
                self.cached.extend_from_slice(head);
            }
        } else {
            self.offset = 0;
        }
        Ok(())
    }

    fn draft(&mut self, history: &[u32], max: usize) -> Result<Vec<u32>, EngineError> {
        if history.is_empty() {
            return Ok(Vec::new());
        }
        let seen = history.get(self.offset..).unwrap_or_default();
        let mut common = self
            .cached
            .iter()
            .zip(seen)
            .take_while(|(a, b)| a == b)
            .count()
            // The last history token is evaluated again to get the logits after it.
            .min(seen.len().saturating_sub(1));
        let context = self.session.context_size();
        if seen.is_empty() || seen.len() - common > CATCH_UP_LIMIT || seen.len() + max >= context {
            self.offset = history.len().saturating_sub(CATCH_UP_LIMIT);
            common = 0;
        }
        let seen = &history[self.offset..];
        self.session.truncate(common)?;
        self.cached.truncate(common);
        let room = context.saturating_sub(seen.len());
        let mut pick = self.session.eval_greedy(&seen[common..])?;
        self.cached.extend_from_slice(&seen[common..]);
        let length = max.min(room);
        let mut draft = Vec::new();
        while draft.len() < length && pick.logprob.exp() >= self.p_min {
            let token = pick.id;
            draft.push(token);
            if draft.len() < length {
                pick = self.session.eval_greedy(&[token])?;
                self.cached.push(token);
            }
        }
        Ok(draft)
    }
}

/// Draft-model drafters for the scheduler's sequences: each sequence that speculates takes
/// one (a draft session of its own, its cache following that sequence), which returns to the
/// pool when the sequence ends. Sessions are made when first needed, so the pool holds at
/// most as many as sequences ever speculated at once.
#[derive(Clone)]
pub struct DraftModelPool {
    inner: Arc<PoolInner>,
}

struct PoolInner {
    model: Arc<Model>,
    config: EngineConfig,
    p_min: f32,
    target_vocab: usize,
    idle: Mutex<Vec<DraftModel>>,
}

impl DraftModelPool {
    /// A pool of drafters running `model` in sessions of `config` (see [`DraftModel::new`]);
    /// makes the first session now, so that a model or cache that does not fit is an error
    /// at start.
    pub fn new(
        model: Arc<Model>,
        config: EngineConfig,
        p_min: f32,
        target_vocab: usize,
    ) -> Result<DraftModelPool, EngineError> {
        let first = DraftModel::new(Arc::clone(&model), &config, p_min, target_vocab)?;
        Ok(DraftModelPool {
            inner: Arc::new(PoolInner {
                model,
                config,
                p_min,
                target_vocab,
                idle: Mutex::new(vec![first]),
            }),
        })
    }

    /// An idle drafter, or a new one; it returns to the pool when dropped.
    pub fn take(&self) -> Result<Box<dyn Drafter>, EngineError> {
        let idle = self
            .inner
            .idle
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .pop();
        let drafter = match idle {
            Some(drafter) => drafter,
            None => {
                let inner = &self.inner;
                DraftModel::new(
                    Arc::clone(&inner.model),
                    &inner.config,
                    inner.p_min,
                    inner.target_vocab,
                )?
            }
        };
        Ok(Box::new(PooledDraftModel {
            drafter: Some(drafter),
            pool: Arc::clone(&self.inner),
        }))
    }

    /// The draft sessions idle in the pool now.
    pub fn idle(&self) -> usize {
        self.inner
            .idle
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .len()
    }
}

impl std::fmt::Debug for DraftModelPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DraftModelPool")
            .field("p_min", &self.inner.p_min)
            .field("idle", &self.idle())
            .finish()
    }
}

/// Pools are equal when they are the same pool.
impl PartialEq for DraftModelPool {
    fn eq(&self, other: &DraftModelPool) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }
}

/// A pool's drafter, lent to one sequence.
struct PooledDraftModel {
    drafter: Option<DraftModel>,
    pool: Arc<PoolInner>,
}

impl PooledDraftModel {
    fn drafter(&mut self) -> &mut DraftModel {
        self.drafter.as_mut().expect("held until dropped")
    }
}

impl Drafter for PooledDraftModel {
    fn prepare(&mut self, history: &[u32]) -> Result<(), EngineError> {
        self.drafter().prepare(history)
    }

    fn draft(&mut self, history: &[u32], max: usize) -> Result<Vec<u32>, EngineError> {
        self.drafter().draft(history, max)
    }
}

impl Drop for PooledDraftModel {
    fn drop(&mut self) {
        if let Some(drafter) = self.drafter.take() {
            self.pool
                .idle
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .push(drafter);
        }
    }
}
