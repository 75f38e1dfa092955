// The gated activation as its own dispatch (`PrimitiveOps::gated_activation`): gate[i] =
// activated(i, gate[i], up[i]) for i < len.

struct Params {
    len: u32,
    kind: u32,
    zero: u32, // always 0 (`opaque`)
    _pad1: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> up: array<f32>;
@group(0) @binding(2) var<storage, read> gelu_table: array<u32>;
@group(0) @binding(3) var<storage, read_write> gate: array<f32>;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let i = gid.x + gid.y * groups.x * 64u;
    if i < p.len {
        gate[i] = activated(i, gate[i], up[i], p.len, p.kind);
    }
}
