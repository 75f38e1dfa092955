//! Walsh-Hadamard transforms of KV cache heads.
//!
//! llama.cpp rotates the heads of a quantized (Q8_0, Q4_0) cache before quantizing them
//! (`attn_rot_k`, `attn_rot_v`, its PR 21038): queries and keys by the orthonormal
//! Walsh-Hadamard matrix of the largest power of two from 64 that divides the head
//! dimension, values by that of 64, and the attention's output back by the latter (the
//! matrix is its own inverse), when the head dimension is a multiple of 64. Outliers are
//! spread over the chunk, so the blocks' scales fit better. Scores are unchanged (the
//! rotation is orthogonal) up to rounding. ggml-cpu computes the product as a fast
//! transform (`ggml_compute_forward_fwht`): each chunk scaled by `1 / sqrt(n)`, then
//! butterflies of growing span; [`rotate_chunks`] is that arithmetic.

use crate::{KvRole, KvType};

/// The chunk length of llama.cpp's rotation of a `ty` cache of `role` with heads of
/// `head_dim`, or `None` when it does not rotate.
pub fn llama_rotation(ty: KvType, role: KvRole, head_dim: usize) -> Option<usize> {
    if !matches!(ty, KvType::Q8_0 | KvType::Q4_0) || !head_dim.is_multiple_of(64) {
        return None;
    }
    Some(match role {
        KvRole::Keys => {
            let mut n = 64;
            while head_dim.is_multiple_of(2 * n) {
                n *= 2;
            }
            n
        }
        KvRole::Values => 64,
    })
}

/// In-place unnormalized Walsh-Hadamard transform of `x` (a power-of-two length):
/// butterflies `(a + b, a - b)` of span 1, 2, 4, ... (Sylvester's order; `H H = n I`).
pub fn walsh_hadamard(x: &mut [f32]) {
    let n = x.len();
    debug_assert!(n.is_power_of_two());
    let mut span = 1;
    while span < n {
        for start in (0..n).step_by(2 * span) {
            for i in start..start + span {
                let (a, b) = (x[i], x[i + span]);
                x[i] = a + b;
                x[i + span] = a - b;
            }
        }
        span *= 2;
    }
}

/// Multiplies each chunk of `n` values of `x` by the orthonormal Walsh-Hadamard matrix, as
/// ggml-cpu does: scaled by `1 / sqrt(n)` (in f32), then [`walsh_hadamard`].
pub fn rotate_chunks(x: &mut [f32], n: usize) {
    let scale = 1.0 / (n as f32).sqrt();
    for chunk in x.chunks_exact_mut(n) {
        chunk.iter_mut().for_each(|v| *v *= scale);
        walsh_hadamard(chunk);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rotation_lengths_follow_llama_cpp() {
        let keys = |ty, d| llama_rotation(ty, KvRole::Keys, d);
        assert_eq!(keys(KvType::Q8_0, 64), Some(64));
        assert_eq!(keys(KvType::Q4_0, 128), Some(128));
        assert_eq!(keys(KvType::Q4_0, 192), Some(64));
        assert_eq!(keys(KvType::Q4_0, 96), None);
        assert_eq!(keys(KvType::F16, 128), None);
        assert_eq!(llama_rotation(KvType::Q8_0, KvRole::Values, 256), Some(64));
    }

    #[test]
    fn the_orthonormal_transform_is_its_own_inverse() {
        let x: Vec<f32> = (0..128).map(|i| (i as f32 * 0.37).sin()).collect();
        let mut y = x.clone();
        rotate_chunks(&mut y, 64);
        rotate_chunks(&mut y, 64);
        for (a, b) in x.iter().zip(&y) {
            assert!((a - b).abs() < 1e-5);
        }
        let mut e = vec![0.0f32; 4];
        e[1] = 1.0;
        walsh_hadamard(&mut e);
        assert_eq!(e, [1.0, -1.0, 1.0, -1.0]);
    }
}
