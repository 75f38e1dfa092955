// The one-chunk split attention's output rounded for the output projection in the same
// dispatch (`FusedOps::attention_output`) where the mode's blocks lie within a head: the
// head's values regrouped through workgroup memory (`query`, free once the keys are done)
// four consecutive ones an invocation, then rounded together (quantize_coop.wgsl) into
// `rounded`, equal bit for bit to quantize_x's rounding of them.

@group(0) @binding(7) var<storage, read_write> rounded: array<u32>;

// The split kernel's invocations round the head's values.
const COOP_LANES: u32 = THREADS;

// quantize_block's source (quantize_x.wgsl), unused here.
fn round_source(i: u32) -> f32 {
    return out[i];
}

fn round_values(q_base: u32, lid: u32, values: vec2<f32>) {
    for (var j = 0u; j < DIMS_PER_THREAD; j++) {
        let d = lid + j * THREADS;
        if d < p.head_dim {
            query[d] = values[j];
        }
    }
    workgroupBarrier();
    let live = 4u * lid < p.head_dim;
    var four = vec4<f32>(0.0);
    if live {
        four = vec4<f32>(query[4u * lid], query[4u * lid + 1u], query[4u * lid + 2u], query[4u * lid + 3u]);
    }
    quantize_coop(q_base, lid, four, live, p.mode);
}
