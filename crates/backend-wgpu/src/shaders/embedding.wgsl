// out[token] = table[row] dequantized, for each (token, row in this chunk) pair of `lookups`.

struct Params {
    n: u32,         // values per row
    row_bytes: u32,
    lookups: u32,
    _pad: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> w: array<u32>;
@group(0) @binding(2) var<storage, read> lookups: array<u32>; // [lookups, 2]: token, row
@group(0) @binding(3) var<storage, read_write> out: array<f32>;

// Invocations a row: each step of an invocation waits on its loads (the block's bytes), so
// a 3,584-value row took 56 steps with 64 (44 µs on an H100, session 41), 14 with 256.
const THREADS: u32 = 256u;

@compute @workgroup_size(THREADS)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let k = wid.x;
    if k >= p.lookups {
        return;
    }
    let token = lookups[2u * k];
    let base = lookups[2u * k + 1u] * p.row_bytes;
    for (var i = lid; i < p.n; i += THREADS) {
        let block = base + (i / BLOCK_VALUES) * BLOCK_BYTES;
        out[token * p.n + i] = value(block, i % BLOCK_VALUES);
    }
}
