//! The lane-per-row kernels of the repack order that `x86::drive` runs on whole groups of
//! their rows before the eight-row `GroupFn`s: sixteen rows with AVX-512 VNNI, eight with
//! AVX2 or AVX-VNNI (Q4_0 and IQ4_NL), one choice per type and order.

use super::{x86_b32_eight, x86_b32_wide, x86_q4_k_wide};

/// The lane-per-row kernels of a type and order.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Wide {
    Q4_0,
    Iq4Nl,
    Q4KGemv,
    Q4KGemm,
    /// Q4_0, eight rows, AVX2 (`vnni` false) or AVX-VNNI.
    Q4_0Eight {
        vnni: bool,
    },
    /// IQ4_NL, eight rows, AVX2 (`vnni` false) or AVX-VNNI.
    Iq4NlEight {
        vnni: bool,
    },
}

impl Wide {
    /// Weight rows per pass.
    pub(super) fn rows(self) -> usize {
        match self {
            Wide::Q4_0Eight { .. } | Wide::Iq4NlEight { .. } => x86_b32_eight::ROWS,
            _ => x86_b32_wide::ROWS,
        }
    }

    /// True when the kernels take rows of `n` elements in `row_bytes`.
    pub(super) fn fits(self, n: usize, row_bytes: usize) -> bool {
        let offsets = i32::try_from(15 * row_bytes + 16).is_ok();
        match self {
            Wide::Q4_0 | Wide::Iq4Nl => offsets && n / 32 <= x86_b32_wide::SUMS_CAPACITY,
            Wide::Q4KGemv | Wide::Q4KGemm => offsets,
            Wide::Q4_0Eight { .. } | Wide::Iq4NlEight { .. } => x86_b32_eight::fits(n),
        }
    }

    /// Runs the kernels on the whole groups of sixteen rows.
    ///
    /// # Safety
    /// As `x86_b32_wide::run`, `x86_q4_k_wide::run` and `x86_b32_eight::run`.
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
            Wide::Q4_0Eight { vnni } => {
                x86_b32_eight::run((false, vnni), n, weights, activations, out)
            }
            Wide::Iq4NlEight { vnni } => {
                x86_b32_eight::run((true, vnni), n, weights, activations, out)
            }
        }
    }
}
