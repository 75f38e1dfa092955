//! The prefix cache's index: full KV blocks of prompts, found again by their content. A
//! block's key is its parent block (the cached block of the previous positions, itself keyed
//! the same way) with its own tokens and attention class, so a key names the whole token
//! prefix up to the block's end, as vLLM's hash chained over (parent hash, block tokens)
//! does, but compared exactly: two different prefixes never share a key.
//!
//! Blocks no sequence uses stay indexed while idle and are evicted least recently used: an
//! evicted block leaves the index together with every cached block below it (their keys name
//! it as parent, and its number will be reused for other content).

use std::collections::{BTreeMap, HashMap};

/// What a cached block holds: the KV cells of `tokens` following the prefix that `parent`
/// holds (`None`: the block starts the sequence), computed under `class`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct BlockKey {
    pub parent: Option<u32>,
    pub tokens: Box<[u32]>,
    /// How the block's positions were evaluated where the numbers depend on it (for the CPU:
    /// which attention path their prompt chunks took); blocks of different classes are
    /// different content.
    pub class: u8,
}

/// A cached block's bookkeeping.
#[derive(Debug, Clone)]
struct Entry {
    key: BlockKey,
    /// Cached blocks whose key names this block as parent.
    children: Vec<u32>,
    /// When the block became idle (no sequence uses it), the key of the eviction order;
    /// `None` while some sequence uses it.
    idle_since: Option<u64>,
}

/// Cached blocks by key, and the idle ones in least-recently-used order.
#[derive(Debug, Clone, Default)]
pub struct PrefixCache {
    index: HashMap<BlockKey, u32>,
    entries: HashMap<u32, Entry>,
    /// Idle cached blocks by the tick they became idle (oldest first).
    idle: BTreeMap<u64, u32>,
    clock: u64,
}

impl PrefixCache {
    /// The cached block with key `key`.
    pub fn find(&self, key: &BlockKey) -> Option<u32> {
        self.index.get(key).copied()
    }

    /// True when `block` is cached.
    pub fn contains(&self, block: u32) -> bool {
        self.entries.contains_key(&block)
    }

    /// Cached blocks, idle or in use.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True when nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Cached blocks no sequence uses (evictable).
    pub fn idle_len(&self) -> usize {
        self.idle.len()
    }

    /// Indexes `block` (in use) under `key`; false, changing nothing, when the key already
    /// names another block, when `block` is cached already, or when the parent is not cached.
    pub fn insert(&mut self, block: u32, key: BlockKey) -> bool {
        if self.index.contains_key(&key) || self.entries.contains_key(&block) {
            return false;
        }
        if let Some(parent) = key.parent {
            match self.entries.get_mut(&parent) {
                Some(entry) => entry.children.push(block),
                None => return false,
            }
        }
        self.index.insert(key.clone(), block);
        self.entries.insert(
            block,
            Entry {
                key,
                children: Vec::new(),
                idle_since: None,
            },
        );
        true
    }

    /// Marks cached `block` idle, the most recently used of the idle blocks.
    pub fn set_idle(&mut self, block: u32) {
        let tick = self.clock;
        if let Some(entry) = self.entries.get_mut(&block) {
            if entry.idle_since.is_none() {
                entry.idle_since = Some(tick);
                self.idle.insert(tick, block);
                self.clock += 1;
            }
        }
    }

    /// Marks cached `block` in use (a sequence shares it); it is no longer evictable.
    pub fn set_busy(&mut self, block: u32) {
        if let Some(entry) = self.entries.get_mut(&block) {
            if let Some(tick) = entry.idle_since.take() {
                self.idle.remove(&tick);
            }
        }
    }

    /// True when cached `block` is idle.
    pub fn is_idle(&self, block: u32) -> bool {
        self.entries
            .get(&block)
            .is_some_and(|entry| entry.idle_since.is_some())
    }

    /// Evicts the least recently used idle block and the cached blocks below it; returns
    /// the evicted blocks that were idle (free now), or `None` when no block is idle.
    pub fn evict(&mut self) -> Option<Vec<u32>> {
        let (_, block) = self.idle.pop_first()?;
        if let Some(entry) = self.entries.get_mut(&block) {
            entry.idle_since = None;
        }
        let mut freed = vec![block];
        if let Some(parent) = self.entries.get(&block).and_then(|entry| entry.key.parent) {
            if let Some(parent) = self.entries.get_mut(&parent) {
                parent.children.retain(|&child| child != block);
            }
        }
        let mut pending = vec![block];
        while let Some(next) = pending.pop() {
            let Some(entry) = self.entries.remove(&next) else {
                continue;
            };
            self.index.remove(&entry.key);
            if let Some(tick) = entry.idle_since {
                self.idle.remove(&tick);
                freed.push(next);
            }
            pending.extend(entry.children);
        }
        Some(freed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(parent: Option<u32>, tokens: &[u32]) -> BlockKey {
        BlockKey {
            parent,
            tokens: tokens.into(),
            class: 0,
        }
    }

    #[test]
    fn keys_chain_and_differ_by_parent_tokens_and_class() {
        let mut cache = PrefixCache::default();
        assert!(cache.insert(7, key(None, &[1, 2])));
        assert!(cache.insert(3, key(Some(7), &[3, 4])));
        assert!(!cache.insert(9, key(Some(7), &[3, 4])), "the key names 3");
        assert!(!cache.insert(9, key(Some(5), &[3, 4])), "5 is not cached");
        assert_eq!(cache.find(&key(Some(7), &[3, 4])), Some(3));
        assert_eq!(cache.find(&key(None, &[3, 4])), None);
        let mut other_class = key(None, &[1, 2]);
        other_class.class = 1;
        assert_eq!(cache.find(&other_class), None);
    }

    #[test]
    fn evicts_least_recently_idle_with_everything_below() {
        let mut cache = PrefixCache::default();
        assert!(cache.insert(0, key(None, &[1])));
        assert!(cache.insert(1, key(Some(0), &[2])));
        assert!(cache.insert(2, key(None, &[9])));
        // Released child first, as a sequence releases its table back to front.
        cache.set_idle(1);
        cache.set_idle(0);
        cache.set_idle(2);
        assert_eq!(cache.idle_len(), 3);
        assert_eq!(cache.evict(), Some(vec![1]));
        assert_eq!(cache.evict(), Some(vec![0]));
        cache.set_busy(2);
        assert_eq!(cache.evict(), None, "block 2 is in use");
        assert_eq!(cache.len(), 1);
    }

    #[test]
    fn evicting_a_parent_drops_its_descendants() {
        let mut cache = PrefixCache::default();
        assert!(cache.insert(0, key(None, &[1])));
        assert!(cache.insert(1, key(Some(0), &[2])));
        assert!(cache.insert(2, key(Some(1), &[3])));
        cache.set_idle(0);
        cache.set_idle(2);
        cache.set_idle(1);
        let mut freed = cache.evict().expect("an idle block");
        freed.sort_unstable();
        assert_eq!(freed, [0, 1, 2]);
        assert!(cache.is_empty());
        assert_eq!(cache.idle_len(), 0);
        assert_eq!(cache.find(&key(Some(0), &[2])), None);
    }
}
