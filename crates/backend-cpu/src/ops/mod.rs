//! The CPU implementations of the backend ops, one file per op family (same stems as the
//! other backends' `ops/`).

pub mod attention;
pub mod elementwise;
pub mod embedding;
pub mod kv_write;
pub mod linear;
pub mod norm;
pub mod rope;
pub mod rows;
