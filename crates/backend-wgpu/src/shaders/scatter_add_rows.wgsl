// dst[rows[i]] += scales[i] * src[i], one thread per column walking the rows in order (a row
// may repeat; the order is the CPU's).

struct Params {
    count: u32, // rows
    width: u32,
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> src: array<f32>;
@group(0) @binding(2) var<storage, read> rows: array<u32>;
@group(0) @binding(3) var<storage, read> scales: array<f32>;
@group(0) @binding(4) var<storage, read_write> dst: array<f32>;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let j = gid.x + gid.y * groups.x * 64u;
    if j >= p.width {
        return;
    }
    for (var i = 0u; i < p.count; i++) {
        let product = scales[i] * src[i * p.width + j];
        dst[rows[i] * p.width + j] += product;
    }
}
