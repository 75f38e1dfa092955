// The one-chunk attention's output rounded for the output projection in the same dispatch
// (`FusedOps::attention_output`): the head's blocks (head_dim a multiple of the mode's block)
// rounded into `rounded` as quantize_x_one.wgsl rounds them, from the values the workgroup
// wrote to `out` (hence the storage barrier).

@group(0) @binding(7) var<storage, read_write> rounded: array<u32>;

fn round_source(i: u32) -> f32 {
    return out[i];
}

fn round_output(q_base: u32, lid: u32) {
    storageBarrier();
    let block_values = mode_block_values(p.mode);
    for (var b = lid; b < p.head_dim / block_values; b += TILE) {
        quantize_block(q_base / block_values + b, p.mode);
    }
}
