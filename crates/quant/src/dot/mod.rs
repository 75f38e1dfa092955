//! Dot products of packed weight rows with activation rows, the inner loop of every CPU
//! matmul.
//!
//! Activations are first converted to the format ggml-cpu pairs with the weight type (its
//! `vec_dot_type`, see [`activation_format`]): Q8_0 for Q4_0/Q5_0/Q8_0/IQ4_NL, Q8_1 for
//! Q4_1/Q5_1, Q8_K for the K-quants and IQ4_XS, and F16/BF16/F32 for the float types. Each
//! block then contributes an exact integer dot product, scaled and accumulated in f32.
//!
//! **Numerics.** Every kernel reproduces the f32 arithmetic of ggml-cpu's AVX2 `vec_dot`
//! routines (as built with `-march=native`, FMA contraction on): eight f32 lanes, lane `k`
//! collecting the integer sums of elements `4k..4k+4` of each 32-element group, one fused
//! multiply-add per block (or super-block), then ggml's `hsum_float_8` order. The scalar
//! twin of each kernel (`SimdLevel::Scalar`) performs exactly the same operations, so SIMD
//! and scalar results are bit-identical and the tests compare them with `==`.
//!
//! ```
//! use runit_quant::dot::{activation_format, activation_row_bytes, dot_fn, quantize_activation, SimdLevel};
//! use runit_quant::{quantize, GgmlType};
//!
//! let n = 64;
//! let w: Vec<f32> = (0..n).map(|i| (i as f32 * 0.37).sin()).collect();
//! let x: Vec<f32> = (0..n).map(|i| (i as f32 * 0.11).cos()).collect();
//! let mut packed = vec![0u8; 2 * 18];
//! quantize(GgmlType::Q4_0, &w, &mut packed).unwrap();
//! let format = activation_format(GgmlType::Q4_0).unwrap();
//! let mut activation = vec![0u8; activation_row_bytes(format, n)];
//! quantize_activation(format, &x, &mut activation);
//! let dot = dot_fn(GgmlType::Q4_0, SimdLevel::detect()).unwrap();
//! let exact: f32 = w.iter().zip(&x).map(|(a, b)| a * b).sum();
//! assert!((dot(n, &packed, &activation) - exact).abs() < 0.2);
//! ```

mod batched;
mod float;
mod gather;
mod ggml_repack;
pub mod half_arith;
mod kquants;
mod lanes;
mod legacy;
#[cfg(target_arch = "aarch64")]
mod neon;
#[cfg(test)]
mod tests;
pub mod tinyblas;
#[cfg(target_arch = "x86_64")]
mod x86;

pub use batched::{
    block_offsets, block_quants, block_quants_len, block_scales, block_scales_len, gemv_fn,
    plain_tile_rows_fn, tile_fn, tile_rows_fn, tile_tables, tile_tables_begin, tile_tables_blocks,
    BlockScales, GemvFn, PlainTileRowsFn, QuantLayout, TablePointers, TileFn, TileOut, TileRowsFn,
    BLOCK_SCALES_PADDING,
};
pub use gather::{gather_dot_fn, GatherDotFn};
pub use ggml_repack::{is_repacked, repack_dot_fn, repack_one_order, repack_rows_fn, RowsFn};

use std::sync::OnceLock;

use bytemuck::Pod;

use crate::blocks::{cast_blocks_mut, BlockQ8K, BlockQ8_0, BlockQ8_1};
use crate::quantize::q8::{
    quantize_row_q8_0_activation, quantize_row_q8_1_activation, quantize_row_q8_k,
};
use crate::GgmlType;

/// The element format an activation row is converted to before it meets a weight row.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ActivationFormat {
    /// Plain f32 (paired with F32 weights).
    F32,
    /// IEEE half precision, round to nearest even (paired with F16 weights).
    F16,
    /// bfloat16, round to nearest even (paired with BF16 weights).
    BF16,
    /// 32-element blocks, f16 scale (Q4_0, Q5_0, Q8_0, IQ4_NL).
    Q8_0,
    /// 32-element blocks, f16 scale and f16 `d * sum(q)` (Q4_1, Q5_1).
    Q8_1,
    /// 256-element blocks, f32 scale and sums of 16 (the K-quants and IQ4_XS).
    Q8K,
}

