// `dot_TYPE(row, u, xi)`: the dot product of unit `u` (32 values) of the row whose first
// byte is `row` with x[xi .. xi + 32], reading the packed block a word at a time. Each
// computes the values of `value_TYPE` (dequant.wgsl), factoring the block's scales out of
// the sums.

// x[i .. i + 4] (i a multiple of 4).
fn x4(i: u32) -> vec4<f32> {
    return x[i >> 2u];
}

// The four bytes of `v`, lowest first, each shifted right by `shift` and masked.
fn bytes4(v: u32, shift: u32, mask: u32) -> vec4<f32> {
    return vec4<f32>((vec4<u32>(v) >> (vec4<u32>(0u, 8u, 16u, 24u) + shift)) & vec4<u32>(mask));
}

// The four bytes of `v` as ggml's int8_t, lowest first.
fn signed4(v: u32) -> vec4<f32> {
    let shifted = vec4<u32>(v << 24u, v << 16u, v << 8u, v);
    return vec4<f32>(bitcast<vec4<i32>>(shifted) >> vec4<u32>(24u));
}

// Four bits of `v` from bit `first`, lowest first, as 0.0 or 1.0.
fn bits4(v: u32, first: u32) -> vec4<f32> {
    return vec4<f32>((vec4<u32>(v >> first) >> vec4<u32>(0u, 1u, 2u, 3u)) & vec4<u32>(1u));
}

fn dot_f32(row: u32, u: u32, xi: u32) -> f32 {
    let i = (row >> 2u) + u * 32u;
    var sum = 0.0;
    for (var k = 0u; k < 8u; k++) {
        let v = vec4<u32>(weight_word(i + 4u * k), weight_word(i + 4u * k + 1u), weight_word(i + 4u * k + 2u), weight_word(i + 4u * k + 3u));
        sum += dot(bitcast<vec4<f32>>(v), x4(xi + 4u * k));
    }
    return sum;
}

fn dot_f16(row: u32, u: u32, xi: u32) -> f32 {
    let i = (row >> 2u) + u * 16u;
    var sum = 0.0;
    for (var k = 0u; k < 8u; k++) {
        let a = unpack2x16float(weight_word(i + 2u * k));
        let b = unpack2x16float(weight_word(i + 2u * k + 1u));
        sum += dot(vec4<f32>(a, b), x4(xi + 4u * k));
    }
    return sum;
}

fn dot_bf16(row: u32, u: u32, xi: u32) -> f32 {
    let i = (row >> 2u) + u * 16u;
    var sum = 0.0;
    for (var k = 0u; k < 8u; k++) {
        let a = weight_word(i + 2u * k);
        let b = weight_word(i + 2u * k + 1u);
        let v = vec4<u32>(a << 16u, a & 0xffff0000u, b << 16u, b & 0xffff0000u);
        sum += dot(bitcast<vec4<f32>>(v), x4(xi + 4u * k));
    }
    return sum;
}

// Q4_0 (18 bytes): f16 d, 16 bytes whose low nibbles are values 0..16, high ones 16..32.
fn dot_q4_0(row: u32, u: u32, xi: u32) -> f32 {
    let b = row + u * 18u;
    var sum = 0.0;
    for (var k = 0u; k < 4u; k++) {
        let q = word_at(b + 2u + 4u * k);
        sum += dot(bytes4(q, 0u, 15u) - 8.0, x4(xi + 4u * k));
        sum += dot(bytes4(q, 4u, 15u) - 8.0, x4(xi + 16u + 4u * k));
    }
    return half_at(b) * sum;
}

// Q4_1 (20 bytes): f16 d, f16 m, 16 bytes of nibbles; value q · d + m.
fn dot_q4_1(row: u32, u: u32, xi: u32) -> f32 {
    let b = row + u * 20u;
    var sum = 0.0;
    var xs = 0.0;
    for (var k = 0u; k < 4u; k++) {
        let q = word_at(b + 4u + 4u * k);
        let lo = x4(xi + 4u * k);
        let hi = x4(xi + 16u + 4u * k);
        sum += dot(bytes4(q, 0u, 15u), lo) + dot(bytes4(q, 4u, 15u), hi);
        xs += dot(lo + hi, vec4<f32>(1.0));
    }
    return half_at(b) * sum + half_at(b + 2u) * xs;
}

