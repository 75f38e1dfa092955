//! The sixteen-row AVX-512 VNNI kernels of the repack order, one choice per type and order,
//! which `x86::drive` runs on whole groups of sixteen weight rows before the eight-row ones.

use super::{x86_b32_wide, x86_q4_k_wide};

/// The sixteen-row AVX-512 VNNI kernels of a type and order.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Wide {
    Q4_0,
    Iq4Nl,
    Q4KGemv,
    Q4KGemm,
}

impl Wide {
    /// True when the kernels take rows of `row_bytes` and `tokens` activation rows of `n`.
    pub(super) fn fits(self, n: usize, row_bytes: usize, tokens: usize) -> bool {
        let offsets = i32::try_from(15 * row_bytes + 16).is_ok();
        match self {
            Wide::Q4_0 | Wide::Iq4Nl => offsets && tokens * (n / 32) <= x86_b32_wide::SUMS_CAPACITY,
            Wide::Q4KGemv | Wide::Q4KGemm => offsets,
        }
    }

    /// Runs the kernels on the whole groups of sixteen rows.
    ///
    /// # Safety
    /// As `x86_b32_wide::run` and `x86_q4_k_wide::run`.
    pub(super) unsafe fn run(
        self,
        n: usize,
        weights: (*const u8, usize, usize),
        activations: (*const u8, usize, usize),
        out: *mut f32,
    ) {
        match self {
            Wide::Q4_0 => x86_b32_wide::run(false, n, weights, activations, out),
            Wide::Iq4Nl => x86_b32_wide::run(true, n, weights, activations, out),
            Wide::Q4KGemv => x86_q4_k_wide::run(false, n, weights, activations, out),
            Wide::Q4KGemm => x86_q4_k_wide::run(true, n, weights, activations, out),
        }
    }
}
