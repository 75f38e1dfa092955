// The activations' rounding as its own dispatch (`WgpuBackend::activations_as_cpu`): one
// invocation per block.

struct Params {
    blocks: u32,
    mode: u32,
    zero: u32, // always 0 (`opaque` in precise.wgsl)
    _pad1: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> rounded: array<u32>;

fn round_source(i: u32) -> f32 {
    return x[i];
}

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let block = gid.x + gid.y * groups.x * 64u;
    if block < p.blocks {
        quantize_block(block, p.mode);
    }
}
