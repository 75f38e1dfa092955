//! ggml block formats: the type table, `#[repr(C)]` block layouts, scalar reference
//! dequantizers and quantizers.
//!
//! ```
//! use runit_quant::GgmlType;
//! assert_eq!(GgmlType::Q4_0.type_size(), 18);
//! assert_eq!(GgmlType::from_name("q4_k"), Some(GgmlType::Q4_K));
//! ```

mod types;

pub use types::{GgmlType, ALL_TYPES, QK_K};

pub mod blocks;
