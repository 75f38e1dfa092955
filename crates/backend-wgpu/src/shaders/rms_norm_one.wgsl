// RMS norm of x into out (`PrimitiveOps::rms_norm`): one workgroup per row.

@group(0) @binding(1) var<storage, read> x: array<f32>;

fn row_values(at: u32) -> vec4<f32> {
    return vec4<f32>(x[at], x[at + 1u], x[at + 2u], x[at + 3u]);
}

fn keep_row(at: u32, values: vec4<f32>) {}

@compute @workgroup_size(THREADS)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let row = wid.x + wid.y * p.groups_x;
    if p.held == 1u {
        normalize_held(row, lid);
    } else {
        normalize_row(row, lid);
    }
}
