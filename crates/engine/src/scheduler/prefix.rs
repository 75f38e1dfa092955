//! Prefix caching without changing a number: which cached blocks a prompt may reuse, and
//! under which class its own full blocks are cached.
//!
//! A prompt evaluated alone is cut into chunks of the chunk size, and the CPU attends a span
//! of [`TILED_ATTENTION_ROWS`] query rows or more on ggml's tiled path, a shorter one on its
//! one-chunk path; the two round differently, while within a path each query row's numbers
//! do not depend on the other rows of its span. So a position's KV depends on the tokens up
//! to it and on the path of every chunk up to it, and only that path can differ between two
//! prompts that begin alike: every chunk but a prompt's last is full. A block's class
//! records the paths of its positions' chunks, and a block is reused only under its class.
//!
//! A prompt that reuses a prefix evaluates its first span from the end of the prefix to the
//! end of the chunk it falls in (and whole chunks after, as alone); that span must take the
//! path its whole chunk takes alone, so a prefix is shortened, block by block, until it
//! does. The last prompt token is always evaluated, so that its logits exist.

use crate::kv_blocks::BlockAllocator;
use crate::prefix_cache::BlockKey;

/// Query rows of a span from which the CPU attention takes ggml's tiled path.
pub const TILED_ATTENTION_ROWS: usize = 64;

/// True when the chunk holding `position`, of a prompt of `prompt_len` tokens cut in chunks
/// of `chunk_size`, is a span of the tiled path.
fn chunk_is_tiled(position: usize, prompt_len: usize, chunk_size: usize) -> bool {
    let start = position / chunk_size * chunk_size;
    let end = (start + chunk_size).min(prompt_len);
    end - start >= TILED_ATTENTION_ROWS
}

/// The class of full block `index` of a prompt of `prompt_len` tokens: bit 0 set when its
/// first position's chunk is tiled, bit 1 when its last position's is (a block spans chunks
/// only where all but the last are full, so these two say the path of every position).
pub(super) fn block_class(
    index: usize,
    block_size: usize,
    prompt_len: usize,
    chunk_size: usize,
) -> u8 {
    let first = index * block_size;
    let last = first + block_size - 1;
    u8::from(chunk_is_tiled(first, prompt_len, chunk_size))
        | (u8::from(chunk_is_tiled(last, prompt_len, chunk_size)) << 1)
}

/// Full blocks of a prompt of `prompt_len` tokens that may be looked up: all that leave at
/// least its last token to evaluate.
pub(super) fn lookup_limit(prompt_len: usize, block_size: usize) -> usize {
    prompt_len.saturating_sub(1) / block_size
}

/// How many of `matched` leading cached blocks a prompt of `prompt_len` tokens reuses: the
/// most for which the first span evaluated after them takes the attention path that its
/// whole chunk takes when the prompt is evaluated alone.
pub(super) fn reusable_blocks(
    matched: usize,
    block_size: usize,
    prompt_len: usize,
    chunk_size: usize,
) -> usize {
    let mut blocks = matched.min(lookup_limit(prompt_len, block_size));
    while blocks > 0 {
        let start = blocks * block_size;
        let chunk_start = start / chunk_size * chunk_size;
        let end = (chunk_start + chunk_size).min(prompt_len);
        let alone = end - chunk_start >= TILED_ATTENTION_ROWS;
        let reusing = end - start >= TILED_ATTENTION_ROWS;
        if alone == reusing {
            break;
        }
        blocks -= 1;
    }
    blocks
}

/// The cached blocks `prompt` reuses, in order: the longest run of cached blocks holding its
/// beginning under its own classes, shortened by [`reusable_blocks`]. Empty when the cache
/// is off.
pub(super) fn cached_prefix(
    blocks: &BlockAllocator,
    prompt: &[u32],
    chunk_size: usize,
) -> Vec<u32> {
    let mut found = Vec::new();
    if !blocks.caches_prefixes() {
        return found;
    }
    let block_size = blocks.block_size();
    for (index, tokens) in prompt
        .chunks_exact(block_size)
        .take(lookup_limit(prompt.len(), block_size))
        .enumerate()
    {
        let key = BlockKey {
            parent: found.last().copied(),
            tokens: tokens.into(),
            class: block_class(index, block_size, prompt.len(), chunk_size),
        };
        match blocks.find(&key) {
            Some(block) => found.push(block),
            None => break,
        }
    }
    found.truncate(reusable_blocks(
        found.len(),
        block_size,
        prompt.len(),
        chunk_size,
    ));
    found
}

/// Caches the blocks of `table` that the evaluated prompt tokens `evaluated` (the first of a
/// prompt of `prompt_len`) fill and that are not cached yet; `indexed` counts the table's
/// leading cached blocks and becomes `None` when one cannot be cached (the cache is off, or
/// another sequence cached the same content first).
pub(super) fn register_prompt_blocks(
    blocks: &mut BlockAllocator,
    table: &[u32],
    evaluated: &[u32],
    prompt_len: usize,
    chunk_size: usize,
    indexed: &mut Option<usize>,
) {
    let Some(mut next) = *indexed else { return };
    let block_size = blocks.block_size();
    while let Some(tokens) = evaluated.get(next * block_size..(next + 1) * block_size) {
        let class = block_class(next, block_size, prompt_len, chunk_size);
        if !blocks.register(table, next, tokens, class) {
            *indexed = None;
            return;
        }
        next += 1;
    }
    *indexed = Some(next);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_follow_the_prompts_last_chunk() {
        // Chunks of 512: block 128 (positions 2048..2064) opens the last chunk.
        assert_eq!(block_class(128, 16, 2100, 512), 0, "a 52-row chunk");
        assert_eq!(block_class(128, 16, 2200, 512), 3, "a 152-row chunk");
        assert_eq!(block_class(127, 16, 2100, 512), 3, "a full chunk");
        // Chunks of 40 and blocks of 16: block 2 (32..48) spans two chunks.
        assert_eq!(
            block_class(2, 16, 70, 40),
            0,
            "chunks of 40 and 30: both one-chunk"
        );
        assert_eq!(block_class(2, 16, 70, 100), 3);
    }

    #[test]
    fn the_last_token_is_always_evaluated() {
        assert_eq!(lookup_limit(32, 16), 1);
        assert_eq!(lookup_limit(33, 16), 2);
        assert_eq!(lookup_limit(1, 16), 0);
        assert_eq!(reusable_blocks(10, 16, 32, 8), 1);
    }

    #[test]
    fn the_first_span_keeps_its_chunks_path() {
        // 2100 tokens in chunks of 512: the chunk 1536..2048 is tiled; reusing 125 blocks
        // (2000 positions) would leave a 48-row span of it, so reuse stops at 1984 (a
        // 64-row span).
        assert_eq!(reusable_blocks(125, 16, 2100, 512), 124);
        // Reuse ending on the chunk boundary keeps the 52-row last chunk as alone.
        assert_eq!(reusable_blocks(128, 16, 2100, 512), 128);
        // A last chunk of 70 rows (2048..2118): reuse may leave 64 of them or all.
        assert_eq!(reusable_blocks(131, 16, 2118, 512), 128);
        // A one-chunk last chunk can be cut anywhere.
        assert_eq!(reusable_blocks(3, 16, 60, 512), 3);
        // Chunks shorter than a tiled span: any cut.
        assert_eq!(reusable_blocks(7, 16, 200, 32), 7);
    }
}
