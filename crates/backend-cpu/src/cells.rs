//! Memory of a KV cache: zeroed cells, in huge pages where the cache is large enough.
//!
//! A decode step reads every sequence's cache rows once, scattered over its blocks, and the
//! weights that stream through the caches between two layers have evicted them: the rows
//! come from memory at the rate their misses overlap. In 4 KiB pages every block of every
//! sequence is also a TLB walk (two-dimensional in a virtual machine). A cache of at least
//! [`HUGE_MIN_BYTES`] is therefore allocated on a 2 MiB boundary, rounded up to whole 2 MiB
//! pages and advised to use transparent huge pages before its first touch: SmolLM2-135M's
//! 1.5 MB layer caches (4096 cells) took 63 -> 55 us of attention per layer of an 8-row
//! decode step on a 2-core KVM Xeon.

use std::alloc::Layout;
use std::ptr::NonNull;

/// A transparent huge page on x86-64 and most aarch64 kernels.
const HUGE_PAGE: usize = 2 << 20;

/// Caches from this size take huge pages (the rounding up then adds at most a third).
const HUGE_MIN_BYTES: usize = 3 << 19;

/// `len` zeroed values of `T` in an allocation of their own.
pub struct Cells<T: Copy> {
    start: NonNull<T>,
    len: usize,
    layout: Layout,
}

// SAFETY: `Cells` owns its allocation like a `Vec<T>` (no other handle to it exists);
// sending it is as safe as sending the values.
unsafe impl<T: Copy + Send> Send for Cells<T> {}
// SAFETY: `Cells` owns its allocation, and `&Cells` only hands out `&[T]`, so sharing it is
// as safe as sharing the values.
unsafe impl<T: Copy + Sync> Sync for Cells<T> {}

impl<T: Copy> Cells<T> {
    /// `len` values whose bits are all zero (for f16 and f32: +0), or `None` when the
    /// allocation fails.
    pub fn zeroed(len: usize) -> Option<Cells<T>> {
        let bytes = len.checked_mul(std::mem::size_of::<T>())?;
        let huge = bytes >= HUGE_MIN_BYTES;
        let layout = if huge {
            Layout::from_size_align(bytes.checked_next_multiple_of(HUGE_PAGE)?, HUGE_PAGE)
        } else {
            Layout::array::<T>(len)
        }
        .ok()?;
        if layout.size() == 0 {
            return Some(Cells {
                start: NonNull::dangling(),
                len,
                layout,
            });
        }
        // SAFETY: `layout` has a non-zero size (checked above), as `alloc` and
        // `alloc_zeroed` require; `write_bytes` covers exactly the `layout.size()` bytes
        // just allocated, and only when the allocation succeeded.
        let start = unsafe {
            if huge {
                // Uninitialised, so that the advice comes before the first touch.
                let start = std::alloc::alloc(layout);
                if !start.is_null() {
                    advise_huge_pages(start, layout.size());
                    std::ptr::write_bytes(start, 0, layout.size());
                }
                start
            } else {
                std::alloc::alloc_zeroed(layout)
            }
        };
        Some(Cells {
            start: NonNull::new(start.cast::<T>())?,
            len,
            layout,
        })
    }
}

#[cfg(test)]
impl<T: Copy> From<&[T]> for Cells<T> {
    /// A copy of `values` (the zeroed cells, then the values written over them).
    fn from(values: &[T]) -> Cells<T> {
        let mut cells = Cells::zeroed(values.len()).expect("memory for the cells");
        cells.copy_from_slice(values);
        cells
    }
}

impl<T: Copy> std::ops::Deref for Cells<T> {
    type Target = [T];

    fn deref(&self) -> &[T] {
        // SAFETY: `start` points to `len` values this struct owns, aligned for `T` (the
        // layout's alignment is `T`'s or a huge page) and initialised (zeroed at allocation;
        // all-zero bits are a valid value of every `T` this crate stores: f16, f32, bytes,
        // ggml's `Pod` blocks and, in tests, integers), or is dangling with `len == 0` or a zero-sized `T`.
        unsafe { std::slice::from_raw_parts(self.start.as_ptr(), self.len) }
    }
}

impl<T: Copy> std::ops::DerefMut for Cells<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        // SAFETY: `start` points to `len` owned, aligned, initialised values (see `deref`),
        // and `&mut self` makes the borrow unique.
        unsafe { std::slice::from_raw_parts_mut(self.start.as_ptr(), self.len) }
    }
}

impl<T: Copy> Drop for Cells<T> {
    fn drop(&mut self) {
        if self.layout.size() > 0 {
            // SAFETY: `start` was allocated in `zeroed` with this very layout (non-zero size,
            // so not the dangling pointer), and is freed once, here.
            unsafe { std::alloc::dealloc(self.start.as_ptr().cast(), self.layout) };
        }
    }
}

/// Asks Linux to back `len` bytes from `start` (2 MiB-aligned) with transparent huge pages.
/// Advice only: elsewhere, or where the kernel declines, the pages stay small.
fn advise_huge_pages(start: *mut u8, len: usize) {
    #[cfg(target_os = "linux")]
    {
        extern "C" {
            fn madvise(addr: *mut std::ffi::c_void, len: usize, advice: i32) -> i32;
        }
        const MADV_HUGEPAGE: i32 = 14;
        // SAFETY: advice on whole pages of an allocation this module owns; it changes no
        // contents (the result is ignored: advice only).
        unsafe { madvise(start.cast(), len, MADV_HUGEPAGE) };
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (start, len);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cells_are_zeroed_and_large_ones_start_on_a_huge_page() {
        for len in [0usize, 1, 1000, HUGE_MIN_BYTES / 4, HUGE_MIN_BYTES / 4 + 3] {
            let mut cells = Cells::<f32>::zeroed(len).expect("memory");
            assert_eq!(cells.len(), len);
            assert!(cells.iter().all(|v| v.to_bits() == 0));
            if len * 4 >= HUGE_MIN_BYTES {
                assert_eq!(cells.as_ptr() as usize % HUGE_PAGE, 0);
            }
            if let Some(last) = cells.last_mut() {
                *last = 7.0;
                assert_eq!(cells[len - 1], 7.0);
            }
        }
        let copied = Cells::from(&[1u16, 2, 3][..]);
        assert_eq!(&copied[..], &[1, 2, 3]);
        assert!(Cells::<u64>::zeroed(usize::MAX / 4).is_none());
    }
}
