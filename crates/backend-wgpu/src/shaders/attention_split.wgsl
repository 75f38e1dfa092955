// Decode attention split over the keys (flash-decoding), pass 1 of 2, for spans of fewer
// than 64 query rows where matmul is not exact (`RUNIT_WGPU_EXACT=1` keeps ggml's one-chunk
// path, attention_chunk.wgsl). One workgroup per (key chunk, head, query): the chunk's keys
// (`chunk_keys`) in tiles of TILE, each tile's scores by four invocations a key (a quarter
// of the head dims each, summed in shared memory), then an online softmax in f32 over the
// tiles, every invocation accumulating the weighted values of the head dims lid and
// lid + THREADS.
// The chunk's record in `partials` (record (query · heads + head) · chunks + chunk, of
// head_dim + 2 floats): the scores' maximum m, the sum l of exp(score - m) and the
// accumulated values; attention_merge.wgsl combines a query's records. Scores and sums are
// f32 in this order, within the parity suite's bound of ggml's.
//
// Loads go several at a time: a score's quarter reads 8 dims of its key, the values 8 keys
// (2 dims each), all before any is used, then adds them in order; each load named on its
// own (`key4`, `value2`), so that they are registers whether or not the driver unrolls a
// loop. One load a step (a dim of the score, a key of the values) kept an invocation
// waiting on the memory at every step: 25 µs a dispatch for the 7B's 128-dim heads at a
// depth of a few keys on an H100 (session 36); with 8 dims a step and two invocations a key
// (64 invocations), 33 µs (session 41): a score's half of 64 dims was still 8 steps, each
// waiting on its loads. Four invocations a key (128) halve those steps (4 for 128 dims, 2
// for 64) and the values' loads an invocation (the dims past 128 are none).

@group(0) @binding(1) var<storage, read> q: array<f32>;
@group(0) @binding(2) var<storage, read> k_cache: array<u32>;
@group(0) @binding(3) var<storage, read> v_cache: array<u32>;
@group(0) @binding(4) var<storage, read> cells: array<u32>;
@group(0) @binding(5) var<storage, read> queries: array<Query>;
// Binding 6 and `finish` come from the tail: attention_split_record.wgsl (the chunk's record
// in `partials`) or attention_split_final.wgsl (a query's keys in one chunk: the output
// itself, as the merge would write it, and its rounding for the output projection).

const THREADS: u32 = 128u;
const TILE: u32 = 32u;
// Invocations a key's score: a quarter of the head dims each.
const LANES_PER_KEY: u32 = THREADS / TILE;
const MAX_HEAD_DIM: u32 = 256u;
const DIMS_PER_THREAD: u32 = MAX_HEAD_DIM / THREADS;
/// Below any score: the running maximum before the first tile (exp of it minus a score is 0).
const LOWEST: f32 = -3.0e38;

var<workgroup> query: array<f32, MAX_HEAD_DIM>;
var<workgroup> quarters: array<f32, THREADS>;
var<workgroup> scores: array<f32, TILE>;
var<workgroup> value_rows: array<u32, TILE>;
var<workgroup> weights: array<f32, TILE>;
var<workgroup> keys: vec2<u32>;

// Dims d .. d + 4 of the key row at `row`, zero from `end` on.
fn key4(row: u32, d: u32, end: u32) -> vec4<f32> {
    return vec4<f32>(key_dim(row, d, end), key_dim(row, d + 1u, end), key_dim(row, d + 2u, end),
        key_dim(row, d + 3u, end));
}

fn key_dim(row: u32, d: u32, end: u32) -> f32 {
    if d < end {
        return cache_value(row + d, true);
    }
    return 0.0;
}

// `part` plus the products of the query's dims d .. d + 4 (those before `end`) with `key`,
// in order.
fn add_products(part: f32, d: u32, key: vec4<f32>, end: u32) -> f32 {
    var sum = part;
    for (var k = 0u; k < 4u; k++) {
        if d + k < end {
            sum += query[d + k] * key[k];
        }
    }
    return sum;
}

