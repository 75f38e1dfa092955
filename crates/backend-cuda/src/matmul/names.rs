//! The kernel functions of each weight type: decode matvec, f16 dequantization for the
//! GEMM path, and embedding lookup.

use runit_quant::GgmlType;

/// Matvec variants by token bound: `_t1`, `_t2`, `_t4`, `_t8`.
pub type ByTokens = [&'static str; 4];

/// The expert-indexed twins (`_id`, for mixture-of-experts FFNs) of a one-token matvec
/// kernel and of its SwiGLU kernel.
#[derive(Debug, Clone, Copy)]
pub struct ById {
    pub plain: &'static str,
    pub swiglu: &'static str,
}

/// The 16-byte-load matvec variants of a float type.
pub struct VectorKernels {
    pub single: ByTokens,
    pub unrolled: ByTokens,
    pub warp: ByTokens,
    /// The SwiGLU twins of `single`, `unrolled` and `warp` (gate and up weights).
    pub single_swiglu: ByTokens,
    pub unrolled_swiglu: ByTokens,
    pub warp_swiglu: ByTokens,
    /// The expert twins of `single`, `unrolled` and `warp` (the warp kernels take rows per
    /// warp as their last parameter).
    pub single_id: ById,
    pub unrolled_id: ById,
    pub warp_id: ById,
}

/// The kernels of one weight type.
pub struct TypeKernels {
    /// Source file of the matvec kernels.
    pub matvec_file: &'static str,
    /// Matvec kernels; quantized types take q8_1 activations, float types f32.
    pub matvec: ByTokens,
    /// The SwiGLU twins of `matvec`: `silu(gate · x) * (up · x)` from two weights.
    pub matvec_swiglu: ByTokens,
    /// Quantized types: Q, K and V of one input in one launch (`matvec_<type>_qkv_t<T>`).
    pub matvec_qkv: Option<ByTokens>,
    /// Quantized types with a long-row variant (`_w`, fewer and wider parts per block):
    /// its plain, SwiGLU and QKV kernels, for rows of at least [`WIDE_MIN_ROW`] elements.
    pub matvec_wide: Option<(ByTokens, ByTokens, ByTokens)>,
    /// The expert twins of `matvec[0]` and `matvec_swiglu[0]`.
    pub matvec_id: ById,
    /// The expert twins of the long-row variant's one-token kernels.
    pub matvec_wide_id: Option<ById>,
    /// Float types only: the 16-byte-load variants (row length % 8 == 0, aligned weight),
    /// one block per row: one load per thread and step (`_vec`), four (`_vec4`), and the
    /// warp-per-row kernels (`_vec_warp`, one more parameter: rows per warp).
    pub matvec_vector: Option<VectorKernels>,
    /// `mmq.cu` batched kernel with f16 tensor cores (`mmq_<type>_n2`: tiles of 16 token
    /// rows).
    pub mmq: Option<&'static str>,
    /// Quantized types: `mmq8.cu`'s int8 batched kernels (`mmq8_<type>_n<NT>`: tiles of 16, 32
    /// and 64 token rows).
    pub mmq8: Option<[&'static str; 3]>,
    /// Quantized types: `mmqp.cu`'s pipelined f16 tensor-core kernels (`mmqp_<type>_n<NT>`:
    /// tiles of 16, 32 and 64 token rows).
    pub mmqp: Option<[&'static str; 3]>,
    /// Quantized types: the pipelined kernel with tiles of 8 token rows (`mmqp_<type>_n1`, for
    /// 2-8 rows: matmul/mmq.rs `tile8_enabled`).
    pub mmqp_tile8: Option<&'static str>,
    /// `convert.cu` kernel dequantizing rows to f16 (none for F32 and F16, used directly).
    pub dequant_f16: Option<&'static str>,
    /// `embedding.cu` kernel.
    pub embedding: &'static str,
}

macro_rules! by_tile {
    ($name:literal) => {
        Some(concat!("mmq_", $name, "_n2"))
    };
}

/// The 16-, 32- and 64-token-tile kernels `<prefix><type>_n2`, `_n4`, `_n8`.
macro_rules! by_tiles {
    ($prefix:literal, $name:literal) => {
        Some([
            concat!($prefix, $name, "_n2"),
            concat!($prefix, $name, "_n4"),
            concat!($prefix, $name, "_n8"),
        ])
    };
}

macro_rules! by_tokens {
    ($($piece:literal),+) => {
        [
            concat!($($piece,)+ "_t1"),
            concat!($($piece,)+ "_t2"),
            concat!($($piece,)+ "_t4"),
            concat!($($piece,)+ "_t8"),
        ]
    };
}

/// `matvec_<name><variant>_id` and `matvec_<name>_swiglu<variant>_id`.
macro_rules! by_id {
    ($name:literal, $variant:literal) => {
        ById {
            plain: concat!("matvec_", $name, $variant, "_id"),
            swiglu: concat!("matvec_", $name, "_swiglu", $variant, "_id"),
        }
    };
}

macro_rules! quantized {
    ($file:literal, $name:literal) => {
        TypeKernels {
            matvec_file: $file,
            matvec: by_tokens!("matvec_", $name),
            matvec_swiglu: by_tokens!("matvec_", $name, "_swiglu"),
            matvec_qkv: Some(by_tokens!("matvec_", $name, "_qkv")),
            matvec_wide: None,
            matvec_id: by_id!($name, ""),
            matvec_wide_id: None,
            matvec_vector: None,
            mmq: by_tile!($name),
            mmq8: by_tiles!("mmq8_", $name),
            mmqp: by_tiles!("mmqp_", $name),
            mmqp_tile8: Some(concat!("mmqp_", $name, "_n1")),
            dequant_f16: Some(concat!("dequant_f16_", $name)),
            embedding: concat!("embedding_", $name),
        }
    };
}

macro_rules! float {
    ($name:literal, $dequant:expr) => {
        TypeKernels {
            matvec_file: "matvec_float.cu",
            matvec: by_tokens!("matvec_", $name),
            matvec_swiglu: by_tokens!("matvec_", $name, "_swiglu"),
            matvec_qkv: None,
            matvec_wide: None,
            matvec_id: by_id!($name, ""),
            matvec_wide_id: None,
            matvec_vector: Some(VectorKernels {
                single: by_tokens!("matvec_", $name, "_vec"),
                unrolled: by_tokens!("matvec_", $name, "_vec4"),
                warp: by_tokens!("matvec_", $name, "_vec_warp"),
                single_swiglu: by_tokens!("matvec_", $name, "_swiglu_vec"),
                unrolled_swiglu: by_tokens!("matvec_", $name, "_swiglu_vec4"),
                warp_swiglu: by_tokens!("matvec_", $name, "_swiglu_vec_warp"),
                single_id: by_id!($name, "_vec"),
                unrolled_id: by_id!($name, "_vec4"),
                warp_id: by_id!($name, "_vec_warp"),
            }),
            mmq: by_tile!($name),
            mmq8: None,
            mmqp: None,
            mmqp_tile8: None,
            dequant_f16: $dequant,
            embedding: concat!("embedding_", $name),
        }
    };
}

/// Shortest row (elements) that takes a type's long-row matvec variant.
pub const WIDE_MIN_ROW: usize = 2048;

/// The kernels of `ty`, or `None` when the type has none.
pub fn kernels(ty: GgmlType) -> Option<TypeKernels> {
    use GgmlType::*;
    Some(match ty {
        F32 => float!("f32", None),
        F16 => float!("f16", None),
        BF16 => float!("bf16", Some("dequant_f16_bf16")),
        Q4_0 => quantized!("matvec_legacy.cu", "q4_0"),
        Q4_1 => quantized!("matvec_legacy.cu", "q4_1"),
        Q5_0 => quantized!("matvec_legacy.cu", "q5_0"),
        Q5_1 => quantized!("matvec_legacy.cu", "q5_1"),
        Q8_0 => TypeKernels {
            matvec_wide: Some((
                by_tokens!("matvec_q8_0w"),
                by_tokens!("matvec_q8_0w_swiglu"),
                by_tokens!("matvec_q8_0w_qkv"),
            )),
            matvec_wide_id: Some(by_id!("q8_0w", "")),
            ..quantized!("matvec_legacy.cu", "q8_0")
        },
        IQ4_NL => quantized!("matvec_legacy.cu", "iq4_nl"),
        Q2_K => quantized!("matvec_kquants.cu", "q2_k"),
        Q3_K => quantized!("matvec_kquants.cu", "q3_k"),
        Q4_K => quantized!("matvec_kquants.cu", "q4_k"),
        Q5_K => quantized!("matvec_kquants.cu", "q5_k"),
        Q6_K => quantized!("matvec_kquants.cu", "q6_k"),
        IQ4_XS => quantized!("matvec_kquants.cu", "iq4_xs"),
        _ => return None,
    })
}

/// The variant index for `tokens` (1..=8): the smallest bound that holds them.
pub fn token_variant(tokens: usize) -> usize {
    match tokens {
        0 | 1 => 0,
        2 => 1,
        3 | 4 => 2,
        _ => 3,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::SOURCES;

    /// Every named kernel is made by an entry macro of the source it is looked up in
    /// (`MATVEC_ENTRIES(MvQ4_0, q4_0)` defines `matvec_q4_0_t1` .. `_t8`, and so on).
    #[test]
    fn every_kernel_name_exists_in_its_source() {
        let text = |file: &str| {
            SOURCES
                .iter()
                .find(|s| s.file == file)
                .unwrap_or_else(|| panic!("{file} is not in SOURCES"))
                .text
        };
        for ty in runit_quant::dot::WEIGHT_TYPES {
            let k = kernels(ty).unwrap_or_else(|| panic!("{ty} has no kernels"));
            let stem = k
                .embedding
                .strip_prefix("embedding_")
                .expect("embedding_ prefix");
            let entry = |file: &str, mac: &str| {
                let source = text(file);
                assert!(
                    source
                        .lines()
                        .any(|l| l.starts_with(mac) && l.ends_with(&format!(", {stem})"))),
                    "{mac}(.., {stem}) missing in {file}"
                );
            };
            let macro_name = if k.matvec_vector.is_none() {
                "MATVEC_ENTRIES("
            } else {
                "FLOAT_ENTRIES("
            };
            entry(k.matvec_file, macro_name);
            for (bound, name) in [1, 2, 4, 8].iter().zip(k.matvec) {
                assert_eq!(name, format!("matvec_{stem}_t{bound}"));
            }
            for (bound, name) in [1, 2, 4, 8].iter().zip(k.matvec_swiglu) {
                assert_eq!(name, format!("matvec_{stem}_swiglu_t{bound}"));
            }
            let expert_twins = |names: ById, variant: &str, wide: &str| {
                assert_eq!(names.plain, format!("matvec_{stem}{wide}{variant}_id"));
                assert_eq!(
                    names.swiglu,
                    format!("matvec_{stem}{wide}_swiglu{variant}_id")
                );
            };
            expert_twins(k.matvec_id, "", "");
            if let Some(names) = k.matvec_wide_id {
                expert_twins(names, "", "w");
            }
            assert_eq!(k.matvec_wide.is_some(), k.matvec_wide_id.is_some());
            if let Some(vector) = &k.matvec_vector {
                for (suffix, names) in [
                    ("_vec", vector.single),
                    ("_vec4", vector.unrolled),
                    ("_vec_warp", vector.warp),
                    ("_swiglu_vec", vector.single_swiglu),
                    ("_swiglu_vec4", vector.unrolled_swiglu),
                    ("_swiglu_vec_warp", vector.warp_swiglu),
                ] {
                    for (bound, name) in [1, 2, 4, 8].iter().zip(names) {
                        assert_eq!(name, format!("matvec_{stem}{suffix}_t{bound}"));
                    }
                }
                expert_twins(vector.single_id, "_vec", "");
                expert_twins(vector.unrolled_id, "_vec4", "");
                expert_twins(vector.warp_id, "_vec_warp", "");
            }
            if let Some(qkv) = &k.matvec_qkv {
                for (bound, name) in [1, 2, 4, 8].iter().zip(qkv) {
                    assert_eq!(*name, format!("matvec_{stem}_qkv_t{bound}"));
                }
            }
            if let Some((plain, swiglu, qkv)) = &k.matvec_wide {
                for (bound, name) in [1, 2, 4, 8].iter().zip(qkv) {
                    assert_eq!(*name, format!("matvec_{stem}w_qkv_t{bound}"));
                }
                let wide = format!("{stem}w");
                assert!(
                    text(k.matvec_file)
                        .lines()
                        .any(|l| l.starts_with("MATVEC_ENTRIES(")
                            && l.ends_with(&format!(", {wide})"))),
                    "MATVEC_ENTRIES(.., {wide}) missing in {}",
                    k.matvec_file
                );
                for (bound, (name, swiglu)) in [1, 2, 4, 8].iter().zip(plain.iter().zip(swiglu)) {
                    assert_eq!(*name, format!("matvec_{wide}_t{bound}"));
                    assert_eq!(*swiglu, format!("matvec_{wide}_swiglu_t{bound}"));
                }
            }
            if let Some(name) = k.dequant_f16 {
                assert_eq!(name, format!("dequant_f16_{stem}"));
                entry("convert.cu", "DEQUANT_F16(");
            }
            entry("embedding.cu", "EMBEDDING(");
            if let Some(name) = k.mmq {
                entry("mmq.cu", "MMQ_ENTRIES(");
                assert_eq!(name, format!("mmq_{stem}_n2"));
            }
            for (names, file, prefix) in [(k.mmq8, "mmq8.cu", "mmq8"), (k.mmqp, "mmqp.cu", "mmqp")]
            {
                let Some(names) = names else { continue };
                entry(file, &format!("{}_ENTRIES(", prefix.to_uppercase()));
                for (nt, name) in [2, 4, 8].iter().zip(names) {
                    assert_eq!(name, format!("{prefix}_{stem}_n{nt}"));
                }
            }
        }
    }

    #[test]
    fn token_variants_hold_their_tokens() {
        let bounds = [1, 2, 4, 8];
        for tokens in 1..=8 {
            assert!(bounds[token_variant(tokens)] >= tokens);
        }
        assert_eq!(token_variant(3), 2);
    }
}
