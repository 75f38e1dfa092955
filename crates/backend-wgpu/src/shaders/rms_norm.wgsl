// out[r] = x[r] * (1 / sqrt(mean(x[r]²) + eps)) * weight, one workgroup per row.

struct Params {
    width: u32,
    rows: u32,
    eps: f32,
    groups_x: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> weight: array<f32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;

const THREADS: u32 = 64u;
var<workgroup> partial: array<f32, THREADS>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let row = wid.x + wid.y * p.groups_x;
    let base = row * p.width;
    var sum = 0.0;
    if row < p.rows {
        for (var i = lid; i < p.width; i += THREADS) {
            sum += x[base + i] * x[base + i];
        }
    }
    partial[lid] = sum;
    workgroupBarrier();
    for (var span = THREADS / 2u; span > 0u; span >>= 1u) {
        if lid < span {
            partial[lid] += partial[lid + span];
        }
        workgroupBarrier();
    }
    if row >= p.rows {
        return;
    }
    let mean = partial[0] / f32(p.width);
    let scale = 1.0 / sqrt(mean + p.eps);
    for (var i = lid; i < p.width; i += THREADS) {
        out[base + i] = x[base + i] * scale * weight[i];
    }
}
