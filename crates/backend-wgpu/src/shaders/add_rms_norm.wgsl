// The residual add and the next norm (`FusedOps::add_rms_norm`): x += delta, then the RMS
// norm of x into out, one workgroup per row. Each invocation adds the values of the row it
// then reads in `normalize_row` (i ≡ lid mod THREADS), so it reads its own writes.

@group(0) @binding(1) var<storage, read_write> x: array<f32>;
@group(0) @binding(4) var<storage, read> delta: array<f32>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let row = wid.x + wid.y * p.groups_x;
    if row < p.rows {
        let base = row * p.width;
        for (var i = lid; i < p.width; i += THREADS) {
            x[base + i] = x[base + i] + delta[base + i];
        }
    }
    normalize_row(row, lid);
}
