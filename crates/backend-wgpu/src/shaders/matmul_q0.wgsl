// out[t][out_row0 + r] = W[row0 + r] · x[t] for weights paired with Q8_0 activations (Q8_0,
// Q5_0) in exactly the CPU's arithmetic (ggml's AVX2 `vec_dot` and tinyBLAS, one order for
// both: `runit_quant::dot::legacy`): eight f32 lanes, lane k taking the integer sum of
// elements 4k .. 4k + 4 of each block of 32 as fma(d_w · d_x, sum, lane), then ggml's
// `hsum_float_8`. One invocation per output (row, token); 64 rows a workgroup.
//
// `x` holds the activations as quantize_x.wgsl's mode 4 writes them: per block of 32, the
// f16 scale as an f32 word, then 8 words of 4 signed bytes.

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

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let r = (wid.x + wid.y * p.groups_x) * 64u + lid;
    let t = wid.z;
    if r >= p.rows {
        return;
    }
    let base = (p.row0 + r) * p.row_bytes;
    let blocks = p.n / 32u;
    var lanes = array<f32, 8>(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0);
    for (var b = 0u; b < blocks; b++) {
        let block = base + b * BLOCK_BYTES;
        let xb = (t * blocks + b) * 9u;
        let scale = f16_at(block) * bitcast<f32>(x[xb]);
        for (var k = 0u; k < 8u; k++) {
            let word = x[xb + 1u + k];
            var sum = 0;
            for (var e = 0u; e < 4u; e++) {
                let a = bitcast<i32>(word << (24u - 8u * e)) >> 24u;
                sum += quant(block, 4u * k + e) * a;
            }
            lanes[k] = fma_exact(scale, f32(sum), lanes[k]);
        }
    }
    let quad = array<f32, 4>(lanes[0] + lanes[4], lanes[1] + lanes[5], lanes[2] + lanes[6], lanes[3] + lanes[7]);
    out[t * p.out_stride + p.out_row0 + r] = (quad[0] + quad[2]) + (quad[1] + quad[3]);
}

// Q8_0: f16 d, 32 signed bytes.
fn quant_q8_0(block: u32, j: u32) -> i32 {
    return bitcast<i32>(byte_at(block + 2u + j) << 24u) >> 24;
}

// Q5_0: f16 d, 32 high bits, 16 bytes of nibbles; values 0..31 less 16.
fn quant_q5_0(block: u32, j: u32) -> i32 {
    let low = (byte_at(block + 6u + (j & 15u)) >> ((j >> 4u) * 4u)) & 0xfu;
    let high = (u32_at(block + 2u) >> j) & 1u;
    return i32(low | (high << 4u)) - 16;
}
