// The merged attention's output rounded for the output projection in the same dispatch
// (`FusedOps::attention_output`): the group's values (its p.merge_heads heads one after
// another), four an invocation, rounded together by the workgroup (quantize_coop.wgsl; the
// group's values whole blocks of the mode, so a block's invocations are all live or none)
// into `rounded`, equal bit for bit to quantize_x's rounding of them.

@group(0) @binding(4) var<storage, read_write> rounded: array<u32>;

// The merge's invocations (attention_merge.wgsl's TILE) round the group's values.
const COOP_LANES: u32 = TILE;

// quantize_block's source (quantize_x.wgsl), unused here.
fn round_source(i: u32) -> f32 {
    return out[i];
}

fn round_values(group_base: u32, lid: u32, values: vec4<f32>, live: bool) {
    quantize_coop(group_base, lid, values, live, p.mode);
}
