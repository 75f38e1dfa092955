// Decode attention split over the keys, pass 2 of 2: one workgroup per (query, group of
// p.merge_heads heads) combines the query's chunk records of attention_split.wgsl for each
// head (the softmax of all its keys: each chunk's sums scaled by exp(m_chunk - m), m the
// largest maximum), writes the heads' output, then `round_values`
// (attention_merge_plain.wgsl: nothing; attention_merge_quantize.wgsl: the rounding of the
// group's values for the output projection, whose blocks may span heads: a Q8_K block of
// 256 values is two heads of 128).

@group(0) @binding(1) var<storage, read> partials: array<f32>;
@group(0) @binding(2) var<storage, read> queries: array<Query>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;

/// Invocations a workgroup: four values each of the group's heads (p.merge_heads · head_dim
/// is at most 256).
const TILE: u32 = 64u;
/// attention_split.wgsl's tile of keys.
const SPLIT_TILE: u32 = 32u;
/// Records an invocation reads at once (their loads in flight together, then summed in
/// order): one at a time kept it waiting on the memory at every chunk.
const GROUP: u32 = 8u;

@compute @workgroup_size(TILE)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let info = queries[wid.x];
    // This invocation's values: dims d0 .. d0 + 4 of head `head` (live: of the group's).
    let value = 4u * lid;
    let live = value < p.merge_heads * p.head_dim;
    let in_group = min(value / p.head_dim, p.merge_heads - 1u);
    let head = wid.y * p.merge_heads + in_group;
    let d0 = value - in_group * p.head_dim;
    let group_base = info.row * p.q_width + wid.y * p.merge_heads * p.head_dim;
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
    for (var c0 = 1u; c0 < chunks; c0 += GROUP) {
        var maxima: array<f32, GROUP>;
        for (var c = 0u; c < GROUP; c++) {
            if c0 + c < chunks {
                maxima[c] = partials[(first + c0 + c) * stride];
            }
        }
        for (var c = 0u; c < GROUP; c++) {
            if c0 + c < chunks {
                m = max(m, maxima[c]);
            }
        }
    }
    // This invocation's head dims: d0 .. d0 + 4.
    var l = 0.0;
    var acc = vec4<f32>(0.0);
    for (var c0 = 0u; c0 < chunks; c0 += GROUP) {
        // Each record's maximum, sum and this invocation's 4 values.
        var heads: array<vec2<f32>, GROUP>;
        var values: array<vec4<f32>, GROUP>;
        for (var c = 0u; c < GROUP; c++) {
            if c0 + c < chunks {
                let record = (first + c0 + c) * stride;
                heads[c] = vec2<f32>(partials[record], partials[record + 1u]);
                for (var k = 0u; k < 4u; k++) {
                    let d = d0 + k;
                    if d < p.head_dim {
                        values[c][k] = partials[record + 2u + d];
                    }
                }
            }
        }
        for (var c = 0u; c < GROUP; c++) {
            if c0 + c < chunks {
                let scale = exp(heads[c].x - m);
                l += heads[c].y * scale;
                for (var k = 0u; k < 4u; k++) {
                    if d0 + k < p.head_dim {
                        acc[k] += values[c][k] * scale;
                    }
                }
            }
        }
    }
    let values = acc * select(1.0 / l, 0.0, l == 0.0);
    for (var k = 0u; k < 4u; k++) {
        let d = d0 + k;
        if d < p.head_dim {
            out[q_base + d] = values[k];
        }
    }
    round_values(group_base, lid, values, live);
}
