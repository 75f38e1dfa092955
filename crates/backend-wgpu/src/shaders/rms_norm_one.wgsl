// RMS norm of x into out (`PrimitiveOps::rms_norm`): one workgroup per row.

@group(0) @binding(1) var<storage, read> x: array<f32>;

@compute @workgroup_size(THREADS)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    normalize_row(wid.x + wid.y * p.groups_x, lid);
}
