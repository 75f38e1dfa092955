// out[t][out_row0 + r] = W[row0 + r] · x[t] for the 32-value block types in a plain buffer,
// against Q8_0 activations (Q8_0, Q5_0, Q4_0, IQ4_NL) or Q8_1 ones (Q4_1, Q5_1), in exactly
// the CPU's arithmetic (ggml's AVX2 `vec_dot` and tinyBLAS: `runit_quant::dot::legacy`):
// eight f32 lanes, lane k taking the integer sum of elements 4k .. 4k + 4 of each block as
// fma(d_w · d_x, sum, lane), then ggml's `hsum_float_8`. ORDER 1 (IQ4_NL's `vec_dot`, when
// `p.tiled` is 0) keeps even and odd blocks in two sets of lanes, adds them, and takes an
// odd last block by one scalar fma; ORDER 2 (Q4_1, Q5_1) adds fma(m, s_x) of each block to
// a scalar beside the lanes. One invocation per output (row, token); 64 rows a workgroup.
//
// `x` holds the activations as quantize_x.wgsl writes them: mode 4, per block of 32 the f16
// scale as an f32 word, then 8 words of 4 signed bytes; mode 6 (Q8_1) the scale, the f16
// sum s as an f32 word, then the bytes.

struct Params {
    n: u32,          // values per row
    rows: u32,       // rows of this dispatch
    row_bytes: u32,
    row0: u32,       // first row, in the chunk
    out_row0: u32,   // first output column
    out_stride: u32, // output row length (all rows of the weight)
    groups_x: u32,
    tiled: u32,      // IQ4_NL: 1 for tinyBLAS's order (one set of lanes), 0 for vec_dot's pairs
    zero: u32,       // always 0 (`opaque` in precise.wgsl)
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> w: array<u32>;
@group(0) @binding(2) var<storage, read> x: array<u32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let r = (wid.x + wid.y * p.groups_x) * 64u + lid;
    let t = wid.z;
    if r >= p.rows {
        return;
    }
    let base = (p.row0 + r) * p.row_bytes;
    let blocks = p.n / 32u;
    let words = select(9u, 10u, ORDER == 2u);
    var lanes = array<f32, 8>(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0);
    var odd = array<f32, 8>(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0);
    var minimums = 0.0;
    let pairs = ORDER == 1u && p.tiled == 0u;
    var result = 0.0;
    for (var b = 0u; b < blocks; b++) {
        let block = base + b * BLOCK_BYTES;
        let xb = (t * blocks + b) * words;
        let qs = xb + select(1u, 2u, ORDER == 2u);
        let scale = f16_at(block) * bitcast<f32>(x[xb]);
        var sums: array<i32, 8>;
        for (var k = 0u; k < 8u; k++) {
            let word = x[qs + k];
            var sum = 0;
            for (var e = 0u; e < 4u; e++) {
                let a = bitcast<i32>(word << (24u - 8u * e)) >> 24u;
                sum += quant(block, 4u * k + e) * a;
            }
            sums[k] = sum;
        }
        if ORDER == 2u {
            minimums = fma_exact(f16_at(block + 2u), bitcast<f32>(x[xb + 1u]), minimums);
        }
        if pairs && b == blocks - 1u && blocks % 2u == 1u {
            // The odd last block, after the pairs' lanes are reduced (below).
            var total = 0;
            for (var k = 0u; k < 8u; k++) {
                total += sums[k];
            }
            var both: array<f32, 8>;
            for (var k = 0u; k < 8u; k++) {
                both[k] = lanes[k] + odd[k];
            }
            result = fma_exact(scale, f32(total), hsum8(both));
            break;
        }
        for (var k = 0u; k < 8u; k++) {
            if pairs && (b & 1u) == 1u {
                odd[k] = fma_exact(scale, f32(sums[k]), odd[k]);
            } else {
                lanes[k] = fma_exact(scale, f32(sums[k]), lanes[k]);
            }
        }
    }
    if pairs && blocks % 2u == 0u {
        var both: array<f32, 8>;
        for (var k = 0u; k < 8u; k++) {
            both[k] = lanes[k] + odd[k];
        }
        result = hsum8(both);
    } else if !pairs {
        result = hsum8(lanes) + minimums;
    }
    out[t * p.out_stride + p.out_row0 + r] = result;
}

// ggml's `hsum_float_8`: upper half plus lower half, then (0 + 2) + (1 + 3).
fn hsum8(v: array<f32, 8>) -> f32 {
    return ((v[0] + v[4]) + (v[2] + v[6])) + ((v[1] + v[5]) + (v[3] + v[7]));
}

// Q8_0: f16 d, 32 signed bytes.
fn quant_q8_0(block: u32, j: u32) -> i32 {
    return bitcast<i32>(byte_at(block + 2u + j) << 24u) >> 24;
}

// Q4_0: f16 d, 16 bytes of nibbles (low: values 0..16, high: 16..32), less 8.
fn quant_q4_0(block: u32, j: u32) -> i32 {
    return i32((byte_at(block + 2u + (j & 15u)) >> ((j >> 4u) * 4u)) & 0xfu) - 8;
}

// Q5_0: f16 d, 32 high bits, 16 bytes of nibbles; values 0..31 less 16.
fn quant_q5_0(block: u32, j: u32) -> i32 {
    let low = (byte_at(block + 6u + (j & 15u)) >> ((j >> 4u) * 4u)) & 0xfu;
    let high = (u32_at(block + 2u) >> j) & 1u;
    return i32(low | (high << 4u)) - 16;
}

// IQ4_NL: f16 d, 16 bytes of nibbles indexing the non-linear grid.
fn quant_iq4_nl(block: u32, j: u32) -> i32 {
    var grid = array<i32, 16>(-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113);
    return grid[(byte_at(block + 2u + (j & 15u)) >> ((j >> 4u) * 4u)) & 0xfu];
}

// Q4_1: f16 d, f16 m, 16 bytes of nibbles (0..15).
fn quant_q4_1(block: u32, j: u32) -> i32 {
    return i32((byte_at(block + 4u + (j & 15u)) >> ((j >> 4u) * 4u)) & 0xfu);
}

// Q5_1: f16 d, f16 m, 32 high bits, 16 bytes of nibbles (0..31).
fn quant_q5_1(block: u32, j: u32) -> i32 {
    let low = (byte_at(block + 8u + (j & 15u)) >> ((j >> 4u) * 4u)) & 0xfu;
    let high = (u32_at(block + 4u) >> j) & 1u;
    return i32(low | (high << 4u));
}