// Q5_0 (22 bytes): f16 d, 32 fifth bits (bit j for value j), 16 bytes of nibbles.
fn dot_q5_0(row: u32, u: u32, xi: u32) -> f32 {
    let b = row + u * 22u;
    let high = word_at(b + 2u);
    var sum = 0.0;
    for (var k = 0u; k < 4u; k++) {
        let q = word_at(b + 6u + 4u * k);
        let lo = bytes4(q, 0u, 15u) + 16.0 * bits4(high, 4u * k) - 16.0;
        let hi = bytes4(q, 4u, 15u) + 16.0 * bits4(high, 16u + 4u * k) - 16.0;
        sum += dot(lo, x4(xi + 4u * k)) + dot(hi, x4(xi + 16u + 4u * k));
    }
    return half_at(b) * sum;
}

// Q8_0 (34 bytes): f16 d, 32 signed bytes.
fn dot_q8_0(row: u32, u: u32, xi: u32) -> f32 {
    let b = row + u * 34u;
    var sum = 0.0;
    for (var k = 0u; k < 8u; k++) {
        sum += dot(signed4(word_at(b + 2u + 4u * k)), x4(xi + 4u * k));
    }
    return half_at(b) * sum;
}

// Q4_K (144 bytes): f16 d, f16 dmin, 12 bytes of 6-bit scales and mins, 128 bytes of nibbles;
// unit j of a block is the low (j even) or high nibbles of bytes 32 · (j / 2) ..
fn dot_q4_k(row: u32, u: u32, xi: u32) -> f32 {
    let b = row + (u >> 3u) * 144u;
    let j = u & 7u;
    let shift = (j & 1u) * 4u;
    let q0 = (b + 16u + (j >> 1u) * 32u) >> 2u;
    var sum = 0.0;
    var xs = 0.0;
    for (var k = 0u; k < 8u; k++) {
        let v = x4(xi + 4u * k);
        sum += dot(bytes4(weight_word(q0 + k), shift, 15u), v);
        xs += dot(v, vec4<f32>(1.0));
    }
    let dm = unpack2x16float(weight_word(b >> 2u));
    let sm = scale_min_k4(j, b + 4u);
    return dm.x * sm.x * sum - dm.y * sm.y * xs;
}

// Q5_K (176 bytes): as Q4_K with 32 bytes of fifth bits (bit j of byte l for value l of
// unit j) before the nibbles.
fn dot_q5_k(row: u32, u: u32, xi: u32) -> f32 {
    let b = row + (u >> 3u) * 176u;
    let j = u & 7u;
    let shift = (j & 1u) * 4u;
    let q0 = (b + 48u + (j >> 1u) * 32u) >> 2u;
    let h0 = (b + 16u) >> 2u;
    var sum = 0.0;
    var xs = 0.0;
    for (var k = 0u; k < 8u; k++) {
        let v = x4(xi + 4u * k);
        let q = bytes4(weight_word(q0 + k), shift, 15u) + 16.0 * bytes4(weight_word(h0 + k), j, 1u);
        sum += dot(q, v);
        xs += dot(v, vec4<f32>(1.0));
    }
    let dm = unpack2x16float(weight_word(b >> 2u));
    let sm = scale_min_k4(j, b + 4u);
    return dm.x * sm.x * sum - dm.y * sm.y * xs;
}

// Q6_K (210 bytes): 128 bytes of low nibbles, 64 of high pairs, 16 signed scales, f16 d;
// unit j is quarter j % 4 of half j / 4, with one scale per 16 values.
fn dot_q6_k(row: u32, u: u32, xi: u32) -> f32 {
    let b = row + (u >> 3u) * 210u;
    let j = u & 7u;
    let half = j >> 2u;
    let quarter = j & 3u;
    let low = b + half * 64u + (quarter & 1u) * 32u;
    let high = b + 128u + half * 32u;
    let low_shift = (quarter >> 1u) * 4u;
    var sums = vec2<f32>(0.0);
    for (var k = 0u; k < 8u; k++) {
        let q = bytes4(word_at(low + 4u * k), low_shift, 15u)
            + 16.0 * bytes4(word_at(high + 4u * k), quarter * 2u, 3u) - 32.0;
        sums[k >> 2u] += dot(q, x4(xi + 4u * k));
    }
    let scales = b + 192u + half * 8u + quarter * 2u;
    return half_at(b + 208u) * (i8_at(scales) * sums.x + i8_at(scales + 1u) * sums.y);
}