impl ActivationFormat {
    /// The ggml type with this layout.
    pub fn ggml_type(self) -> GgmlType {
        match self {
            ActivationFormat::F32 => GgmlType::F32,
            ActivationFormat::F16 => GgmlType::F16,
            ActivationFormat::BF16 => GgmlType::BF16,
            ActivationFormat::Q8_0 => GgmlType::Q8_0,
            ActivationFormat::Q8_1 => GgmlType::Q8_1,
            ActivationFormat::Q8K => GgmlType::Q8_K,
        }
    }

    /// Elements per block (1 for the float formats).
    pub fn block_size(self) -> usize {
        self.ggml_type().block_size()
    }
}

/// Every weight type with a dot product (and so a matmul) against activations.
pub const WEIGHT_TYPES: [GgmlType; 15] = [
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::IQ4_NL,
    GgmlType::Q2_K,
    GgmlType::Q3_K,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
    GgmlType::IQ4_XS,
];

/// The activation format ggml-cpu pairs with `weight`, or `None` for a type without a dot
/// product here.
pub fn activation_format(weight: GgmlType) -> Option<ActivationFormat> {
    use GgmlType::*;
    Some(match weight {
        F32 => ActivationFormat::F32,
        F16 => ActivationFormat::F16,
        BF16 => ActivationFormat::BF16,
        Q4_0 | Q5_0 | Q8_0 | IQ4_NL => ActivationFormat::Q8_0,
        Q4_1 | Q5_1 => ActivationFormat::Q8_1,
        Q2_K | Q3_K | Q4_K | Q5_K | Q6_K | IQ4_XS => ActivationFormat::Q8K,
        _ => return None,
    })
}

/// Bytes of one activation row of `n` elements in `format`.
///
/// # Panics
/// When `n` is not a multiple of the format's block size.
pub fn activation_row_bytes(format: ActivationFormat, n: usize) -> usize {
    let ty = format.ggml_type();
    assert!(
        n.is_multiple_of(ty.block_size()),
        "activation row of {n} elements is not a whole number of {ty} blocks"
    );
    n / ty.block_size() * ty.type_size()
}

/// Converts the f32 row `x` into `out` (`activation_row_bytes(format, x.len())` bytes), as
/// ggml-cpu's x86 build converts matmul activations (see `quantize::q8`).
///
/// # Panics
/// When the lengths disagree.
pub fn quantize_activation(format: ActivationFormat, x: &[f32], out: &mut [u8]) {
    let bytes = activation_row_bytes(format, x.len());
    assert_eq!(
        out.len(),
        bytes,
        "activation buffer for {} values of {:?}",
        x.len(),
        format
    );
    match format {
        ActivationFormat::F32 => out.copy_from_slice(bytemuck::cast_slice(x)),
        ActivationFormat::F16 => {
            for (value, bytes) in x.iter().zip(out.chunks_exact_mut(2)) {
                bytes.copy_from_slice(&half::f16::from_f32(*value).to_le_bytes());
            }
        }
        ActivationFormat::BF16 => {
            for (value, bytes) in x.iter().zip(out.chunks_exact_mut(2)) {
                bytes.copy_from_slice(&half::bf16::from_f32(*value).to_le_bytes());
            }
        }
        ActivationFormat::Q8_0 => write_blocks::<BlockQ8_0>(x, out, quantize_row_q8_0_activation),
        ActivationFormat::Q8_1 => write_blocks::<BlockQ8_1>(x, out, quantize_row_q8_1_activation),
        ActivationFormat::Q8K => write_blocks::<BlockQ8K>(x, out, quantize_row_q8_k),
    }
}

