// Decode attention split over the keys, pass 2 of 2: one workgroup per (query, head)
// combines the query's chunk records of attention_split.wgsl (the softmax of all its keys:
// each chunk's sums scaled by exp(m_chunk - m), m the largest maximum), writes the head's
// output, then `round_values` (attention_merge_plain.wgsl: nothing;
// attention_merge_quantize.wgsl: the rounding of the head for the output projection).

@group(0) @binding(1) var<storage, read> partials: array<f32>;
@group(0) @binding(2) var<storage, read> queries: array<Query>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;

/// Invocations a workgroup: four head dims each (head_dim is at most 256).
const TILE: u32 = 64u;
/// attention_split.wgsl's tile of keys.
const SPLIT_TILE: u32 = 32u;

@compute @workgroup_size(TILE)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let info = queries[wid.x];
    let head = wid.y;
    let q_base = info.row * p.q_width + head * p.head_dim;
    let first = (wid.x * p.heads + head) * p.chunks;
    let stride = p.head_dim + 2u;
    // Chunks past the keys wrote no record.
    var chunks = 0u;
    for (var c = 0u; c < p.chunks; c++) {
        let keys = chunk_keys(info.lo, info.pos, c, SPLIT_TILE);
        chunks += u32(keys.x < keys.y);
    }
    var m = partials[first * stride];
    for (var c = 1u; c < chunks; c++) {
        m = max(m, partials[(first + c) * stride]);
    }
    // Invocation lid's head dims: 4 lid .. 4 lid + 4.
    var l = 0.0;
    var acc = vec4<f32>(0.0);
    for (var c = 0u; c < chunks; c++) {
        let record = (first + c) * stride;
        let scale = exp(partials[record] - m);
        l += partials[record + 1u] * scale;
        for (var k = 0u; k < 4u; k++) {
            let d = 4u * lid + k;
            if d < p.head_dim {
                acc[k] += partials[record + 2u + d] * scale;
            }
        }
    }
    let values = acc * select(1.0 / l, 0.0, l == 0.0);
    for (var k = 0u; k < 4u; k++) {
        let d = 4u * lid + k;
        if d < p.head_dim {
            out[q_base + d] = values[k];
        }
    }
    round_values(q_base, lid, values);
}
