// Byte access to packed ggml blocks held in a weight chunk (little endian), read a word at a
// time by `weight_word` (weight_one.wgsl: the kernel's `w`; matvec_parts: the part's weight).
// Blocks are not 4-byte aligned (Q4_0's are 18 bytes), so every field is read byte by byte.

fn byte_at(offset: u32) -> u32 {
    return (weight_word(offset >> 2u) >> ((offset & 3u) * 8u)) & 0xffu;
}

fn u16_at(offset: u32) -> u32 {
    return byte_at(offset) | (byte_at(offset + 1u) << 8u);
}

fn f16_at(offset: u32) -> f32 {
    return unpack2x16float(u16_at(offset)).x;
}

fn u32_at(offset: u32) -> u32 {
    return u16_at(offset) | (u16_at(offset + 2u) << 16u);
}

// A byte read as ggml's int8_t.
fn i8_at(offset: u32) -> f32 {
    return f32(bitcast<i32>(byte_at(offset) << 24u) >> 24u);
}

// K-quants' 6-bit scale and min of sub-block `j` (ggml's `get_scale_min_k4`), from the 12
// bytes at `scales`.
fn scale_min_k4(j: u32, scales: u32) -> vec2<f32> {
    let below = byte_at(scales + (j & 3u));
    return scale_min_k4_bytes(j, below, byte_at(scales + j), byte_at(scales + j + 4u));
}

// `get_scale_min_k4` of sub-block `j` from the bytes it reads of the 12: `at` (byte j),
// `above` (byte j + 4) and, for j >= 4, `below` (byte j - 4).
fn scale_min_k4_bytes(j: u32, below: u32, at: u32, above: u32) -> vec2<f32> {
    let low = vec2<u32>(at & 63u, above & 63u);
    let high = vec2<u32>((above & 0xfu) | ((below >> 6u) << 4u), (above >> 4u) | ((at >> 6u) << 4u));
    return vec2<f32>(select(high, low, j < 4u));
}

// The 4 bytes at an even `offset` as one word (blocks of 18, 22, 34 or 210 bytes start on
// 2-byte boundaries). Both words are read and one result selected, so that lanes on blocks
// of either alignment take the same path; weight buffers carry a spare word at their end
// for the second read of a last aligned word (device.rs).
fn word_at(offset: u32) -> u32 {
    let i = offset >> 2u;
    let lo = weight_word(i);
    let hi = weight_word(i + 1u);
    return select(lo, (lo >> 16u) | (hi << 16u), (offset & 2u) != 0u);
}

// The f16 at an even `offset`.
fn half_at(offset: u32) -> f32 {
    return unpack2x16float(weight_word(offset >> 2u) >> ((offset & 2u) * 8u)).x;
}
