//! Where the weights a backend computes from live on the host: in the file's memory map, or
//! copied into anonymous memory backed by transparent huge pages.
//!
//! A CPU decode step streams every weight once. From a file map the kernel gives it 4 KiB
//! pages of the page cache, so a 100 MB model spans 25 000 pages, far more than the TLB
//! holds: each new page is a page walk (two-dimensional in a virtual machine), and the
//! hardware prefetcher stops at every page boundary. The same bytes in 2 MiB pages decode
//! SmolLM2-135M about 10% faster on one request (measured on a 2-core KVM Xeon). The copy
//! costs the model's size in memory that the kernel cannot reclaim, and a pass over the file
//! at load, so it is made only where it pays and fits (see [`WeightPlacement::Auto`]).

use std::sync::Arc;

use runit_backend::HostMemory;
use runit_gguf::GgufFile;

/// Where a backend that computes from host memory finds the weights.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WeightPlacement {
    /// Straight from the file's memory map: no copy, pages shared with the page cache.
    Mapped,
    /// Copied into memory in huge pages when the backend computes from host memory
    /// (`Backend::reads_weights_from_host`), the system offers transparent huge pages, and
    /// the file takes at most half of the available memory; otherwise [`Mapped`](Self::Mapped).
    #[default]
    Auto,
}

/// The memory-mapped model file, shared with backends that read weights in place.
pub struct MappedFile(pub Arc<GgufFile>);

impl HostMemory for MappedFile {
    fn bytes(&self) -> &[u8] {
        self.0.as_bytes()
    }
}

/// A copy of the whole file (so tensor ranges index it as they index the file) in anonymous
/// memory that starts on a huge-page boundary and is advised to use huge pages.
pub struct ResidentFile {
    map: memmap2::MmapMut,
    start: usize,
    len: usize,
}

/// Size of a transparent huge page on x86-64 and most aarch64 kernels.
const HUGE_PAGE: usize = 2 << 20;

impl ResidentFile {
    /// Copies `bytes`; `None` when the system will not map the memory.
    pub fn copy_of(bytes: &[u8]) -> Option<ResidentFile> {
        ResidentFile::copy_reporting(bytes, &|_| {})
    }

    /// [`ResidentFile::copy_of`], calling `copied` with the bytes copied so far after each
    /// chunk of 64 MiB.
    pub fn copy_reporting(bytes: &[u8], copied: &dyn Fn(u64)) -> Option<ResidentFile> {
        let len = bytes.len();
        // One huge page of slack, so that the copy can start on a huge-page boundary
        // wherever the kernel places the map.
        let mut map = memmap2::MmapMut::map_anon(len + HUGE_PAGE).ok()?;
        let start = map.as_ptr().align_offset(HUGE_PAGE).min(HUGE_PAGE);
        #[cfg(target_os = "linux")]
        {
            // Advice only: without huge pages the copy still works, in small pages.
            let _ = map.advise_range(memmap2::Advice::HugePage, start, len);
        }
        const CHUNK: usize = 64 << 20;
        for (index, chunk) in bytes.chunks(CHUNK).enumerate() {
            let at = start + index * CHUNK;
            map[at..at + chunk.len()].copy_from_slice(chunk);
            copied((index * CHUNK + chunk.len()) as u64);
        }
        Some(ResidentFile { map, start, len })
    }
}

impl HostMemory for ResidentFile {
    fn bytes(&self) -> &[u8] {
        &self.map[self.start..self.start + self.len]
    }
}

/// How far loading has come, for a progress display.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LoadStep {
    /// `bytes` of the file's `total` copied into resident memory.
    Copied { bytes: u64, total: u64 },
    /// `bytes` of the weights' `total` handed to the backend (uploaded, on a device).
    Loaded { bytes: u64, total: u64 },
}

