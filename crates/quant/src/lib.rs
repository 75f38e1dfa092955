//! ggml block formats: the type table, `#[repr(C)]` block layouts, scalar reference
//! dequantizers and quantizers.
//!
//! ```
//! use runit_quant::GgmlType;
//! assert_eq!(GgmlType::Q4_0.type_size(), 18);
//! assert_eq!(GgmlType::from_name("q4_k"), Some(GgmlType::Q4_K));
//! ```
//!
//! [`dequantize`] and [`quantize`] convert whole tensors (or rows) between f32 and any of
//! F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q8_K,
//! IQ4_NL and IQ4_XS; the per-type row functions live in [`dequant`] and [`quantize`].
//! [`cpu`] says which x86 extensions the SIMD kernels of this and every other crate may use.

mod error;
mod types;

pub use error::QuantError;
pub use types::{GgmlType, ALL_TYPES, QK_K};

pub mod blocks;
pub mod cpu;
pub mod dequant;
pub mod dot;
pub mod quantize;

pub use dequant::{can_dequantize, dequantize};
pub use quantize::{can_quantize, quantize};
