// The biases of the Q, K and V projections in one dispatch: x_n[t][j] += bias_n[j] over the
// first len_n = tokens × width_n elements of each x_n, the three ranges one after another.

struct Params {
    len0: u32,
    len1: u32,
    len2: u32,
    width0: u32,
    width1: u32,
    width2: u32,
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> bias0: array<f32>;
@group(0) @binding(2) var<storage, read_write> x0: array<f32>;
@group(0) @binding(3) var<storage, read> bias1: array<f32>;
@group(0) @binding(4) var<storage, read_write> x1: array<f32>;
@group(0) @binding(5) var<storage, read> bias2: array<f32>;
@group(0) @binding(6) var<storage, read_write> x2: array<f32>;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let i = gid.x + gid.y * groups.x * 64u;
    if i < p.len0 {
        x0[i] += bias0[i % p.width0];
        return;
    }
    let j = i - p.len0;
    if j < p.len1 {
        x1[j] += bias1[j % p.width1];
        return;
    }
    let k = j - p.len1;
    if k < p.len2 {
        x2[k] += bias2[k % p.width2];
    }
}