// Invocation `lid`'s dims (lid, lid + THREADS) of tile key k's value row, zero where the
// tile has no key k or the head no such dim.
fn value2(k: u32, count: u32, lid: u32) -> vec2<f32> {
    if k >= count {
        return vec2<f32>(0.0);
    }
    let row = value_rows[k];
    return vec2<f32>(value_dim(row, lid), value_dim(row, lid + THREADS));
}

fn value_dim(row: u32, d: u32) -> f32 {
    if d < p.head_dim {
        return cache_value(row + d, false);
    }
    return 0.0;
}

// The softmax's running sums: the weighted values of an invocation's dims, and the weights.
struct Sums {
    acc: vec2<f32>,
    l: f32,
}

// `sums` after tile key k (where the tile has it), whose value dims are `value`.
fn add_key(sums: Sums, k: u32, count: u32, value: vec2<f32>) -> Sums {
    if k >= count {
        return sums;
    }
    let weight = weights[k];
    return Sums(sums.acc + weight * value, sums.l + weight);
}

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
    // The score quarter this invocation sums: key lid / 4 of a tile, dims first_dim ..
    // end_dim (the last quarter takes what head_dim / 4 leaves).
    let key = lid / LANES_PER_KEY;
    let quarter = lid % LANES_PER_KEY;
    let first_dim = quarter * (p.head_dim / LANES_PER_KEY);
    let end_dim = select(first_dim + p.head_dim / LANES_PER_KEY, p.head_dim,
        quarter == LANES_PER_KEY - 1u);
    var m = LOWEST;
    var sums = Sums(vec2<f32>(0.0), 0.0);
    for (var start = range.x; start < range.y; start += TILE) {
        let count = min(TILE, range.y - start);
        var part = 0.0;
        if key < count {
            let cell = cells[info.cells + start + key];
            let row = cell * p.kv_width + kv_base;
            for (var d = first_dim; d < end_dim; d += 8u) {
                let low = key4(row, d, end_dim);
                let high = key4(row, d + 4u, end_dim);
                part = add_products(part, d, low, end_dim);
                part = add_products(part, d + 4u, high, end_dim);
            }
            if quarter == 0u {
                value_rows[key] = row;
            }
        }
        quarters[lid] = part;
        workgroupBarrier();
        if lid < count {
            let at = LANES_PER_KEY * lid;
            let sum = (quarters[at] + quarters[at + 1u]) + (quarters[at + 2u] + quarters[at + 3u]);
            scores[lid] = sum * p.scale;
        }
        workgroupBarrier();
        var top = m;
        for (var k = 0u; k < count; k++) {
            top = max(top, scores[k]);
        }
        let rescale = exp(m - top);
        m = top;
        sums = Sums(sums.acc * rescale, sums.l * rescale);
        // Each key's weight by an invocation of its own, then summed in key order by all.
        if lid < count {
            weights[lid] = exp(scores[lid] - m);
        }
        workgroupBarrier();
        for (var k = 0u; k < count; k += 8u) {
            let v0 = value2(k, count, lid);
            let v1 = value2(k + 1u, count, lid);
            let v2 = value2(k + 2u, count, lid);
            let v3 = value2(k + 3u, count, lid);
            let v4 = value2(k + 4u, count, lid);
            let v5 = value2(k + 5u, count, lid);
            let v6 = value2(k + 6u, count, lid);
            let v7 = value2(k + 7u, count, lid);
            sums = add_key(sums, k, count, v0);
            sums = add_key(sums, k + 1u, count, v1);
            sums = add_key(sums, k + 2u, count, v2);
            sums = add_key(sums, k + 3u, count, v3);
            sums = add_key(sums, k + 4u, count, v4);
            sums = add_key(sums, k + 5u, count, v5);
            sums = add_key(sums, k + 6u, count, v6);
            sums = add_key(sums, k + 7u, count, v7);
        }
        workgroupBarrier();
    }
    finish(wid, head, q_base, lid, m, sums);
}
