// out[t][out_row0 + r] = sum_i W[row0 + r][i] * x[t][i] for a prompt's tokens: each
// workgroup computes a tile of TILE_ROWS rows x TILE_TOKENS tokens, stepping through the
// row 32 values at a time: the weight tile is dequantized once into shared memory (by
// `value`, dequant.wgsl) and used by every token of the tile, so that weights are read once
// per TILE_TOKENS tokens instead of once per token. Each thread sums 4 rows x 2 tokens in
// the order of the values.

struct Params {
    n: u32,          // values per row (a multiple of 32)
    rows: u32,       // rows of this dispatch
    row_bytes: u32,
    row0: u32,       // first row, in the chunk
    out_row0: u32,   // first output column
    out_stride: u32, // output row length (all rows of the weight)
    tokens: u32,
    _pad: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> w: array<u32>;
@group(0) @binding(2) var<storage, read> x: array<f32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;

const TILE_ROWS: u32 = 64u;
const TILE_TOKENS: u32 = 32u;
const STEP: u32 = 32u;
// Shared rows are STEP + 1 long, so that threads on consecutive rows hit different banks.
const STRIDE: u32 = 33u;

var<workgroup> weights: array<f32, 2112>; // TILE_ROWS x STRIDE
var<workgroup> inputs: array<f32, 1056>;  // TILE_TOKENS x STRIDE

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let row_base = wid.x * TILE_ROWS;
    let token_base = wid.y * TILE_TOKENS;
    // This thread's outputs: rows lid % 16 + 16 i, tokens lid / 16 + 16 j.
    let my_row = lid % 16u;
    let my_token = lid / 16u;
    var acc = array<f32, 8>();
    for (var k0 = 0u; k0 < p.n; k0 += STEP) {
        // The weight tile: 64 rows x 32 values, 8 values a thread.
        for (var e = lid; e < TILE_ROWS * STEP; e += 256u) {
            let r = e / STEP;
            let k = e % STEP;
            var v = 0.0;
            if row_base + r < p.rows {
                let i = k0 + k;
                let block = (p.row0 + row_base + r) * p.row_bytes + (i / BLOCK_VALUES) * BLOCK_BYTES;
                v = value(block, i % BLOCK_VALUES);
            }
            weights[r * STRIDE + k] = v;
        }
        // The input tile: 32 tokens x 32 values, 4 a thread.
        for (var e = lid; e < TILE_TOKENS * STEP; e += 256u) {
            let t = e / STEP;
            let k = e % STEP;
            var v = 0.0;
            if token_base + t < p.tokens {
                v = x[(token_base + t) * p.n + k0 + k];
            }
            inputs[t * STRIDE + k] = v;
        }
        workgroupBarrier();
        for (var k = 0u; k < STEP; k++) {
            for (var j = 0u; j < 2u; j++) {
                let xv = inputs[(my_token + 16u * j) * STRIDE + k];
                for (var i = 0u; i < 4u; i++) {
                    acc[j * 4u + i] += weights[(my_row + 16u * i) * STRIDE + k] * xv;
                }
            }
        }
        workgroupBarrier();
    }
    for (var j = 0u; j < 2u; j++) {
        let t = token_base + my_token + 16u * j;
        for (var i = 0u; i < 4u; i++) {
            let r = row_base + my_row + 16u * i;
            if r < p.rows && t < p.tokens {
                out[t * p.out_stride + p.out_row0 + r] = acc[j * 4u + i];
            }
        }
    }
}
