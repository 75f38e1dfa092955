//! Paged KV cache bookkeeping: a pool of fixed-size blocks of cache cells and, per sequence,
//! the table of blocks its positions map to.

/// Hands out cache blocks; every block is either free or owned by one sequence.
#[derive(Debug, Clone)]
pub struct BlockAllocator {
    block_size: usize,
    free: Vec<u32>,
    total: usize,
}

impl BlockAllocator {
    /// A pool of `n_blocks` blocks of `block_size` cells.
    pub fn new(n_blocks: usize, block_size: usize) -> BlockAllocator {
        BlockAllocator {
            block_size,
            free: (0..n_blocks as u32).rev().collect(),
            total: n_blocks,
        }
    }

    /// Cells per block.
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// Blocks no sequence owns.
    pub fn free_blocks(&self) -> usize {
        self.free.len()
    }

    /// Blocks in the pool.
    pub fn total_blocks(&self) -> usize {
        self.total
    }

    /// Grows `table` until it covers `positions` positions; false (and no change) when the
    /// pool has too few free blocks.
    pub fn reserve(&mut self, table: &mut Vec<u32>, positions: usize) -> bool {
        let needed = positions.div_ceil(self.block_size);
        if needed <= table.len() {
            return true;
        }
        let extra = needed - table.len();
        if extra > self.free.len() {
            return false;
        }
        for _ in 0..extra {
            table.push(
                self.free
                    .pop()
                    .expect("checked that enough blocks are free"),
            );
        }
        true
    }

    /// Returns every block of `table` to the pool and empties it.
    pub fn release(&mut self, table: &mut Vec<u32>) {
        self.free.extend(table.drain(..).rev());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reserve_and_release_balance() {
        let mut pool = BlockAllocator::new(4, 16);
        let mut a = Vec::new();
        let mut b = Vec::new();
        assert!(pool.reserve(&mut a, 17));
        assert_eq!(a.len(), 2);
        assert!(pool.reserve(&mut b, 32));
        assert!(!pool.reserve(&mut a, 33), "only 0 blocks left");
        assert_eq!(a.len(), 2);
        pool.release(&mut a);
        assert_eq!(pool.free_blocks(), 2);
        pool.release(&mut b);
        assert_eq!(pool.free_blocks(), 4);
    }
}