/// Runs a typed block quantizer into a byte buffer, through a copy when `out` is not
/// aligned for `B`.
fn write_blocks<B: Pod>(x: &[f32], out: &mut [u8], quantize: fn(&[f32], &mut [B])) {
    match cast_blocks_mut::<B>(out) {
        Some(blocks) => quantize(x, blocks),
        None => {
            let mut blocks = vec![B::zeroed(); out.len() / std::mem::size_of::<B>()];
            quantize(x, &mut blocks);
            out.copy_from_slice(bytemuck::cast_slice(&blocks));
        }
    }
}

/// An instruction-set level for the kernels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SimdLevel {
    /// Portable Rust, the reference twin of every kernel.
    Scalar,
    /// x86-64 AVX2 + FMA + F16C.
    Avx2,
    /// AVX2 plus the 256-bit VEX VNNI (`vpdpbusd`, Alder Lake and later).
    AvxVnni,
    /// AVX-512 F/BW/VL (512-bit float kernels; integer kernels as AVX2).
    Avx512,
    /// AVX-512 plus VNNI (`vpdpbusd` on 256-bit EVEX registers).
    Avx512Vnni,
    /// aarch64 Advanced SIMD.
    Neon,
}

impl SimdLevel {
    /// The best level this CPU supports within `RUNIT_CPU_ISA`'s cap ([`crate::cpu`]),
    /// detected once.
    pub fn detect() -> SimdLevel {
        static DETECTED: OnceLock<SimdLevel> = OnceLock::new();
        *DETECTED.get_or_init(detect_uncached)
    }

    /// True when this CPU can run kernels of this level and [`crate::cpu`]'s cap allows them.
    pub fn is_available(self) -> bool {
        match self {
            SimdLevel::Scalar => true,
            #[cfg(target_arch = "x86_64")]
            SimdLevel::Avx2 => x86::has_avx2(),
            #[cfg(target_arch = "x86_64")]
            SimdLevel::AvxVnni => x86::has_avx2() && x86::has_avx_vnni(),
            #[cfg(target_arch = "x86_64")]
            SimdLevel::Avx512 => x86::has_avx2() && x86::has_avx512(),
            #[cfg(target_arch = "x86_64")]
            SimdLevel::Avx512Vnni => x86::has_avx2() && x86::has_avx512() && x86::has_avx512_vnni(),
            #[cfg(target_arch = "aarch64")]
            SimdLevel::Neon => std::arch::is_aarch64_feature_detected!("neon"),
            #[allow(unreachable_patterns)]
            _ => false,
        }
    }

    /// This level followed by the lower levels tried when it has no kernel for a type.
    fn fallback_chain(self) -> &'static [SimdLevel] {
        use SimdLevel::*;
        match self {
            Scalar => &[Scalar],
            Avx2 => &[Avx2, Scalar],
            AvxVnni => &[AvxVnni, Avx2, Scalar],
            Avx512 => &[Avx512, Avx2, Scalar],
            Avx512Vnni => &[Avx512Vnni, Avx512, AvxVnni, Avx2, Scalar],
            Neon => &[Neon, Scalar],
        }
    }

    /// Every level, best first (for tests and benchmarks).
    pub const ALL: [SimdLevel; 6] = [
        SimdLevel::Avx512Vnni,
        SimdLevel::Avx512,
        SimdLevel::AvxVnni,
        SimdLevel::Avx2,
        SimdLevel::Neon,
        SimdLevel::Scalar,
    ];
}

fn detect_uncached() -> SimdLevel {
    SimdLevel::ALL
        .into_iter()
        .find(|level| level.is_available())
        .unwrap_or(SimdLevel::Scalar)
}

/// How the F16 kernels of a level sum the products of one weight row and one activation
/// row (`vec_dot`; prompt batches take llamafile's sgemm order, the same at every level).
/// ggml-cpu's own order depends on the CPU it was built for, so RunIT picks one per level.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HalfSums {
    /// As ggml-cpu on the machine that made the goldens (AVX512-FP16): 128-element steps
    /// in f16 arithmetic, emulated exactly where the CPU lacks it ([`half_arith`]). The
    /// goldens' bits at every level.
    Reference,
    /// As ggml-cpu's AVX2 build (llama.cpp's `haswell` variant, what it runs on a CPU
    /// without AVX-512): four 8-lane f32 accumulators over 32-element steps (`float`'s
    /// `dot_f16_lanes8`). The sums of that llama.cpp's F16 dot product on the same CPU, and free of the
    /// f16 emulation that made F16 decode there several times slower than llama.cpp.
    Lanes8,
}

