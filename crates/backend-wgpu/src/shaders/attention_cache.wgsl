// Reading the K and V caches by value index (`cell * width + i`) for each cache element type
// (K_TYPE, V_TYPE): 0 f32 (a word a value), 1 f16 (two a word), 2 ggml's Q8_0 and 3 its Q4_0
// (32 values a block in this backend's words: the f16 scale in a word of its own, then the
// block's bytes in ggml's order: 8 words of int8 for Q8_0, 4 words of nibble pairs for Q4_0).

fn decode(ty: u32, index: u32, is_key: bool) -> f32 {
    if ty == 0u {
        return bitcast<f32>(cache_word(index, is_key));
    }
    if ty == 1u {
        return unpack2x16float(cache_word(index >> 1u, is_key))[index & 1u];
    }
    let block = index >> 5u;
    let j = index & 31u;
    if ty == 2u {
        let base = block * 9u;
        let d = unpack2x16float(cache_word(base, is_key)).x;
        let q = bitcast<i32>(cache_word(base + 1u + (j >> 2u), is_key) << (24u - 8u * (j & 3u))) >> 24u;
        return d * f32(q);
    }
    let base = block * 5u;
    let d = unpack2x16float(cache_word(base, is_key)).x;
    let byte = j & 15u;
    let pair = cache_word(base + 1u + (byte >> 2u), is_key) >> (8u * (byte & 3u));
    return d * (f32((pair >> (4u * (j >> 4u))) & 0xfu) - 8.0);
}

fn cache_word(at: u32, is_key: bool) -> u32 {
    if is_key {
        return k_cache[at];
    }
    return v_cache[at];
}

fn cache_value(index: u32, is_key: bool) -> f32 {
    if is_key {
        return decode(K_TYPE, index, true);
    }
    return decode(V_TYPE, index, false);
}
