// The matrix-vector entry point with subgroup operations, for adapters whose subgroups hold
// at most 32 invocations (the host checks): `subgroupAdd` sums each subgroup's ROWS sums at
// once, and the THREADS / subgroup_size subgroup sums meet in shared memory, added in
// subgroup order by one invocation a row.

var<workgroup> partials: array<vec4<f32>, THREADS>;

@compute @workgroup_size(THREADS)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
    @builtin(subgroup_invocation_id) sg_lane: u32,
    @builtin(subgroup_size) sg_size: u32,
) {
    prologue(wid, lid);
    let r0 = first_row(wid);
    let sum = subgroupAdd(partial(r0, wid.z, lid));
    if sg_lane == 0u {
        partials[lid / sg_size] = sum;
    }
    workgroupBarrier();
    // The ROWS rows' totals, each added in subgroup order (one component each).
    var totals = vec4<f32>(0.0);
    if lid < ROWS {
        for (var s = 0u; s < THREADS / sg_size; s++) {
            totals += partials[s];
        }
    }
    finish(r0, wid.z, lid, totals);
}
