//! Paged KV cache bookkeeping: a pool of fixed-size blocks of cache cells and, per sequence,
//! the table of blocks its positions map to. Blocks are reference-counted: with the prefix
//! cache on, sequences whose prompts begin alike share the cached blocks of that beginning
//! ([`PrefixCache`]), and a cached block no sequence uses stays in the pool until a sequence
//! needs room, then is evicted least recently used.

use crate::prefix_cache::{BlockKey, PrefixCache};

/// Hands out cache blocks; a block is free, used by one or more sequences, or cached and
/// idle (evictable).
#[derive(Debug, Clone)]
pub struct BlockAllocator {
    block_size: usize,
    /// Blocks neither used nor cached.
    free: Vec<u32>,
    /// Sequences using each block.
    references: Vec<u32>,
    /// The prefix cache, when on.
    cache: Option<PrefixCache>,
    /// Cached blocks evicted so far.
    evicted: u64,
}

impl BlockAllocator {
    /// A pool of `n_blocks` blocks of `block_size` cells, without a prefix cache.
    pub fn new(n_blocks: usize, block_size: usize) -> BlockAllocator {
        BlockAllocator {
            block_size,
            free: (0..n_blocks as u32).rev().collect(),
            references: vec![0; n_blocks],
            cache: None,
            evicted: 0,
        }
    }

    /// A pool of `n_blocks` blocks of `block_size` cells that caches prompt blocks.
    pub fn with_prefix_cache(n_blocks: usize, block_size: usize) -> BlockAllocator {
        BlockAllocator {
            cache: Some(PrefixCache::default()),
            ..BlockAllocator::new(n_blocks, block_size)
        }
    }

    /// True when prompt blocks are cached.
    pub fn caches_prefixes(&self) -> bool {
        self.cache.is_some()
    }

    /// Cells per block.
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// Blocks a sequence can take: the free ones and the idle cached ones.
    pub fn free_blocks(&self) -> usize {
        self.free.len() + self.cache.as_ref().map_or(0, PrefixCache::idle_len)
    }

    /// Idle cached blocks (counted in [`BlockAllocator::free_blocks`]).
    pub fn idle_cached_blocks(&self) -> usize {
        self.cache.as_ref().map_or(0, PrefixCache::idle_len)
    }

    /// Cached blocks evicted to make room, since the start.
    pub fn evicted_blocks(&self) -> u64 {
        self.evicted
    }

    /// Blocks in the pool.
    pub fn total_blocks(&self) -> usize {
        self.references.len()
    }

    /// Grows `table` until it covers `positions` positions, with blocks of its own (free
    /// ones first, then evicted idle cached ones); false (and no change) when too few can be
    /// taken.
    pub fn reserve(&mut self, table: &mut Vec<u32>, positions: usize) -> bool {
        let needed = positions.div_ceil(self.block_size);
        if needed <= table.len() {
            return true;
        }
        let extra = needed - table.len();
        if extra > self.free_blocks() {
            return false;
        }
        for _ in 0..extra {
            let block = self
                .take()
                .expect("checked that enough blocks can be taken");
            self.references[block as usize] = 1;
            table.push(block);
        }
        true
    }

    /// A free block, evicting idle cached blocks when none is free.
    fn take(&mut self) -> Option<u32> {
        loop {
            if let Some(block) = self.free.pop() {
                return Some(block);
            }
            let freed = self.cache.as_mut()?.evict()?;
            self.evicted += freed.len() as u64;
            self.free.extend(freed);
        }
    }

    /// Drops the sequence's use of every block of `table` and empties it: a block no other
    /// sequence uses goes back to the pool (idle, when cached). Released back to front, so
    /// a prefix's later blocks are evicted before its earlier ones.
    pub fn release(&mut self, table: &mut Vec<u32>) {
        self.truncate(table, 0);
    }

    /// Shortens `table` to the blocks that cover `positions` positions, releasing the rest
    /// as [`BlockAllocator::release`] does (rolled-back cells: a speculative draft's
    /// rejected tokens). Cells past `positions` in the last kept block are simply
    /// overwritten later; a block the prefix cache holds is never partly rolled back, since
    /// only full prompt blocks are cached and a sequence only rolls back what it generated.
    pub fn truncate(&mut self, table: &mut Vec<u32>, positions: usize) {
        let keep = positions.div_ceil(self.block_size).min(table.len());
        for block in table.drain(keep..).rev() {
            let references = &mut self.references[block as usize];
            *references = references
                .checked_sub(1)
                .expect("a table's blocks are referenced");
            if *references > 0 {
                continue;
            }
            match &mut self.cache {
                Some(cache) if cache.contains(block) => cache.set_idle(block),
                _ => self.free.push(block),
            }
        }
    }

