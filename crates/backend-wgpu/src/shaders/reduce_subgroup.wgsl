// The matrix-vector entry point with subgroup operations, for adapters whose subgroups hold
// at most LANES invocations (the host checks): `subgroupAdd` sums each subgroup, and a row's
// LANES / subgroup_size subgroup sums meet in shared memory. Subgroups are taken to be runs of
// consecutive invocation indices, as the drivers lay out one-dimensional workgroups.

var<workgroup> partials: array<f32, 128>;

@compute @workgroup_size(128)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
    @builtin(subgroup_invocation_id) sg_lane: u32,
    @builtin(subgroup_size) sg_size: u32,
) {
    let r = row_of(wid, lid);
    let sum = subgroupAdd(partial(r, wid.z, lid % LANES));
    if sg_lane == 0u {
        partials[lid / sg_size] = sum;
    }
    workgroupBarrier();
    if lid % LANES == 0u {
        let first = lid / sg_size;
        var total = 0.0;
        for (var s = 0u; s < LANES / sg_size; s++) {
            total += partials[first + s];
        }
        store(r, wid.z, total);
    }
}
