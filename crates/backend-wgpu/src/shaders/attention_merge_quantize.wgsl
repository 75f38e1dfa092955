// The merged attention's output rounded for the output projection in the same dispatch
// (`FusedOps::attention_output`): the head's values, four an invocation, rounded together
// by the workgroup (quantize_coop.wgsl; head_dim a multiple of the mode's block, so a
// block's invocations are all live or none) into `rounded`, equal bit for bit to
// quantize_x's rounding of them.

@group(0) @binding(4) var<storage, read_write> rounded: array<u32>;

// quantize_block's source (quantize_x.wgsl), unused here.
fn round_source(i: u32) -> f32 {
    return out[i];
}

fn round_values(q_base: u32, lid: u32, values: vec4<f32>) {
    quantize_coop(q_base, lid, values, 4u * lid < p.head_dim, p.mode);
}
