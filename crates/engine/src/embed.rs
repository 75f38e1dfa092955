//! Embeddings: a text's tokens run through the decoder in a fresh session, the final hidden
//! states (after the output norm) pooled as the model declares (mean, first or last token)
//! and scaled to unit length, as llama.cpp's embedding mode normalises them.

use runit_model::Pooling;

use crate::session::LogitRows;
use crate::{EngineError, Session};

/// The L2-normalised embedding of `tokens`, pooled by `pooling`. The session is reset first
/// and left holding the tokens.
pub fn embed(
    session: &mut Session,
    tokens: &[u32],
    pooling: Pooling,
) -> Result<Vec<f32>, EngineError> {
    session.reset();
    let width = session.model().config.embedding_length;
    // Mean and first-token pooling read every row; last-token pooling only the last.
    let rows = match pooling {
        Pooling::Last => LogitRows::Last,
        Pooling::Mean | Pooling::First => LogitRows::Every,
    };
    let mut pooled = vec![0.0f64; width];
    let mut rows_seen = 0usize;
    let mut hidden = Vec::new();
    session.run_chunks(tokens, rows, &mut |model, batch, kv, scratch| {
        model.forward_hidden(batch, kv, scratch, &mut hidden)?;
        for row in hidden.chunks_exact(width) {
            let take = match pooling {
                Pooling::Mean => true,
                Pooling::First => rows_seen == 0,
                Pooling::Last => {
                    pooled.iter_mut().for_each(|value| *value = 0.0);
                    true
                }
            };
            if take {
                for (sum, &value) in pooled.iter_mut().zip(row) {
                    *sum += f64::from(value);
                }
            }
            rows_seen += 1;
        }
        Ok(())
    })?;
    if pooling == Pooling::Mean {
        let count = tokens.len() as f64;
        pooled.iter_mut().for_each(|value| *value /= count);
    }
    let norm = pooled.iter().map(|value| value * value).sum::<f64>().sqrt();
    let scale = if norm > 0.0 { 1.0 / norm } else { 0.0 };
    Ok(pooled.iter().map(|value| (value * scale) as f32).collect())
}
