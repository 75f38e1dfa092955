//! Which prompt chunks the next prefill pass evaluates. A pass holds at most one chunk
//! budget (the batch size) of prompt tokens, each sequence's chunk cut where the prompt alone
//! would be cut (so outputs do not depend on the company), and is shared between the waiting
//! prompts in this order:
//!
//! 1. the prompt left out of the most passes in a row first (no prompt waits behind others
//!    for long: one left out of a pass goes before every prompt that was not);
//! 2. then the prompt with the fewest tokens left (a short request does not wait behind a
//!    long prompt's chunks: it enters the next pass, and its first token follows);
//! 3. then the oldest.
//!
//! Chunks are taken in that order while they fit next to those already taken, so the first
//! always goes and smaller ones fill what is left of the budget. Between two passes the
//! scheduler admits newcomers and decodes one token of every running sequence, so a long
//! prompt delays them by at most about one chunk's time.

/// A sequence whose prompt is not all in the cache yet, in the order of admission.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct PromptProgress {
    /// Prompt tokens in total.
    pub prompt_len: usize,
    /// Prompt tokens already in the cache: a multiple of the chunk size, or the end of a
    /// prefix found in the prefix cache.
    pub prefilled: usize,
    /// Prefill passes in a row that have left this prompt out.
    pub skipped: usize,
}

/// One chunk of a pass: prompt positions `start..end` of the prompt at `index` of the list
/// given to [`plan_pass`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Chunk {
    pub index: usize,
    pub start: usize,
    pub end: usize,
}

/// The chunks of the next prefill pass over `prompts` (oldest first), at most `chunk_size`
/// tokens together, each the one its prompt alone would evaluate next (chunks end at
/// multiples of `chunk_size`, as [`Session::eval`](crate::Session::eval) cuts them, or at the
/// prompt's end; after a cached prefix the first chunk starts where the prefix ends). Empty
/// when no prompt waits.
pub(super) fn plan_pass(prompts: &[PromptProgress], chunk_size: usize) -> Vec<Chunk> {
    let mut order: Vec<usize> = (0..prompts.len())
        .filter(|&index| prompts[index].prefilled < prompts[index].prompt_len)
        .collect();
    // A stable sort keeps the oldest first among equals.
    order.sort_by_key(|&index| {
        let prompt = &prompts[index];
        (
            std::cmp::Reverse(prompt.skipped),
            prompt.prompt_len - prompt.prefilled,
        )
    });
    let mut chunks = Vec::new();
    let mut total = 0;
    for index in order {
        let prompt = &prompts[index];
        let start = prompt.prefilled;
        let end = ((start / chunk_size + 1) * chunk_size).min(prompt.prompt_len);
        if !chunks.is_empty() && total + (end - start) > chunk_size {
            continue;
        }
        chunks.push(Chunk { index, start, end });
        total += end - start;
    }
    chunks
}

#[cfg(test)]
mod tests {
    use super::*;

    fn waiting(prompt_len: usize, prefilled: usize, skipped: usize) -> PromptProgress {
        PromptProgress {
            prompt_len,
            prefilled,
            skipped,
        }
    }

    #[test]
    fn a_short_prompt_enters_the_pass_before_a_long_prompts_next_chunk() {
        // A 4000-token prompt two chunks in, and a newcomer of 30 tokens.
        let prompts = [waiting(4000, 1024, 0), waiting(30, 0, 0)];
        let pass = plan_pass(&prompts, 512);
        assert_eq!(
            pass,
            [Chunk {
                index: 1,
                start: 0,
                end: 30
            }]
        );
    }

    #[test]
    fn a_prompt_left_out_goes_first_next() {
        let prompts = [waiting(4000, 1536, 1), waiting(30, 0, 0)];
        let pass = plan_pass(&prompts, 512);
        assert_eq!(
            pass,
            [Chunk {
                index: 0,
                start: 1536,
                end: 2048
            }]
        );
        // The one left out longest goes first, whatever its length.
        let prompts = [waiting(20, 0, 1), waiting(4000, 512, 2), waiting(10, 0, 0)];
        assert_eq!(plan_pass(&prompts, 512)[0].index, 1);
    }

    #[test]
    fn short_prompts_share_a_pass_within_the_budget() {
        let prompts = [
            waiting(300, 0, 0),
            waiting(100, 0, 0),
            waiting(200, 0, 0),
            waiting(50, 0, 0),
        ];
        let pass = plan_pass(&prompts, 512);
        // Fewest tokens first: 50, 100, 200 (350 in all); the 300 does not fit.
        let indices: Vec<usize> = pass.iter().map(|chunk| chunk.index).collect();
        assert_eq!(indices, [3, 1, 2]);
        assert!(
            pass.iter()
                .map(|chunk| chunk.end - chunk.start)
                .sum::<usize>()
                <= 512
        );
    }

    #[test]
    fn chunks_are_cut_as_the_prompt_alone_would_be() {
        // 40 tokens in chunks of 16: 0..16, 16..32, 32..40, whatever else waits.
        let mut prompt = waiting(40, 0, 0);
        let mut cuts = Vec::new();
        while prompt.prefilled < prompt.prompt_len {
            let pass = plan_pass(&[waiting(3, 0, 0), prompt], 16);
            let chunk = pass
                .iter()
                .find(|chunk| chunk.index == 1)
                .copied()
                .unwrap_or(Chunk {
                    index: 1,
                    start: prompt.prefilled,
                    end: prompt.prefilled,
                });
            if chunk.end > chunk.start {
                cuts.push(chunk.start..chunk.end);
                prompt.skipped = 0;
            } else {
                prompt.skipped += 1;
            }
            prompt.prefilled = chunk.end;
        }
        assert_eq!(cuts, [0..16, 16..32, 32..40]);
    }

    #[test]
    fn a_prompt_after_a_cached_prefix_is_cut_at_the_chunk_boundaries() {
        let pass = plan_pass(&[waiting(1100, 496, 0)], 512);
        assert_eq!((pass[0].start, pass[0].end), (496, 512));
        let pass = plan_pass(&[waiting(1100, 1008, 0)], 512);
        assert_eq!((pass[0].start, pass[0].end), (1008, 1024));
    }

    #[test]
    fn nothing_waits_nothing_runs() {
        assert!(plan_pass(&[waiting(8, 8, 0)], 16).is_empty());
        assert!(plan_pass(&[], 16).is_empty());
    }
}