impl SimdLevel {
    /// The F16 order of this level's kernels: [`HalfSums::Lanes8`] at the AVX2 levels (the
    /// best a CPU without AVX-512 has), unless [`crate::cpu::f16_reference`] asks for the
    /// reference order everywhere.
    pub fn half_sums(self) -> HalfSums {
        let avx2 = matches!(self, SimdLevel::Avx2 | SimdLevel::AvxVnni);
        if avx2 && SimdLevel::Avx2.is_available() && !crate::cpu::f16_reference() {
            HalfSums::Lanes8
        } else {
            HalfSums::Reference
        }
    }
}

/// The scalar twin of [`dot_fn`]`(weight, level)`'s kernel: the same operations in portable
/// Rust, bit for bit. That is the scalar level's kernel except for F16 at a level whose
/// [`HalfSums`] differ from the scalar level's.
pub fn twin_dot_fn(weight: GgmlType, level: SimdLevel) -> Option<DotFn> {
    if weight == GgmlType::F16 && level.half_sums() == HalfSums::Lanes8 {
        return Some(float::dot_f16_lanes8);
    }
    dot_fn(weight, SimdLevel::Scalar)
}

/// `dot(n, weight_row, activation_row)`: the dot product of one packed weight row of `n`
/// elements with one activation row in the paired [`ActivationFormat`].
///
/// Panics when a row is shorter than `n` elements imply.
pub type DotFn = fn(n: usize, weight_row: &[u8], activation_row: &[u8]) -> f32;

/// `multi_dot(n, weight_row, activations, out)`: `out[c] = dot(weight_row, activation row c)`
/// for `out.len()` activation rows stored back to back in `activations` (each
/// `activation_row_bytes(format, n)` long). Unpacks each weight block once for several
/// activation rows; results equal the single-row [`DotFn`] bit for bit.
pub type MultiDotFn = fn(n: usize, weight_row: &[u8], activations: &[u8], out: &mut [f32]);

/// The dot product kernel for `weight` at `level`, or at the best lower level that this CPU
/// supports and that has a kernel for the type. `None` for types without a dot product.
pub fn dot_fn(weight: GgmlType, level: SimdLevel) -> Option<DotFn> {
    activation_format(weight)?;
    for &candidate in level.fallback_chain() {
        if !candidate.is_available() {
            continue;
        }
        let kernel = match candidate {
            SimdLevel::Scalar => scalar_dot(weight),
            #[cfg(target_arch = "x86_64")]
            _ => x86::dot(weight, candidate),
            #[cfg(target_arch = "aarch64")]
            _ => neon::dot(weight, candidate),
            #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
            _ => None,
        };
        if kernel.is_some() {
            return kernel;
        }
    }
    None
}

/// The multi-row kernel for `weight` at `level` (with the same fallback as [`dot_fn`]).
/// Levels without a dedicated multi-row kernel for a type loop over their single-row one.
pub fn multi_dot_fn(weight: GgmlType, level: SimdLevel) -> Option<MultiDotFn> {
    activation_format(weight)?;
    for &candidate in level.fallback_chain() {
        if !candidate.is_available() {
            continue;
        }
        let kernel = match candidate {
            SimdLevel::Scalar => scalar_multi_dot(weight),
            #[cfg(target_arch = "x86_64")]
            _ => x86::multi_dot(weight, candidate),
            #[cfg(target_arch = "aarch64")]
            _ => neon::multi_dot(weight, candidate),
            #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
            _ => None,
        };
        if kernel.is_some() {
            return kernel;
        }
    }
    None
}

