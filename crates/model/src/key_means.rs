//! The mean key of each layer, measured once at load for TurboQuant key caches
//! (`Device::center_keys`): a cache that stores `k - mean` instead of `k` moves every score
//! of a query by the same `q . mean`, which the softmax ignores, while the codes see a much
//! smaller vector. SmolLM2's keys (after RoPE) put 40 to 65% of their energy in their mean,
//! in a few channels of slow rotation; a rotated block spreads that energy's quantization
//! error over every coordinate.
//!
//! The means come from one pass of the model over a fixed sequence (the BOS token, then
//! tokens of the vocabulary picked by a seeded hash): deterministic, and independent of the
//! prompts, the batch and the prefix cache. The BOS position is left out (an attention
//! sink's key is unlike the others).

use runit_backend::{KvTypes, SequenceSpan};

use crate::observer::LayerObserver;
use crate::workspace::{KvState, Scratch};
use crate::{Batch, Model, ModelError};

/// Positions of the calibration pass.
const CALIBRATION_TOKENS: usize = 256;

/// Normal tokens (`tokenizer.ggml.token_type` 1, or any when the file does not say).
const NORMAL_TOKEN: i32 = 1;

/// Sums of `Krope` rows by layer, past the first position.
struct KeySums {
    sums: Vec<Vec<f64>>,
}

impl LayerObserver for KeySums {
    fn observe(&mut self, name: &str, rows: usize, width: usize, data: &[f32]) {
        let Some(layer) = name
            .strip_prefix("Krope-")
            .and_then(|layer| layer.parse::<usize>().ok())
        else {
            return;
        };
        let Some(sums) = self.sums.get_mut(layer) else {
            return;
        };
        for row in data.chunks_exact(width).take(rows).skip(1) {
            for (sum, &value) in sums.iter_mut().zip(row) {
                *sum += f64::from(value);
            }
        }
    }
}

/// The calibration sequence: BOS (when the file names one), then tokens picked from the
/// normal ones by SplitMix64 of their position.
fn calibration_tokens(model: &Model, count: usize) -> Vec<u32> {
    let file = &model.file;
    let vocab = model.config.vocab_size;
    let types = file
        .get_i32_array_opt("tokenizer.ggml.token_type")
        .ok()
        .flatten()
        .filter(|types| types.len() == vocab);
    let normal: Vec<u32> = (0..vocab as u32)
        .filter(|&id| types.is_none_or(|types| types[id as usize] == NORMAL_TOKEN))
        .collect();
    let bos = file
        .get_u32_opt("tokenizer.ggml.bos_token_id")
        .ok()
        .flatten()
        .filter(|&id| (id as usize) < vocab);
    let mut tokens: Vec<u32> = bos.into_iter().collect();
    let mut state = 0x6b65_795f_6d65_616eu64;
    while tokens.len() < count && !normal.is_empty() {
        state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        tokens.push(normal[(z % normal.len() as u64) as usize]);
    }
    tokens
}

/// The mean key (after RoPE, `[kv_heads * head_dim]`) of each layer over the calibration
/// pass, computed with an f16 cache.
pub fn key_means(model: &Model) -> Result<Vec<Vec<f32>>, ModelError> {
    let tokens = calibration_tokens(model, CALIBRATION_TOKENS);
    let n = tokens.len();
    let width = model.config.kv_width();
    if n < 2 {
        return Ok(vec![vec![0.0; width]; model.config.block_count]);
    }
    const BLOCK_SIZE: usize = 16;
    let mut kv = KvState::new(model, n.next_multiple_of(BLOCK_SIZE), KvTypes::default())?;
    let mut scratch = Scratch::new(model, n)?;
    let positions: Vec<u32> = (0..n as u32).collect();
    let spans = [SequenceSpan {
        first_row: 0,
        rows: n,
        start_position: 0,
        block_table: (0..n.div_ceil(BLOCK_SIZE) as u32).collect(),
        block_size: BLOCK_SIZE,
    }];
    let batch = Batch {
        tokens: &tokens,
        positions: &positions,
        spans: &spans,
        window_spans: None,
        logit_rows: &[n as u32 - 1],
        rows_alone: false,
    };
    let mut sums = KeySums {
        sums: vec![vec![0.0; width]; model.config.block_count],
    };
    model.forward(
        &batch,
        &mut kv,
        &mut scratch,
        &mut Vec::new(),
        Some(&mut sums),
    )?;
    let rows = (n - 1) as f64;
    Ok(sums
        .sums
        .iter()
        .map(|sums| sums.iter().map(|sum| (sum / rows) as f32).collect())
        .collect())
}
