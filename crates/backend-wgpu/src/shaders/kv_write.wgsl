// Writes rows of keys and values ([rows, width] each) into the cells of their caches: unit i
// of a row's writes (`write_unit`) for entry i / units of `pairs` (source row, cell), as the
// host read them from the spans' block tables. K_TYPE and V_TYPE: 0 f32 cells, 1 f16 pairs
// packed in words (the width is even), 2 Q8_0 and 3 Q4_0 blocks in the words
// attention_cache.wgsl reads (rows already rotated by the host's Hadamard pass): a unit is a
// word (f32, f16) or a block (Q8_0, Q4_0). The entry points (kv_write_one.wgsl;
// rope_kv_write.wgsl, which first rotates the keys) declare the bindings `pairs`, `k`, `v`,
// `k_cache` and `v_cache`.

// The source being written: the keys or the values.
var<private> keys: bool;

fn src(i: u32) -> f32 {
    if keys {
        return k[i];
    }
    return v[i];
}

fn store(i: u32, word: u32) {
    if keys {
        k_cache[i] = word;
    } else {
        v_cache[i] = word;
    }
}

// ggml-cpu's x86 Q8_0 activation rounding: d = amax / 127, q = round(x * 127 / amax).
fn write_q8_0(at: u32, dst: u32) {
    var amax = 0.0;
    for (var j = 0u; j < 32u; j++) {
        amax = max(amax, abs(src(at + j)));
    }
    let d = div_rn(amax, 127.0);
    let id = select(0.0, div_rn(127.0, amax), amax != 0.0);
    store(dst, f16_bits_rn(d));
    for (var word = 0u; word < 8u; word++) {
        var packed = 0u;
        for (var b = 0u; b < 4u; b++) {
            let q = i32(round(src(at + word * 4u + b) * id));
            packed |= (bitcast<u32>(q) & 0xffu) << (8u * b);
        }
        store(dst + 1u + word, packed);
    }
}

// ggml's `quantize_row_q4_0_ref`: d = (the value of largest magnitude) / -8,
// q = min(15, trunc(x / d + 8.5)).
fn write_q4_0(at: u32, dst: u32) {
    var amax = 0.0;
    var max_value = 0.0;
    for (var j = 0u; j < 32u; j++) {
        let v = src(at + j);
        if amax < abs(v) {
            amax = abs(v);
            max_value = v;
        }
    }
    let d = div_rn(max_value, -8.0);
    let id = select(0.0, div_rn(1.0, d), d != 0.0);
    store(dst, f16_bits_rn(d));
    for (var word = 0u; word < 4u; word++) {
        var packed = 0u;
        for (var b = 0u; b < 4u; b++) {
            let j = word * 4u + b;
            let q0 = min(15u, u32(src(at + j) * id + 8.5));
            let q1 = min(15u, u32(src(at + j + 16u) * id + 8.5));
            packed |= (q0 | (q1 << 4u)) << (8u * b);
        }
        store(dst + 1u + word, packed);
    }
}

// Units of a row of `width` values in a cache of type `ty`.
fn row_units(ty: u32, width: u32) -> u32 {
    if ty == 0u {
        return width;
    }
    if ty == 1u {
        return width / 2u;
    }
    return width / 32u;
}

// Unit i of the rows being written (`keys`) into their cache of type `ty`, rows of `width`.
fn write_unit(i: u32, ty: u32, width: u32) {
    if ty == 0u {
        let entry = i / width;
        let j = i % width;
        store(pairs[2u * entry + 1u] * width + j, bitcast<u32>(src(pairs[2u * entry] * width + j)));
    } else if ty == 1u {
        let row_words = width / 2u;
        let entry = i / row_words;
        let j = i % row_words;
        let at = pairs[2u * entry] * width + 2u * j;
        store(pairs[2u * entry + 1u] * row_words + j, pack_f16_rn(src(at), src(at + 1u)));
    } else {
        let blocks = width / 32u;
        let entry = i / blocks;
        let block = i % blocks;
        let at = pairs[2u * entry] * width + block * 32u;
        let words = select(5u, 9u, ty == 2u);
        let dst = (pairs[2u * entry + 1u] * blocks + block) * words;
        if ty == 2u {
            write_q8_0(at, dst);
        } else {
            write_q4_0(at, dst);
        }
    }
}
