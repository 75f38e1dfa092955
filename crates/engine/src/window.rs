//! The windowed layers' KV rings: a layer that attends over the last `window` positions
//! keeps only the cells those can reach. Each sequence owns a ring of blocks from a pool of
//! their own; its position `p` lives in ring block `(p / block_size) % ring.len()`, so the
//! ring's blocks are reused as the sequence advances, and the windowed layers get block
//! tables that wrap around the ring ([`WindowRings::span`]). A ring holds `window + batch -
//! 1` positions (a pass's first query still sees `window - 1` positions back when its last
//! row is written), in whole blocks plus one (a run of positions may straddle a block).

use runit_backend::SequenceSpan;

use crate::kv_blocks::BlockAllocator;

/// The pool of ring blocks and the size of each sequence's ring.
#[derive(Debug, Clone)]
pub(crate) struct WindowRings {
    blocks: BlockAllocator,
    ring_blocks: usize,
}

impl WindowRings {
    /// Rings for `sequences` sequences whose windowed layers see `window` positions, in
    /// passes of up to `batch` rows, in blocks of `block_size` cells; `None` when a ring
    /// would not be smaller than the `context` cells a sequence may use anyway.
    pub fn new(
        window: usize,
        batch: usize,
        block_size: usize,
        sequences: usize,
        context: usize,
    ) -> Option<WindowRings> {
        let ring_blocks = (window + batch.max(1) - 1).div_ceil(block_size) + 1;
        (ring_blocks * block_size < context).then(|| WindowRings {
            blocks: BlockAllocator::new(ring_blocks * sequences, block_size),
            ring_blocks,
        })
    }

    /// Cells of every ring together: the windowed layers' cache size.
    pub fn cells(&self) -> usize {
        self.blocks.total_blocks() * self.blocks.block_size()
    }

    /// Cells of one sequence's ring.
    pub fn ring_cells(&self) -> usize {
        self.ring_blocks * self.blocks.block_size()
    }

    /// Gives `ring` its blocks when it has none; false when every ring is taken.
    pub fn take(&mut self, ring: &mut Vec<u32>) -> bool {
        ring.len() == self.ring_blocks
            || self
                .blocks
                .reserve(ring, self.ring_blocks * self.blocks.block_size())
    }

    /// Returns `ring`'s blocks to the pool.
    pub fn release(&mut self, ring: &mut Vec<u32>) {
        self.blocks.release(ring);
    }

    /// `span` for the windowed layers: its block table's logical blocks wrapped around
    /// `ring` (which [`WindowRings::take`] filled).
    pub fn span(ring: &[u32], span: &SequenceSpan) -> SequenceSpan {
        SequenceSpan {
            block_table: (0..span.block_table.len())
                .map(|block| ring[block % ring.len()])
                .collect(),
            ..span.clone()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rings_cover_a_window_and_a_batch_and_wrap() {
        let mut rings = WindowRings::new(32, 8, 16, 2, 4096).expect("smaller than the context");
        // 39 positions in 16-cell blocks, plus one block for a straddling run.
        assert_eq!(rings.ring_cells(), 64);
        assert_eq!(rings.cells(), 128);
        let (mut a, mut b, mut c) = (Vec::new(), Vec::new(), Vec::new());
        assert!(rings.take(&mut a) && rings.take(&mut b));
        assert!(rings.take(&mut a), "a ring is taken once");
        assert!(!rings.take(&mut c), "two sequences' rings");
        let span = SequenceSpan {
            first_row: 0,
            rows: 1,
            start_position: 100,
            block_table: vec![9, 8, 7, 6, 5, 4, 3],
            block_size: 16,
        };
        let wrapped = WindowRings::span(&a, &span);
        assert_eq!(wrapped.block_table.len(), 7);
        // Positions 69..=100 (the window of position 100) land in distinct cells.
        let mut cells: Vec<usize> = (69..=100).map(|p| wrapped.cell(p)).collect();
        cells.sort_unstable();
        cells.dedup();
        assert_eq!(cells.len(), 32);
        assert!(cells.iter().all(|&cell| cell < rings.cells()));
        rings.release(&mut a);
        assert!(rings.take(&mut c));
    }

    #[test]
    fn no_rings_when_the_context_is_no_larger() {
        assert!(WindowRings::new(512, 512, 16, 1, 1024).is_none());
        assert!(WindowRings::new(512, 512, 16, 1, 4096).is_some());
    }
}
