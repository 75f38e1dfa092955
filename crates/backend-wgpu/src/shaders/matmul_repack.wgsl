// out[t][out_row0 + r] = W[row0 + r] · x[t] for weights llama.cpp's CPU backend keeps in its
// REPACK buffer (Q4_0, IQ4_NL, Q2_K, Q4_K), in exactly the arithmetic of ggml's repacked
// kernels (`runit_quant::dot::ggml_repack`): one f32 accumulator (and one for the minimums)
// taking fma(integer sum, d_w · d_x) per block of 32 (Q4_0, IQ4_NL, both orders) or, for
// the K-quants, per super-block in gemv order and per 64 (Q4_K) or 128 (Q2_K) values in
// gemm order; the result is acc - acc_min. Tokens below `p.gemm_rows` take the gemm order
// (ggml's groups of four activation rows), the others gemv. One invocation per output
// (row, token); 64 rows a workgroup.
//
// `x` holds the activations as quantize_x.wgsl writes them in mode 4 (Q8_0 blocks of 9
// words) for Q4_0 and IQ4_NL, in mode 5 (Q8_K blocks of 65 words) for the K-quants.

struct Params {
    n: u32,          // values per row
    rows: u32,       // rows of this dispatch
    row_bytes: u32,
    row0: u32,       // first row, in the chunk
    out_row0: u32,   // first output column
    out_stride: u32, // output row length (all rows of the weight)
    groups_x: u32,
    gemm_rows: u32,  // tokens 0 .. gemm_rows of this dispatch take the gemm order
    zero: u32,       // always 0 (`opaque` in precise.wgsl)
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> w: array<u32>;
@group(0) @binding(2) var<storage, read> x: array<u32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;

var<private> acc: f32;
var<private> acc_min: f32;

// Activation `e` of the block at word `xb` (its scale first).
fn act(xb: u32, e: u32) -> i32 {
    return bitcast<i32>(x[xb + 1u + (e >> 2u)] << (24u - 8u * (e & 3u))) >> 24u;
}

fn bsum(xb: u32, g: u32) -> i32 {
    var s = 0;
    for (var e = 16u * g; e < 16u * g + 16u; e++) {
        s += act(xb, e);
    }
    return s;
}

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let r = (wid.x + wid.y * p.groups_x) * 64u + lid;
    let t = wid.z;
    if r >= p.rows {
        return;
    }
    let base = (p.row0 + r) * p.row_bytes;
    let blocks = p.n / BLOCK_VALUES;
    let words = select(9u, 65u, BLOCK_VALUES == 256u);
    let gemm = t < p.gemm_rows;
    acc = 0.0;
    acc_min = 0.0;
    for (var b = 0u; b < blocks; b++) {
        let xb = (t * blocks + b) * words;
        block_dot(base + b * BLOCK_BYTES, xb, bitcast<f32>(x[xb]), gemm);
    }
    out[t * p.out_stride + p.out_row0 + r] = acc - acc_min;
}

// Q4_0: f16 d, 16 bytes of nibbles (low: values 0..16, high: 16..32), less 8.
fn block_dot_q4_0(block: u32, xb: u32, dx: f32, gemm: bool) {
    var isum = 0;
    for (var j = 0u; j < 16u; j++) {
        let byte = byte_at(block + 2u + j);
        isum += (i32(byte & 0xfu) - 8) * act(xb, j) + (i32(byte >> 4u) - 8) * act(xb, j + 16u);
    }
    acc = fma_exact(f32(isum), f16_at(block) * dx, acc);
}

// IQ4_NL: f16 d, 16 bytes of nibbles indexing the non-linear grid.
fn block_dot_iq4_nl(block: u32, xb: u32, dx: f32, gemm: bool) {
    var grid = array<i32, 16>(-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113);
    var isum = 0;
    for (var j = 0u; j < 16u; j++) {
        let byte = byte_at(block + 2u + j);
        isum += grid[byte & 0xfu] * act(xb, j) + grid[byte >> 4u] * act(xb, j + 16u);
    }
    acc = fma_exact(f32(isum), f16_at(block) * dx, acc);
}

// Q2_K: 16 bytes of scales and mins, 64 bytes of 2-bit quants, f16 d, f16 dmin; an FMA per
// 128 values (gemm) or per super-block (gemv).
fn block_dot_q2_k(block: u32, xb: u32, dy: f32, gemm: bool) {
    let scale = f16_at(block + 80u) * dy;
    let scale_min = f16_at(block + 82u) * dy;
    var isum = 0;
    var imin = 0;
    for (var upper = 0u; upper < 2u; upper++) {
        for (var shift = 0u; shift < 4u; shift++) {
            for (var part = 0u; part < 2u; part++) {
                let k = 8u * upper + 2u * shift + part;
                var dot = 0;
                for (var l = 16u * part; l < 16u * part + 16u; l++) {
                    let q = (byte_at(block + 16u + 32u * upper + l) >> (2u * shift)) & 3u;
                    dot += i32(q) * act(xb, 128u * upper + 32u * shift + l);
                }
                let sc = byte_at(block + k);
                isum += i32(sc & 0xfu) * dot;
                imin += i32(sc >> 4u) * bsum(xb, k);
            }
        }
        if gemm || upper == 1u {
            acc = fma_exact(f32(isum), scale, acc);
            acc_min = fma_exact(f32(imin), scale_min, acc_min);
            isum = 0;
            imin = 0;
        }
    }
}

// Q4_K: f16 d, f16 dmin, 12 bytes of scales and mins, 128 bytes of nibbles; an FMA per 64
// values (gemm) or per super-block (gemv).
fn block_dot_q4_k(block: u32, xb: u32, dy: f32, gemm: bool) {
    let scale = f16_at(block) * dy;
    let scale_min = f16_at(block + 2u) * dy;
    var isum = 0;
    var imin = 0;
    for (var chunk = 0u; chunk < 4u; chunk++) {
        for (var high = 0u; high < 2u; high++) {
            let sub = 2u * chunk + high;
            let sm = scale_min_k4(sub, block + 4u);
            var dot = 0;
            for (var l = 0u; l < 32u; l++) {
                let q = (byte_at(block + 16u + 32u * chunk + l) >> (4u * high)) & 0xfu;
                dot += i32(q) * act(xb, 32u * sub + l);
            }
            isum += i32(sm.x) * dot;
            imin += i32(sm.y) * (bsum(xb, 2u * sub) + bsum(xb, 2u * sub + 1u));
        }
        if gemm || chunk == 3u {
            acc = fma_exact(f32(isum), scale, acc);
            acc_min = fma_exact(f32(imin), scale_min, acc_min);
            isum = 0;
            imin = 0;
        }
    }
}
