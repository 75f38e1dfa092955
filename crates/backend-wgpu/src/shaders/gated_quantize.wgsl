// The gated activation and the rounding of its results for the next matmul in one dispatch
// (`FusedOps::gated_ffn`): invocation b makes values b · block_values .. of x (the gate,
// which becomes the hidden layer) as gated_one.wgsl does, then rounds that block into `rounded` as
// quantize_x_one.wgsl does, reading back its own writes.

struct Params {
    blocks: u32,
    mode: u32,
    zero: u32, // always 0 (`opaque` in precise.wgsl)
    len: u32,  // blocks × block_values
    kind: u32,
    block_values: u32, // 256 in the Q8_K modes (3, 5), else 32
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> rounded: array<u32>;
@group(0) @binding(3) var<storage, read> up: array<f32>;
@group(0) @binding(4) var<storage, read> gelu_table: array<u32>;

fn round_source(i: u32) -> f32 {
    return x[i];
}

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let block = gid.x + gid.y * groups.x * 64u;
    if block >= p.blocks {
        return;
    }
    let base = block * p.block_values;
    for (var j = 0u; j < p.block_values; j++) {
        x[base + j] = activated(base + j, x[base + j], up[base + j]);
    }
    quantize_block(block, p.mode);
}
