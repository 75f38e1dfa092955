// Weight-side helpers the matrix-vector kernels share (matvec_dot.wgsl on f32 activations,
// matvec_int8.wgsl on int8 ones): words of 2-byte-aligned blocks, the K-quants' scales.

// The low four bits of `v`, bit k moved to bit 8k (to the low bit of byte k).
fn spread_bits(v: u32) -> u32 {
    return (v & 1u) | ((v & 2u) << 7u) | ((v & 4u) << 14u) | ((v & 8u) << 21u);
}

// The 8 bytes at an even `offset` as two words (three words read, as `word_at` reads two;
// the weight's spare word covers the third).
fn words2_at(offset: u32) -> vec2<u32> {
    let i = offset >> 2u;
    let a = weight_word(i);
    let b = weight_word(i + 1u);
    let c = weight_word(i + 2u);
    let shifted = vec2<u32>((a >> 16u) | (b << 16u), (b >> 16u) | (c << 16u));
    return select(vec2<u32>(a, b), shifted, (offset & 2u) != 0u);
}

// Byte k of 12 bytes held in three words.
fn byte_of(words: vec3<u32>, k: u32) -> u32 {
    return (words[k >> 2u] >> ((k & 3u) * 8u)) & 0xffu;
}

// K-quants' scale and min of sub-block j from the block's 12 scale bytes.
fn scale_min_k4_of(j: u32, scales: vec3<u32>) -> vec2<f32> {
    return scale_min_k4_bytes(j, byte_of(scales, j & 3u), byte_of(scales, j), byte_of(scales, j + 4u));
}

// Sub-blocks 2c and 2c + 1 of a K-quant block (header `head`: d, dmin and the scale bytes)
// given the dot products of their integer values with the activations.
fn k4_pair(head: vec4<u32>, c: u32, sums: vec2<f32>, xsums: vec2<f32>) -> f32 {
    let dm = unpack2x16float(head.x);
    let lo = scale_min_k4_of(2u * c, head.yzw);
    let hi = scale_min_k4_of(2u * c + 1u, head.yzw);
    return dm.x * (lo.x * sums.x + hi.x * sums.y) - dm.y * (lo.y * xsums.x + hi.y * xsums.y);
}

// A Q6_K piece's weights (matvec_dot.wgsl's pieces: 8 consecutive l of half h = l / 4 from
// m = l % 4, 32 values), as the 8-byte runs its dot product takes: the low bytes of sets 0
// and 2 (`low0`, at 64h + 8m) and of sets 1 and 3 (`low1`, 32 bytes on), the high pairs
// (at 128 + 32h + 8m), the half's 8 scales (at 192 + 8h), and d (at 208).
struct Q6kWeights {
    low0: vec2<u32>,
    low1: vec2<u32>,
    high: vec2<u32>,
    scales: vec2<u32>,
    d: f32,
}

// Piece l's weights of the Q6_K block at byte `b` of the weight, read where they lie.
fn q6_k_weights(b: u32, l: u32) -> Q6kWeights {
    let h = l >> 2u;
    let m = l & 3u;
    return Q6kWeights(
        words2_at(b + 64u * h + 8u * m),
        words2_at(b + 64u * h + 32u + 8u * m),
        words2_at(b + 128u + 32u * h + 8u * m),
        words2_at(b + 192u + 8u * h),
        half_at(b + 208u),
    );
}
