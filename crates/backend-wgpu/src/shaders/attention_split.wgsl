// Decode attention split over the keys (flash-decoding), pass 1 of 2, for spans of fewer
// than 64 query rows where matmul is not exact (`RUNIT_WGPU_EXACT=1` keeps ggml's one-chunk
// path, attention_chunk.wgsl). One workgroup per (key chunk, head, query): the chunk's keys
// (`chunk_keys`) in tiles of TILE, each tile's scores by two invocations a key (half the
// head dims each, summed in shared memory), then an online softmax in f32 over the tiles,
// every invocation accumulating the weighted values of the head dims lid, lid + 64, ...
// The chunk's record in `partials` (record (query · heads + head) · chunks + chunk, of
// head_dim + 2 floats): the scores' maximum m, the sum l of exp(score - m) and the
// accumulated values; attention_merge.wgsl combines a query's records. Scores and sums are
// f32 in this order, within the parity suite's bound of ggml's.
//
// Loads go GROUP at a time: a score's half reads GROUP dims of its key, the values GROUP
// keys, all before any is used, then adds them in order. One load a step (a dim of the score,
// a key of the values) kept an invocation waiting on the memory at every step: 25 µs a
// dispatch for the 7B's 128-dim heads at a depth of a few keys on an H100 (session 36).

@group(0) @binding(1) var<storage, read> q: array<f32>;
@group(0) @binding(2) var<storage, read> k_cache: array<u32>;
@group(0) @binding(3) var<storage, read> v_cache: array<u32>;
@group(0) @binding(4) var<storage, read> cells: array<u32>;
@group(0) @binding(5) var<storage, read> queries: array<Query>;
@group(0) @binding(6) var<storage, read_write> partials: array<f32>;

const THREADS: u32 = 64u;
const TILE: u32 = 32u;
const MAX_HEAD_DIM: u32 = 256u;
const DIMS_PER_THREAD: u32 = 4u;
/// Loads an invocation has in flight at once (dims of a score, keys of the values).
const GROUP: u32 = 8u;
/// Below any score: the running maximum before the first tile (exp of it minus a score is 0).
const LOWEST: f32 = -3.0e38;

var<workgroup> query: array<f32, MAX_HEAD_DIM>;
var<workgroup> halves: array<f32, THREADS>;
var<workgroup> scores: array<f32, TILE>;
var<workgroup> value_rows: array<u32, TILE>;
var<workgroup> weights: array<f32, TILE>;
var<workgroup> keys: vec2<u32>;

@compute @workgroup_size(THREADS)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let info = queries[wid.z];
    let head = wid.y;
    let kv_base = (head / p.group) * p.head_dim;
    let q_base = info.row * p.q_width + head * p.head_dim;
    for (var d = lid; d < p.head_dim; d += THREADS) {
        query[d] = q[q_base + d];
    }
    if lid == 0u {
        keys = chunk_keys(info.lo, info.pos, wid.x, TILE);
    }
    let range = workgroupUniformLoad(&keys);
    if range.x >= range.y {
        return;
    }
    // The score half this invocation sums: key lid / 2 of a tile, dims first_dim .. end_dim.
    let key = lid >> 1u;
    let first_dim = (lid & 1u) * (p.head_dim / 2u);
    let end_dim = select(p.head_dim / 2u, p.head_dim, (lid & 1u) == 1u);
    var m = LOWEST;
    var l = 0.0;
    var acc = array<f32, DIMS_PER_THREAD>(0.0, 0.0, 0.0, 0.0);
    for (var start = range.x; start < range.y; start += TILE) {
        let count = min(TILE, range.y - start);
        var half = 0.0;
        if key < count {
            let cell = cells[info.cells + start + key];
            let row = cell * p.kv_width + kv_base;
            for (var d0 = first_dim; d0 < end_dim; d0 += GROUP) {
                var key_values: array<f32, GROUP>;
                for (var k = 0u; k < GROUP; k++) {
                    if d0 + k < end_dim {
                        key_values[k] = cache_value(row + d0 + k, true);
                    }
                }
                for (var k = 0u; k < GROUP; k++) {
                    if d0 + k < end_dim {
                        half += query[d0 + k] * key_values[k];
                    }
                }
            }
            if (lid & 1u) == 0u {
                value_rows[key] = row;
            }
        }
        halves[lid] = half;
        workgroupBarrier();
        if lid < count {
            scores[lid] = (halves[2u * lid] + halves[2u * lid + 1u]) * p.scale;
        }
        workgroupBarrier();
        var top = m;
        for (var k = 0u; k < count; k++) {
            top = max(top, scores[k]);
        }
        let rescale = exp(m - top);
        m = top;
        l *= rescale;
        for (var j = 0u; j < DIMS_PER_THREAD; j++) {
            acc[j] *= rescale;
        }
        // Each key's weight by an invocation of its own, then summed in key order by all.
        if lid < count {
            weights[lid] = exp(scores[lid] - m);
        }
        workgroupBarrier();
        for (var k0 = 0u; k0 < count; k0 += GROUP) {
            var values: array<vec4<f32>, GROUP>;
            for (var k = 0u; k < GROUP; k++) {
                if k0 + k < count {
                    let row = value_rows[k0 + k];
                    for (var j = 0u; j < DIMS_PER_THREAD; j++) {
                        let d = lid + j * THREADS;
                        if d < p.head_dim {
                            values[k][j] = cache_value(row + d, false);
                        }
                    }
                }
            }
            for (var k = 0u; k < GROUP; k++) {
                if k0 + k < count {
                    let weight = weights[k0 + k];
                    l += weight;
                    for (var j = 0u; j < DIMS_PER_THREAD; j++) {
                        if lid + j * THREADS < p.head_dim {
                            acc[j] += weight * values[k][j];
                        }
                    }
                }
            }
        }
        workgroupBarrier();
    }
    let record = ((wid.z * p.heads + head) * p.chunks + wid.x) * (p.head_dim + 2u);
    if lid == 0u {
        partials[record] = m;
        partials[record + 1u] = l;
    }
    for (var j = 0u; j < DIMS_PER_THREAD; j++) {
        let d = lid + j * THREADS;
        if d < p.head_dim {
            partials[record + 2u + d] = acc[j];
        }
    }
}
