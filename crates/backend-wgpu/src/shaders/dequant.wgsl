// One value of a packed ggml block: `value_TYPE(base, i)` is element `i` of the block whose
// first byte is `base`, as ggml's `dequantize_row_TYPE` computes it. `BLOCK_VALUES` and
// `BLOCK_BYTES` are prepended per type by the host (src/kernels.rs).

fn value_f32(base: u32, i: u32) -> f32 {
    return bitcast<f32>(weight_word(base >> 2u));
}

fn value_f16(base: u32, i: u32) -> f32 {
    return f16_at(base);
}

fn value_bf16(base: u32, i: u32) -> f32 {
    return bitcast<f32>(u16_at(base) << 16u);
}

// Q4_0: f16 d, 16 bytes of nibbles (low nibbles are values 0..16, high ones 16..32).
fn value_q4_0(base: u32, i: u32) -> f32 {
    let q = byte_at(base + 2u + (i & 15u)) >> ((i >> 4u) * 4u);
    return f16_at(base) * (f32(q & 0xfu) - 8.0);
}

// Q4_1: f16 d, f16 m, 16 bytes of nibbles.
fn value_q4_1(base: u32, i: u32) -> f32 {
    let q = byte_at(base + 4u + (i & 15u)) >> ((i >> 4u) * 4u);
    return f32(q & 0xfu) * f16_at(base) + f16_at(base + 2u);
}

// Q5_0: f16 d, 32 high bits, 16 bytes of nibbles.
fn value_q5_0(base: u32, i: u32) -> f32 {
    let low = (byte_at(base + 6u + (i & 15u)) >> ((i >> 4u) * 4u)) & 0xfu;
    let high = (u32_at(base + 2u) >> i) & 1u;
    return f16_at(base) * (f32(low | (high << 4u)) - 16.0);
}

// Q5_1: f16 d, f16 m, 32 high bits, 16 bytes of nibbles.
fn value_q5_1(base: u32, i: u32) -> f32 {
    let low = (byte_at(base + 8u + (i & 15u)) >> ((i >> 4u) * 4u)) & 0xfu;
    let high = (u32_at(base + 4u) >> i) & 1u;
    return f32(low | (high << 4u)) * f16_at(base) + f16_at(base + 2u);
}

// Q8_0: f16 d, 32 signed bytes.
fn value_q8_0(base: u32, i: u32) -> f32 {
    return f16_at(base) * i8_at(base + 2u + i);
}

// Q4_K: f16 d, f16 dmin, 12 bytes of 6-bit scales and mins, 128 bytes of nibbles; 256 values
// in 4 chunks of 64 (32 low nibbles, then 32 high nibbles of the same bytes).
fn value_q4_k(base: u32, i: u32) -> f32 {
    let chunk = i >> 6u;
    let high = (i >> 5u) & 1u;
    let sm = scale_min_k4(2u * chunk + high, base + 4u);
    let q = (byte_at(base + 16u + chunk * 32u + (i & 31u)) >> (high * 4u)) & 0xfu;
    return f16_at(base) * sm.x * f32(q) - f16_at(base + 2u) * sm.y;
}

// Q5_K: as Q4_K with 32 bytes of fifth bits (bit `2 * chunk + high` of byte `i % 32`) before
// the nibbles.
fn value_q5_k(base: u32, i: u32) -> f32 {
    let chunk = i >> 6u;
    let high = (i >> 5u) & 1u;
    let l = i & 31u;
    let sm = scale_min_k4(2u * chunk + high, base + 4u);
    let low = (byte_at(base + 48u + chunk * 32u + l) >> (high * 4u)) & 0xfu;
    let fifth = (byte_at(base + 16u + l) >> (2u * chunk + high)) & 1u;
    return f16_at(base) * sm.x * f32(low | (fifth << 4u)) - f16_at(base + 2u) * sm.y;
}

