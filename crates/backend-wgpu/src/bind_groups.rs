//! Bind groups kept by what they bind and reused by later batches: a decode step records the
//! same dispatches, over the same buffers, parameter slots and table places, token after
//! token, so its bind groups are looked up, not made. A lookup allocates nothing: the key is
//! a hash of the borrowed bindings, checked against the bindings kept with the group.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hash, Hasher};

/// Bind groups kept per generation: beyond it the older generation is dropped (a decode
/// step records about 500 dispatches, so a step's bind groups stay while tokens repeat it).
const KEPT: usize = 4096;

/// rustc's FxHash: one rotate, xor and multiply a word, enough for keys of a few words
/// (the map's keys are already hashes).
#[derive(Default)]
pub(crate) struct FxHasher(u64);

impl FxHasher {
    fn add(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
}

impl Hasher for FxHasher {
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.add(u64::from_le_bytes(word));
        }
    }

    fn write_u32(&mut self, n: u32) {
        self.add(u64::from(n));
    }

    fn write_u64(&mut self, n: u64) {
        self.add(n);
    }

    fn write_usize(&mut self, n: usize) {
        self.add(n as u64);
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

/// One binding of a dispatch as the bind group sees it: a buffer, an offset and a size in
/// bytes.
pub(crate) type Bound<'a> = (&'a wgpu::Buffer, u64, u64);

/// What a dispatch binds: its pipeline (by address: pipelines are never dropped), its
/// parameter slot in the ring (offset, bytes) and each buffer range at bindings 1, 2, ...
pub(crate) struct BindKey<'a> {
    pub pipeline: usize,
    pub params: (u64, u64),
    pub ranges: &'a [Bound<'a>],
}

impl BindKey<'_> {
    fn hash(&self) -> u64 {
        let mut hasher = FxHasher::default();
        hasher.write_usize(self.pipeline);
        hasher.write_u64(self.params.0);
        hasher.write_u64(self.params.1);
        for (buffer, offset, bytes) in self.ranges {
            buffer.hash(&mut hasher);
            hasher.write_u64(*offset);
            hasher.write_u64(*bytes);
        }
        hasher.finish()
    }
}

/// A kept bind group with what it binds; holding the buffers keeps their identities from
/// being reused by new buffers while the group is kept.
struct Kept {
    pipeline: usize,
    params: (u64, u64),
    ranges: Vec<(wgpu::Buffer, u64, u64)>,
    group: wgpu::BindGroup,
}

impl Kept {
    fn binds(&self, key: &BindKey<'_>) -> bool {
        self.pipeline == key.pipeline
            && self.params == key.params
            && self.ranges.len() == key.ranges.len()
            && self
                .ranges
                .iter()
                .zip(key.ranges)
                .all(|((b, o, n), (kb, ko, kn))| b == *kb && o == ko && n == kn)
    }
}

/// Hash maps on [`FxHasher`].
pub(crate) type FxBuild = BuildHasherDefault<FxHasher>;

type Generation = HashMap<u64, Kept, FxBuild>;

/// Bind groups by what they bind, in two generations, the older dropped when the newer is
/// full: a bind group keeps its buffers alive, so one not used for a generation goes.
#[derive(Default)]
pub(crate) struct BindGroups {
    current: Generation,
    previous: Generation,
}

impl BindGroups {
    /// The bind group of `key`, made by `make` where none is kept.
    pub fn get(
        &mut self,
        key: &BindKey<'_>,
        make: impl FnOnce() -> wgpu::BindGroup,
    ) -> wgpu::BindGroup {
        let hash = key.hash();
        if let Some(kept) = self.current.get(&hash).filter(|kept| kept.binds(key)) {
            return kept.group.clone();
        }
        let kept = match self.previous.remove(&hash) {
            Some(kept) if kept.binds(key) => kept,
            _ => Kept {
                pipeline: key.pipeline,
                params: key.params,
                ranges: key
                    .ranges
                    .iter()
                    .map(|(buffer, offset, bytes)| ((*buffer).clone(), *offset, *bytes))
                    .collect(),
                group: make(),
            },
        };
        if self.current.len() >= KEPT {
            self.previous = std::mem::take(&mut self.current);
        }
        let group = kept.group.clone();
        // A different key of the same hash (not met in practice) is replaced.
        self.current.insert(hash, kept);
        group
    }
}
