//! The non-matmul ops: embedding lookup, norms, RoPE, element-wise ops, the KV cache writes,
//! attention, the mixture-of-experts FFN and its row gather/scatter, greedy picks and sampling
//! from logits, the fused ops that combine some of them, and TurboQuant's cache writes and
//! attention.

pub mod attention;
pub mod elementwise;
pub mod embedding;
pub mod fused;
pub mod kv;
pub mod moe;
pub mod norm;
pub mod pick;
pub mod rope;
pub mod rows;
pub mod sample;
pub mod turbo;
