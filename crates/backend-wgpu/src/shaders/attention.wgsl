// Causal grouped-query attention over a paged cache, one workgroup per (query row, head): keys
// in tiles of 64 (one per thread), an online softmax in f32, each thread accumulating up to 4
// of the head's output dims. The host gives each query row its visible positions `lo ..= pos`
// and where its sequence's cells start in `cells` (position -> cache cell). The cells are read
// by `cache_value` (attention_cache.wgsl) for the caches' types; queries of a quantized key
// cache come rotated as its keys were (`runit_backend::hadamard`).

struct Params {
    heads: u32,
    group: u32,     // query heads per KV head
    head_dim: u32,
    kv_width: u32,
    q_width: u32,
    scale: f32,
    _pad0: u32,
    _pad1: u32,
}

struct Query {
    row: u32,
    cells: u32, // offset of the sequence's position -> cell table
    lo: u32,    // first visible position
    pos: u32,   // the query's position (the last visible one)
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> q: array<f32>;
@group(0) @binding(2) var<storage, read> k_cache: array<u32>;
@group(0) @binding(3) var<storage, read> v_cache: array<u32>;
@group(0) @binding(4) var<storage, read> cells: array<u32>;
@group(0) @binding(5) var<storage, read> queries: array<Query>;
@group(0) @binding(6) var<storage, read_write> out: array<f32>;

const TILE: u32 = 64u;
const MAX_HEAD_DIM: u32 = 256u;
const DIMS_PER_THREAD: u32 = 4u;

var<workgroup> query: array<f32, MAX_HEAD_DIM>;
var<workgroup> scores: array<f32, TILE>;
var<workgroup> tile_cells: array<u32, TILE>;
var<workgroup> bounds: vec2<u32>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let info = queries[wid.x];
    let head = wid.y;
    let kv_base = (head / p.group) * p.head_dim;
    let q_base = info.row * p.q_width + head * p.head_dim;
    for (var d = lid; d < p.head_dim; d += TILE) {
        query[d] = q[q_base + d];
    }
    if lid == 0u {
        bounds = vec2<u32>(info.lo, info.pos);
    }
    let range = workgroupUniformLoad(&bounds);
    var m = -3.0e38;
    var l = 0.0;
    var acc = array<f32, DIMS_PER_THREAD>(0.0, 0.0, 0.0, 0.0);
    for (var start = range.x; start <= range.y; start += TILE) {
        let position = start + lid;
        var score = -3.0e38;
        if position <= range.y {
            let cell = cells[info.cells + position];
            tile_cells[lid] = cell;
            let key = cell * p.kv_width + kv_base;
            var dot = 0.0;
            for (var d = 0u; d < p.head_dim; d++) {
                dot += query[d] * cache_value(key + d, true);
            }
            score = dot * p.scale;
        }
        scores[lid] = score;
        workgroupBarrier();
        let count = min(TILE, range.y + 1u - start);
        var tile_max = m;
        for (var k = 0u; k < count; k++) {
            tile_max = max(tile_max, scores[k]);
        }
        let alpha = exp(m - tile_max);
        m = tile_max;
        l *= alpha;
        for (var k = 0u; k < count; k++) {
            l += exp(scores[k] - m);
        }
        for (var j = 0u; j < DIMS_PER_THREAD; j++) {
            let d = lid + j * TILE;
            if d < p.head_dim {
                var sum = acc[j] * alpha;
                for (var k = 0u; k < count; k++) {
                    let weight = exp(scores[k] - m);
                    sum += weight * cache_value(tile_cells[k] * p.kv_width + kv_base + d, false);
                }
                acc[j] = sum;
            }
        }
        workgroupBarrier();
    }
    for (var j = 0u; j < DIMS_PER_THREAD; j++) {
        let d = lid + j * TILE;
        if d < p.head_dim {
            out[q_base + d] = acc[j] / l;
        }
    }
}