/// A [`MultiDotFn`] that calls the single-row kernel `$dot` once per activation row.
macro_rules! looped {
    ($dot:path) => {{
        fn multi(n: usize, weight_row: &[u8], activations: &[u8], out: &mut [f32]) {
            $crate::dot::multi_by_rows(n, weight_row, activations, out, $dot);
        }
        multi as $crate::dot::MultiDotFn
    }};
}
pub(crate) use looped;

/// The scalar twin of each kernel.
fn scalar_dot(weight: GgmlType) -> Option<DotFn> {
    use GgmlType::*;
    Some(match weight {
        F32 => float::dot_f32,
        F16 => float::dot_f16,
        BF16 => float::dot_bf16,
        Q4_0 => legacy::dot_q4_0,
        Q4_1 => legacy::dot_q4_1,
        Q5_0 => legacy::dot_q5_0,
        Q5_1 => legacy::dot_q5_1,
        Q8_0 => legacy::dot_q8_0,
        IQ4_NL => legacy::dot_iq4_nl,
        Q2_K => kquants::dot_q2_k,
        Q3_K => kquants::dot_q3_k,
        Q4_K => kquants::dot_q4_k,
        Q5_K => kquants::dot_q5_k,
        Q6_K => kquants::dot_q6_k,
        IQ4_XS => kquants::dot_iq4_xs,
        _ => return None,
    })
}

/// Multi-row twins at the scalar level: one single-row call per activation row.
fn scalar_multi_dot(weight: GgmlType) -> Option<MultiDotFn> {
    use GgmlType::*;
    Some(match weight {
        F32 => looped!(float::dot_f32),
        F16 => looped!(float::dot_f16),
        BF16 => looped!(float::dot_bf16),
        Q4_0 => looped!(legacy::dot_q4_0),
        Q4_1 => looped!(legacy::dot_q4_1),
        Q5_0 => looped!(legacy::dot_q5_0),
        Q5_1 => looped!(legacy::dot_q5_1),
        Q8_0 => looped!(legacy::dot_q8_0),
        IQ4_NL => looped!(legacy::dot_iq4_nl),
        Q2_K => looped!(kquants::dot_q2_k),
        Q3_K => looped!(kquants::dot_q3_k),
        Q4_K => looped!(kquants::dot_q4_k),
        Q5_K => looped!(kquants::dot_q5_k),
        Q6_K => looped!(kquants::dot_q6_k),
        IQ4_XS => looped!(kquants::dot_iq4_xs),
        _ => return None,
    })
}

/// Calls `dot` once per activation row of `activations`.
pub(crate) fn multi_by_rows(
    n: usize,
    weight_row: &[u8],
    activations: &[u8],
    out: &mut [f32],
    dot: DotFn,
) {
    if out.is_empty() {
        return;
    }
    assert!(
        activations.len().is_multiple_of(out.len()),
        "{} activation bytes for {} rows",
        activations.len(),
        out.len()
    );
    let row_bytes = activations.len() / out.len();
    for (value, row) in out.iter_mut().zip(activations.chunks_exact(row_bytes)) {
        *value = dot(n, weight_row, row);
    }
}

/// Checks that `n` elements of `ty` fit in `weight_row` and an activation row of its
/// paired format in `activation_row`; returns the block count.
pub(crate) fn checked_blocks(
    ty: GgmlType,
    n: usize,
    weight_row: &[u8],
    activation_row: &[u8],
) -> usize {
    let block = ty.block_size();
    assert!(
        n.is_multiple_of(block),
        "{n} elements is not a whole number of {ty} blocks"
    );
    let blocks = n / block;
    assert!(
        weight_row.len() >= blocks * ty.type_size(),
        "{ty} weight row of {} bytes is shorter than {n} elements",
        weight_row.len()
    );
    let format = activation_format(ty).expect("checked_blocks is only called for dot types");
    assert!(
        activation_row.len() >= activation_row_bytes(format, n),
        "{format:?} activation row of {} bytes is shorter than {n} elements",
        activation_row.len()
    );
    blocks
}
