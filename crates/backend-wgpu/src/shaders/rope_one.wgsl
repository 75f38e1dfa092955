// RoPE of one buffer (`PrimitiveOps::rope`): invocation i rotates pair i of x.

@group(0) @binding(2) var<storage, read_write> x: array<f32>;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let i = gid.x + gid.y * groups.x * 64u;
    if i >= p.pairs {
        return;
    }
    let at = pair(i, p.heads);
    let r = rotate(x[at.a], x[at.b], at.cs);
    x[at.a] = r.x;
    x[at.b] = r.y;
}