    /// The cached block with `key`, if any (a block starting the sequence when `key.parent`
    /// is `None`).
    pub fn find(&self, key: &BlockKey) -> Option<u32> {
        self.cache.as_ref()?.find(key)
    }

    /// How many of `blocks` are idle: sharing them takes them out of the free count.
    pub fn idle_among(&self, blocks: &[u32]) -> usize {
        let Some(cache) = &self.cache else { return 0 };
        blocks.iter().filter(|&&block| cache.is_idle(block)).count()
    }

    /// Appends the cached `blocks` (a prefix found with [`BlockAllocator::find`]) to the
    /// empty `table`, sharing them with their other users.
    pub fn share(&mut self, table: &mut Vec<u32>, blocks: &[u32]) {
        debug_assert!(table.is_empty(), "a shared prefix starts the table");
        for &block in blocks {
            if let Some(cache) = &mut self.cache {
                cache.set_busy(block);
            }
            self.references[block as usize] += 1;
            table.push(block);
        }
    }

    /// Caches `table[index]`, whose cells now hold `tokens` computed under `class` after the
    /// prefix of `table[..index]`; false (nothing cached) when the cache is off, the previous
    /// block is not cached, or another block holds the same already.
    pub fn register(&mut self, table: &[u32], index: usize, tokens: &[u32], class: u8) -> bool {
        let Some(cache) = &mut self.cache else {
            return false;
        };
        let key = BlockKey {
            parent: index.checked_sub(1).map(|parent| table[parent]),
            tokens: tokens.into(),
            class,
        };
        cache.insert(table[index], key)
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

    fn key(parent: Option<u32>, tokens: &[u32]) -> BlockKey {
        BlockKey {
            parent,
            tokens: tokens.into(),
            class: 0,
        }
    }

    #[test]
    fn shared_blocks_return_once_no_sequence_uses_them() {
        let mut pool = BlockAllocator::with_prefix_cache(4, 2);
        let mut a = Vec::new();
        assert!(pool.reserve(&mut a, 5));
        assert!(pool.register(&a, 0, &[1, 2], 0));
        assert!(pool.register(&a, 1, &[3, 4], 0));
        let first = pool.find(&key(None, &[1, 2])).expect("cached");
        let second = pool.find(&key(Some(first), &[3, 4])).expect("cached");
        assert_eq!([first, second], [a[0], a[1]]);
        let mut b = Vec::new();
        pool.share(&mut b, &[first, second]);
        assert!(pool.reserve(&mut b, 6));
        assert_eq!(pool.free_blocks(), 0);
        pool.release(&mut a);
        assert_eq!(
            pool.free_blocks(),
            1,
            "a's third block; the shared two are b's"
        );
        pool.release(&mut b);
        assert_eq!(pool.free_blocks(), 4);
        assert_eq!(pool.idle_cached_blocks(), 2);
        assert_eq!(pool.idle_among(&[first, second]), 2);
    }

    #[test]
    fn a_full_pool_evicts_idle_cached_blocks() {
        let mut pool = BlockAllocator::with_prefix_cache(2, 2);
        let mut a = Vec::new();
        assert!(pool.reserve(&mut a, 4));
        assert!(pool.register(&a, 0, &[1, 2], 0));
        assert!(pool.register(&a, 1, &[3, 4], 0));
        pool.release(&mut a);
        let mut b = Vec::new();
        assert!(pool.reserve(&mut b, 2));
        // The later block went first: the prefix's first block is still found.
        assert!(pool.find(&key(None, &[1, 2])).is_some());
        assert!(pool.reserve(&mut b, 4));
        assert!(pool.find(&key(None, &[1, 2])).is_none());
        assert_eq!(pool.evicted_blocks(), 2);
        assert!(!pool.reserve(&mut b, 5));
        pool.release(&mut b);
        assert_eq!(pool.free_blocks(), 2);
        assert_eq!(pool.idle_cached_blocks(), 0);
    }
    #[test]
    fn truncation_returns_the_blocks_past_the_kept_positions() {
        let mut pool = BlockAllocator::with_prefix_cache(4, 4);
        let mut a = Vec::new();
        assert!(pool.reserve(&mut a, 6));
        assert!(pool.register(&a, 0, &[1, 2, 3, 4], 0));
        assert!(pool.reserve(&mut a, 15));
        assert_eq!((a.len(), pool.free_blocks()), (4, 0));
        pool.truncate(&mut a, 9);
        assert_eq!((a.len(), pool.free_blocks()), (3, 1));
        pool.truncate(&mut a, 4);
        assert_eq!((a.len(), pool.free_blocks()), (1, 3));
        assert_eq!(pool.idle_cached_blocks(), 0, "the kept cached block is a's");
        pool.truncate(&mut a, 0);
        assert_eq!(pool.idle_cached_blocks(), 1);
        assert_eq!(pool.free_blocks(), 4);
    }
}