// Q6_K: 128 bytes of low nibbles, 64 bytes of high pairs, 16 signed scales, f16 d; 256 values
// in 2 halves of 128, each 4 quarters of 32.
fn value_q6_k(base: u32, i: u32) -> f32 {
    let half = i >> 7u;
    let quarter = (i >> 5u) & 3u;
    let l = i & 31u;
    let ql = byte_at(base + half * 64u + l + (quarter & 1u) * 32u) >> ((quarter >> 1u) * 4u);
    let qh = byte_at(base + 128u + half * 32u + l) >> (quarter * 2u);
    let q = f32((ql & 0xfu) | ((qh & 3u) << 4u)) - 32.0;
    let scale = i8_at(base + 192u + half * 8u + (l >> 4u) + quarter * 2u);
    return f16_at(base + 208u) * scale * q;
}

// Q2_K: 16 bytes of 4-bit scales and mins, 64 bytes of 2-bit values, f16 d, f16 dmin; 256
// values in 2 halves of 128, each 4 shifts over 32 bytes (16 values a scale).
fn value_q2_k(base: u32, i: u32) -> f32 {
    let half = i >> 7u;
    let shift = (i >> 5u) & 3u;
    let sixteen = (i >> 4u) & 1u;
    let l = i & 15u;
    let sc = byte_at(base + half * 8u + shift * 2u + sixteen);
    let q = (byte_at(base + 16u + half * 32u + sixteen * 16u + l) >> (2u * shift)) & 3u;
    let dl = f16_at(base + 80u) * f32(sc & 0xfu);
    let ml = f16_at(base + 82u) * f32(sc >> 4u);
    return dl * f32(q) - ml;
}

// Q3_K: 32 bytes of high bits (set: +0, clear: -4), 64 bytes of 2-bit values, 12 bytes of
// 6-bit scales (low nibbles in bytes 0..8, high pairs in bytes 8..12), f16 d; laid out as Q2_K.
fn value_q3_k(base: u32, i: u32) -> f32 {
    let half = i >> 7u;
    let shift = (i >> 5u) & 3u;
    let sixteen = (i >> 4u) & 1u;
    let l = i & 15u;
    let s = half * 8u + shift * 2u + sixteen;
    let low = (byte_at(base + 96u + (s & 7u)) >> (4u * (s >> 3u))) & 0xfu;
    let high = (byte_at(base + 104u + (s & 3u)) >> (2u * (s >> 2u))) & 3u;
    let scale = f32(i32(low | (high << 4u)) - 32);
    let q = (byte_at(base + 32u + half * 32u + sixteen * 16u + l) >> (2u * shift)) & 3u;
    let kept = (byte_at(base + sixteen * 16u + l) >> (half * 4u + shift)) & 1u;
    return f16_at(base + 108u) * scale * f32(i32(q) - select(4, 0, kept == 1u));
}

// The non-linear grid of IQ4_NL and IQ4_XS (ggml's `kvalues_iq4nl`).
fn iq4_grid(q: u32) -> f32 {
    var grid = array<f32, 16>(
        -127.0, -104.0, -83.0, -65.0, -49.0, -35.0, -22.0, -10.0,
        1.0, 13.0, 25.0, 38.0, 53.0, 69.0, 89.0, 113.0,
    );
    return grid[q];
}

// IQ4_NL: f16 d, 16 bytes of grid indices (low nibbles first).
fn value_iq4_nl(base: u32, i: u32) -> f32 {
    let q = (byte_at(base + 2u + (i & 15u)) >> ((i >> 4u) * 4u)) & 0xfu;
    return f16_at(base) * iq4_grid(q);
}

// IQ4_XS: f16 d, 16 bits of high scale pairs, 4 bytes of low scale nibbles, 128 bytes of
// grid indices; 8 sub-blocks of 32 as IQ4_NL's, each with a 6-bit scale (minus 32).
fn value_iq4_xs(base: u32, i: u32) -> f32 {
    let sub = i >> 5u;
    let low = (byte_at(base + 4u + (sub >> 1u)) >> (4u * (sub & 1u))) & 0xfu;
    let high = (u16_at(base + 2u) >> (2u * sub)) & 3u;
    let dl = f16_at(base) * f32(i32(low | (high << 4u)) - 32);
    let j = i & 31u;
    let q = (byte_at(base + 8u + sub * 16u + (j & 15u)) >> ((j >> 4u) * 4u)) & 0xfu;
    return dl * iq4_grid(q);
}
