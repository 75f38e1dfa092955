// The residual add and the next norm: one workgroup per row.

@compute @workgroup_size(THREADS)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let row = wid.x + wid.y * p.groups_x;
    if p.held == 1u {
        normalize_held(row, lid);
    } else {
        add_residual(row, lid);
        normalize_row(row, lid);
    }
}