/// What the system offers that decides [`WeightPlacement::Auto`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostMemoryFacts {
    /// Transparent huge pages are enabled (`always` or `madvise`).
    pub huge_pages: bool,
    /// Memory available for new allocations, in bytes (`None`: unknown).
    pub available: Option<u64>,
}

impl HostMemoryFacts {
    /// This machine's facts (Linux: `/sys/kernel/mm/transparent_hugepage/enabled` and
    /// `MemAvailable` of `/proc/meminfo`; elsewhere no huge pages).
    pub fn of_this_machine() -> HostMemoryFacts {
        let read = |path: &str| std::fs::read_to_string(path).ok();
        let huge_pages = cfg!(target_os = "linux")
            && read("/sys/kernel/mm/transparent_hugepage/enabled")
                .is_some_and(|mode| mode.contains("[always]") || mode.contains("[madvise]"));
        let available = read("/proc/meminfo").and_then(|info| {
            let line = info
                .lines()
                .find(|line| line.starts_with("MemAvailable:"))?;
            let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
            Some(kib * 1024)
        });
        HostMemoryFacts {
            huge_pages,
            available,
        }
    }
}

/// True when `placement` asks for a huge-page copy of a file of `size` bytes for a backend
/// that does (`reads_from_host`) or does not compute from host memory, given `facts`.
pub fn copies(
    placement: WeightPlacement,
    reads_from_host: bool,
    size: u64,
    facts: HostMemoryFacts,
) -> bool {
    placement == WeightPlacement::Auto
        && reads_from_host
        && facts.huge_pages
        && facts
            .available
            .is_some_and(|available| size <= available / 2)
}

/// The host memory weights of `file` are loaded from under `placement`.
pub fn host_memory(
    file: &Arc<GgufFile>,
    placement: WeightPlacement,
    reads_from_host: bool,
    progress: &dyn Fn(LoadStep),
) -> Arc<dyn HostMemory> {
    let size = file.as_bytes().len() as u64;
    if copies(
        placement,
        reads_from_host,
        size,
        HostMemoryFacts::of_this_machine(),
    ) {
        let copied = |bytes| progress(LoadStep::Copied { bytes, total: size });
        if let Some(copy) = ResidentFile::copy_reporting(file.as_bytes(), &copied) {
            return Arc::new(copy);
        }
    }
    Arc::new(MappedFile(Arc::clone(file)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_resident_copy_holds_the_same_bytes_from_a_huge_page_boundary() {
        let bytes: Vec<u8> = (0..3 * HUGE_PAGE + 12345)
            .map(|i| (i * 7 % 251) as u8)
            .collect();
        let copy = ResidentFile::copy_of(&bytes).expect("anonymous memory maps");
        assert_eq!(copy.bytes(), &bytes[..]);
        assert_eq!(copy.bytes().as_ptr() as usize % HUGE_PAGE, 0);
        let empty = ResidentFile::copy_of(&[]).expect("anonymous memory maps");
        assert!(empty.bytes().is_empty());
    }

    #[test]
    fn auto_copies_only_for_host_backends_with_huge_pages_and_room() {
        let roomy = HostMemoryFacts {
            huge_pages: true,
            available: Some(1000),
        };
        assert!(copies(WeightPlacement::Auto, true, 500, roomy));
        assert!(
            !copies(WeightPlacement::Auto, true, 501, roomy),
            "more than half"
        );
        assert!(
            !copies(WeightPlacement::Mapped, true, 10, roomy),
            "asked not to"
        );
        assert!(
            !copies(WeightPlacement::Auto, false, 10, roomy),
            "device backend"
        );
        let no_huge = HostMemoryFacts {
            huge_pages: false,
            ..roomy
        };
        assert!(!copies(WeightPlacement::Auto, true, 10, no_huge));
        let unknown = HostMemoryFacts {
            available: None,
            ..roomy
        };
        assert!(!copies(WeightPlacement::Auto, true, 10, unknown));
    }
}
