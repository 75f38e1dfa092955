//! Perplexity computed the way llama.cpp's perplexity tool does, so figures compare: the text
//! is cut into non-overlapping chunks of `n_ctx` tokens, each evaluated from an empty cache
//! (its first token replaced by BOS when the model adds one), and only the second half of each
//! chunk is scored.

use crate::sampler::log_softmax;
use crate::{EngineError, Session};

/// The result after each chunk and at the end.
#[derive(Debug, Clone, PartialEq)]
pub struct PerplexityReport {
    /// Perplexity over chunks `1..=i`, for each chunk `i`.
    pub running: Vec<f64>,
    pub perplexity: f64,
    /// Standard error of the estimate, as llama.cpp prints it.
    pub stderr: f64,
    pub chunks: usize,
    pub scored_tokens: usize,
}

/// Scores `tokens` in chunks of `n_ctx`. `bos` replaces each chunk's first token when given.
/// `on_chunk(i, running_ppl)` is called after each chunk.
pub fn perplexity(
    session: &mut Session,
    tokens: &[u32],
    n_ctx: usize,
    bos: Option<u32>,
    mut on_chunk: impl FnMut(usize, f64),
) -> Result<PerplexityReport, EngineError> {
    if n_ctx < 4 {
        return Err(EngineError::InvalidParameter {
            name: "n_ctx",
            message: format!("must be at least 4, found {n_ctx}"),
        });
    }
    let chunks = tokens.len() / n_ctx;
    if chunks == 0 {
        return Err(EngineError::InvalidParameter {
            name: "text",
            message: format!(
                "{} tokens are fewer than one chunk of {n_ctx}; use a longer text or a smaller -c",
                tokens.len()
            ),
        });
    }
    let vocab = session.model().config.vocab_size;
    let first = n_ctx / 2;
    let (mut nll, mut nll2, mut count) = (0.0f64, 0.0f64, 0usize);
    let mut running = Vec::with_capacity(chunks);
    for chunk in 0..chunks {
        let mut input = tokens[chunk * n_ctx..(chunk + 1) * n_ctx].to_vec();
        if let Some(bos) = bos {
            input[0] = bos;
        }
        session.reset();
        let logits = session.eval(&input, true, None)?;
        for j in first..n_ctx - 1 {
            let row = &logits[j * vocab..(j + 1) * vocab];
            let target = tokens[chunk * n_ctx + j + 1] as usize;
            let value = -log_softmax(row)[target];
            nll += value;
            nll2 += value * value;
            count += 1;
        }
        let ppl = (nll / count as f64).exp();
        running.push(ppl);
        on_chunk(chunk, ppl);
    }
    let mean = nll / count as f64;
    let perplexity = mean.exp();
    let variance = nll2 / count as f64 - mean * mean;
    let stderr = if variance > 0.0 && count > 1 {
        (variance / (count - 1) as f64).sqrt() * perplexity
    } else {
        0.0
    };
    Ok(PerplexityReport {
        running,
        perplexity,
        stderr,
        chunks,
        scored_tokens: count,
    })
}
