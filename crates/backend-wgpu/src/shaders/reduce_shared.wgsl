// The matrix-vector entry point without subgroup operations: each row's LANES partial sums
// meet in a shared-memory tree (a fixed order).

var<workgroup> partials: array<f32, 128>;

@compute @workgroup_size(128)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let r = row_of(wid, lid);
    let lane = lid % LANES;
    partials[lid] = partial(r, wid.z, lane);
    workgroupBarrier();
    for (var span = LANES / 2u; span > 0u; span >>= 1u) {
        if lane < span {
            partials[lid] += partials[lid + span];
        }
        workgroupBarrier();
    }
    if lane == 0u {
        store(r, wid.z, partials[lid]);
    }
}
