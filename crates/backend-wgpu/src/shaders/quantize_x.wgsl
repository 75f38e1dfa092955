// The activations as the CPU's dot products see them (ggml's `vec_dot_type` of the weight):
// mode 0 rounds each block of 32 to Q8_0/Q8_1 (x86 rounding: d = amax / 127, q = round(x · 127
// / amax), value f16(d) · q), mode 1 rounds each value to f16, mode 2 to bf16 (ties to even),
// mode 3 each block of 256 to Q8_K (max = the first value of largest magnitude, iscale =
// -127 / max, q = min(127, round(x · iscale)), value q / iscale, the scale kept in f32). One
// invocation per block (256 values in mode 3, 32 in the others). Mode 4 is mode 0's rounding
// kept as ggml's Q8_0 block for matmul_q0.wgsl: 9 words a block, the f16 scale as an f32,
// then the 32 signed bytes; mode 5 is mode 3's kept as ggml's Q8_K block for matmul_qk.wgsl:
// 65 words a block, the f32 scale, then the 256 signed bytes; mode 6 is mode 0's kept as
// ggml's Q8_1 block (10 words: the scale, the f16 sum s = f16(d · sum(q)), the bytes).
// Modes 7 and 8 are modes 0 and 3 kept for the int8 matrix-vector kernels
// (matvec_int8.wgsl): groups of 256 values in 72 words, the signed bytes in words 0 .. 64 and
// the scales (f32) from word 64: eight (mode 7, a block of 32 each) or one (mode 8).
// `quantize_block` reads the values through `round_source(i)` and writes `rounded`, which the
// entry points declare (quantize_x_one.wgsl; gated_quantize.wgsl, which first makes the values;
// add_rms_norm_quantize.wgsl, the norm that makes them).

// Values a block of mode `mode`.
fn mode_block_values(mode: u32) -> u32 {
    return select(32u, 256u, mode == 3u || mode == 5u || mode == 8u);
}

// Block `block` of the source rounded into `rounded` in the mode `mode`.
fn quantize_block(block: u32, mode: u32) {
    if mode == 3u || mode == 5u {
        q8_k(block * 256u, block * 65u, block * 65u + 1u, mode == 5u);
        return;
    }
    if mode == 8u {
        q8_k(block * 256u, block * 72u + 64u, block * 72u, true);
        return;
    }
    let base = block * 32u;
    if mode == 2u {
        for (var j = 0u; j < 32u; j++) {
            let bits = bitcast<u32>(round_source(base + j));
            rounded[base + j] = (bits + 0x7fffu + ((bits >> 16u) & 1u)) & 0xffff0000u;
        }
        return;
    }
    if mode == 1u {
        for (var j = 0u; j < 32u; j++) {
            rounded[base + j] = bitcast<u32>(f16_rn(round_source(base + j)));
        }
        return;
    }
    var amax = 0.0;
    for (var j = 0u; j < 32u; j++) {
        amax = max(amax, abs(round_source(base + j)));
    }
    if mode == 4u {
        q8_0_packed(base, block * 9u, block * 9u + 1u, amax, false);
        return;
    }
    if mode == 6u {
        q8_0_packed(base, block * 10u, block * 10u + 2u, amax, true);
        return;
    }
    if mode == 7u {
        let group = block / 8u;
        q8_0_packed(base, group * 72u + 64u + block % 8u, group * 72u + 8u * (block % 8u), amax, false);
        return;
    }
    let d = f16_rn(div_rn(amax, 127.0));
    let id = select(0.0, div_rn(127.0, amax), amax != 0.0);
    for (var j = 0u; j < 32u; j++) {
        rounded[base + j] = bitcast<u32>(d * round(round_source(base + j) * id));
    }
}

// A Q8_K block, `packed`: its scale at word `d_at`, its 256 bytes from word `q_at`.
fn q8_k(base: u32, d_at: u32, q_at: u32, packed: bool) {
    var max_value = 0.0;
    var amax = 0.0;
    for (var j = 0u; j < 256u; j++) {
        let v = round_source(base + j);
        if abs(v) > amax {
            amax = abs(v);
            max_value = v;
        }
    }
    if amax == 0.0 {
        if packed {
            rounded[d_at] = 0u;
            for (var j = 0u; j < 64u; j++) {
                rounded[q_at + j] = 0u;
            }
            return;
        }
        for (var j = 0u; j < 256u; j++) {
            rounded[base + j] = 0u;
        }
        return;
    }
    let iscale = div_rn(-127.0, max_value);
    let d = div_rn(1.0, iscale);
    if packed {
        rounded[d_at] = bitcast<u32>(d);
        for (var word = 0u; word < 64u; word++) {
            var bytes = 0u;
            for (var b = 0u; b < 4u; b++) {
                let q = i32(min(127.0, round(iscale * round_source(base + word * 4u + b))));
                bytes |= (bitcast<u32>(q) & 0xffu) << (8u * b);
            }
            rounded[q_at + word] = bytes;
        }
        return;
    }
    for (var j = 0u; j < 256u; j++) {
        rounded[base + j] = bitcast<u32>(d * min(127.0, round(iscale * round_source(base + j))));
    }
}

// A Q8_0 block (`with_sum`: Q8_1, its s = f16(d · sum(q)) with the unrounded d at word
// `d_at` + 1): its scale at word `d_at`, its 32 bytes from word `q_at`.
fn q8_0_packed(base: u32, d_at: u32, q_at: u32, amax: f32, with_sum: bool) {
    let unrounded = div_rn(amax, 127.0);
    let d = f16_rn(unrounded);
    let id = select(0.0, div_rn(127.0, amax), amax != 0.0);
    rounded[d_at] = bitcast<u32>(d);
    var sum = 0;
    for (var word = 0u; word < 8u; word++) {
        var packed = 0u;
        for (var b = 0u; b < 4u; b++) {
            let q = i32(round(round_source(base + word * 4u + b) * id));
            sum += q;
            packed |= (bitcast<u32>(q) & 0xffu) << (8u * b);
        }
        rounded[q_at + word] = packed;
    }
    if with_sum {
        let s = f16_rn(unrounded * f32(sum));
        rounded[d_at + 1u] = bitcast<u32>(s);
    }
}
