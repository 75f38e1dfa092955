// out[t][out_row0 + r] = sum_i W[row0 + r][i] * x[t][i]: one workgroup per (output row, token),
// 64 threads striding over the row's values, then a shared-memory tree sum (a fixed order,
// so results do not depend on the adapter's subgroup size).

struct Params {
    n: u32,          // values per row
    rows: u32,       // rows of this dispatch
    row_bytes: u32,
    row0: u32,       // first row, in the chunk
    out_row0: u32,   // first output column
    out_stride: u32, // output row length (all rows of the weight)
    groups_x: u32,
    _pad: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> w: array<u32>;
@group(0) @binding(2) var<storage, read> x: array<f32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;

const THREADS: u32 = 64u;
var<workgroup> partial: array<f32, THREADS>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let r = wid.x + wid.y * p.groups_x;
    let t = wid.z;
    let base = (p.row0 + r) * p.row_bytes;
    var acc = 0.0;
    if r < p.rows {
        for (var i = lid; i < p.n; i += THREADS) {
            let block = base + (i / BLOCK_VALUES) * BLOCK_BYTES;
            acc += value(block, i % BLOCK_VALUES) * x[t * p.n + i];
        }
    }
    partial[lid] = acc;
    workgroupBarrier();
    for (var span = THREADS / 2u; span > 0u; span >>= 1u) {
        if lid < span {
            partial[lid] += partial[lid + span];
        }
        workgroupBarrier();
    }
    if lid == 0u && r < p.rows {
        out[t * p.out_stride + p.out_row0 + r] = partial[0];
    }
}
