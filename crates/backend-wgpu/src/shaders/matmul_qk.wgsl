// out[t][out_row0 + r] = W[row0 + r] · x[t] for the K-quants and IQ4_XS in a plain buffer,
// against Q8_K activations, in exactly the CPU's arithmetic (ggml's AVX2 `vec_dot_*_q8_k`,
// `runit_quant::dot::kquants`): each super-block's scaled integer dot split into eight lanes
// (element e into lane (e % 32) / 4), taken by fma(d_x · d_w, sum, lane); the minimums in
// the same lanes (Q2_K), four lanes of their own (Q4_K) or one (Q5_K); Q6_K's -32 taken out
// of the lanes through the activation sums of 16; ggml's `hsum_float_8` at the end. One
// invocation per output (row, token); 64 rows a workgroup.
//
// `x` holds the activations as quantize_x.wgsl's mode 5 writes them: per block of 256, the
// f32 scale, then 64 words of 4 signed bytes.

struct Params {
    n: u32,          // values per row
    rows: u32,       // rows of this dispatch
    row_bytes: u32,
    row0: u32,       // first row, in the chunk
    out_row0: u32,   // first output column
    out_stride: u32, // output row length (all rows of the weight)
    groups_x: u32,
    zero: u32,       // always 0 (`opaque` in precise.wgsl)
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> w: array<u32>;
@group(0) @binding(2) var<storage, read> x: array<u32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;

var<private> lanes: array<f32, 8>;
var<private> extra: array<f32, 4>;

// Activation `e` of the block at word `xb`.
fn act(xb: u32, e: u32) -> i32 {
    return bitcast<i32>(x[xb + 1u + (e >> 2u)] << (24u - 8u * (e & 3u))) >> 24u;
}

// Sum of activations 16 g .. 16 g + 16 (Q8_K's `bsums`).
fn bsum(xb: u32, g: u32) -> i32 {
    var s = 0;
    for (var e = 16u * g; e < 16u * g + 16u; e++) {
        s += act(xb, e);
    }
    return s;
}

fn add_lanes(d: f32, sums: array<i32, 8>) {
    for (var k = 0u; k < 8u; k++) {
        lanes[k] = fma_exact(d, f32(sums[k]), lanes[k]);
    }
}

fn i8_of(byte: u32) -> i32 {
    return bitcast<i32>(byte << 24u) >> 24u;
}

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let r = (wid.x + wid.y * p.groups_x) * 64u + lid;
    let t = wid.z;
    if r >= p.rows {
        return;
    }
    let base = (p.row0 + r) * p.row_bytes;
    let blocks = p.n / 256u;
    lanes = array<f32, 8>(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0);
    extra = array<f32, 4>(0.0, 0.0, 0.0, 0.0);
    for (var b = 0u; b < blocks; b++) {
        let xb = (t * blocks + b) * 65u;
        block_dot(base + b * BLOCK_BYTES, xb, bitcast<f32>(x[xb]));
    }
    let quad = array<f32, 4>(lanes[0] + lanes[4], lanes[1] + lanes[5], lanes[2] + lanes[6], lanes[3] + lanes[7]);
    var sum = (quad[0] + quad[2]) + (quad[1] + quad[3]);
    if MINIMUMS == 4u {
        sum += (extra[0] + extra[2]) + (extra[1] + extra[3]);
    } else if MINIMUMS == 1u {
        sum += extra[0];
    }
    out[t * p.out_stride + p.out_row0 + r] = sum;
}

// Q2_K: 16 bytes of scales (low nibble) and mins (high), 64 bytes of 2-bit quants, f16 d,
// f16 dmin.
fn block_dot_q2_k(block: u32, xb: u32, dy: f32) {
    let d = dy * f16_at(block + 80u);
    let dmin = -dy * f16_at(block + 82u);
    var mins: array<i32, 8>;
    for (var k = 0u; k < 8u; k++) {
        mins[k] = i32(byte_at(block + 2u * k) >> 4u) * bsum(xb, 2u * k)
            + i32(byte_at(block + 2u * k + 1u) >> 4u) * bsum(xb, 2u * k + 1u);
    }
    add_lanes(dmin, mins);
    var sums = array<i32, 8>(0, 0, 0, 0, 0, 0, 0, 0);
    for (var e = 0u; e < 256u; e++) {
        let upper = e >> 7u;
        let shift = (e >> 5u) & 3u;
        let q = (byte_at(block + 16u + 32u * upper + (e & 31u)) >> (2u * shift)) & 3u;
        let scale = byte_at(block + (e >> 4u)) & 0xfu;
        sums[(e & 31u) >> 2u] += i32(scale * q) * act(xb, e);
    }
    add_lanes(d, sums);
}

// Q3_K: 32 bytes of high-bit masks, 64 bytes of 2-bit quants, 12 bytes of 6-bit scales,
// f16 d.
fn block_dot_q3_k(block: u32, xb: u32, dy: f32) {
    let d = dy * f16_at(block + 108u);
    var sums = array<i32, 8>(0, 0, 0, 0, 0, 0, 0, 0);
    for (var e = 0u; e < 256u; e++) {
        let j = e >> 4u;
        var low = 0u;
        if j < 8u {
            low = byte_at(block + 96u + j) & 0xfu;
        } else {
            low = byte_at(block + 96u + j - 8u) >> 4u;
        }
        let high = (byte_at(block + 96u + 8u + (j & 3u)) >> (2u * (j >> 2u))) & 3u;
        let scale = i32(low | (high << 4u)) - 32;
        let upper = e >> 7u;
        let shift = (e >> 5u) & 3u;
        let l = e & 31u;
        let q2 = i32((byte_at(block + 32u + 32u * upper + l) >> (2u * shift)) & 3u);
        let high_set = (byte_at(block + l) >> (4u * upper + shift)) & 1u;
        let q = q2 - select(4, 0, high_set == 1u);
        sums[l >> 2u] += scale * q * act(xb, e);
    }
    add_lanes(d, sums);
}

// The 6-bit scale and min of sub-block `j` of Q4_K / Q5_K (scales at `at`).
fn scale_min(j: u32, at: u32) -> vec2<i32> {
    let sm = scale_min_k4(j, at);
    return vec2<i32>(i32(sm.x), i32(sm.y));
}

// Q4_K: f16 d, f16 dmin, 12 bytes of scales and mins, 128 bytes of nibbles.
fn block_dot_q4_k(block: u32, xb: u32, dy: f32) {
    let d = dy * f16_at(block);
    let dmin = -dy * f16_at(block + 2u);
    for (var k = 0u; k < 4u; k++) {
        let product = scale_min(2u * k, block + 4u).y * (bsum(xb, 4u * k) + bsum(xb, 4u * k + 1u))
            + scale_min(2u * k + 1u, block + 4u).y * (bsum(xb, 4u * k + 2u) + bsum(xb, 4u * k + 3u));
        extra[k] = fma_exact(dmin, f32(product), extra[k]);
    }
    var sums = array<i32, 8>(0, 0, 0, 0, 0, 0, 0, 0);
    for (var e = 0u; e < 256u; e++) {
        let chunk = e >> 6u;
        let high = (e >> 5u) & 1u;
        let q = (byte_at(block + 16u + 32u * chunk + (e & 31u)) >> (4u * high)) & 0xfu;
        let scale = scale_min(e >> 5u, block + 4u).x;
        sums[(e & 31u) >> 2u] += scale * i32(q) * act(xb, e);
    }
    add_lanes(d, sums);
}

// Q5_K: f16 d, f16 dmin, 12 bytes of scales and mins, 32 bytes of fifth bits, 128 bytes of
// nibbles.
fn block_dot_q5_k(block: u32, xb: u32, dy: f32) {
    let d = dy * f16_at(block);
    let dmin = -dy * f16_at(block + 2u);
    var product = 0;
    for (var m = 0u; m < 8u; m++) {
        product += scale_min(m, block + 4u).y * (bsum(xb, 2u * m) + bsum(xb, 2u * m + 1u));
    }
    extra[0] = fma_exact(dmin, f32(product), extra[0]);
    var sums = array<i32, 8>(0, 0, 0, 0, 0, 0, 0, 0);
    for (var e = 0u; e < 256u; e++) {
        let chunk = e >> 6u;
        let high = (e >> 5u) & 1u;
        let l = e & 31u;
        let fifth = ((byte_at(block + 16u + l) >> (2u * chunk)) >> high) & 1u;
        let q = ((byte_at(block + 48u + 32u * chunk + l) >> (4u * high)) & 0xfu) | (fifth << 4u);
        let scale = scale_min(e >> 5u, block + 4u).x;
        sums[l >> 2u] += scale * i32(q) * act(xb, e);
    }
    add_lanes(d, sums);
}

// Q6_K: 128 bytes of low nibbles, 64 bytes of high bit pairs, 16 signed scales, f16 d.
fn block_dot_q6_k(block: u32, xb: u32, dy: f32) {
    let d = dy * f16_at(block + 208u);
    var sums = array<i32, 8>(0, 0, 0, 0, 0, 0, 0, 0);
    for (var e = 0u; e < 256u; e++) {
        let upper = e >> 7u;
        let quarter = (e >> 5u) & 3u;
        let l = e & 31u;
        let low = (byte_at(block + 64u * upper + l + 32u * (quarter & 1u)) >> (4u * (quarter >> 1u))) & 0xfu;
        let high = (byte_at(block + 128u + 32u * upper + l) >> (2u * quarter)) & 3u;
        let scale = i8_of(byte_at(block + 192u + (e >> 4u)));
        sums[l >> 2u] += scale * i32(low | (high << 4u)) * act(xb, e);
    }
    for (var k = 0u; k < 8u; k++) {
        sums[k] -= 32 * (i8_of(byte_at(block + 192u + 2u * k)) * bsum(xb, 2u * k)
            + i8_of(byte_at(block + 192u + 2u * k + 1u)) * bsum(xb, 2u * k + 1u));
    }
    add_lanes(d, sums);
}

// IQ4_XS: f16 d, 16 bits of high scale pairs, 4 bytes of low scale nibbles, 128 bytes of
// nibbles indexing IQ4_NL's grid.
fn block_dot_iq4_xs(block: u32, xb: u32, dy: f32) {
    let d = f16_at(block) * dy;
    var grid = array<i32, 16>(-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113);
    var sums = array<i32, 8>(0, 0, 0, 0, 0, 0, 0, 0);
    for (var e = 0u; e < 256u; e++) {
        let sub = e >> 5u;
        let low = (byte_at(block + 4u + (sub >> 1u)) >> (4u * (sub & 1u))) & 0xfu;
        let high = (u16_at(block + 2u) >> (2u * sub)) & 3u;
        let scale = i32(low | (high << 4u)) - 32;
        let l = e & 31u;
        let q = (byte_at(block + 8u + 16u * sub + (l & 15u)) >> (4u * (l >> 4u))) & 0xfu;
        sums[l >> 2u] += scale * grid[q] * act(xb, e);
    }
    add_lanes(d, sums);
}
