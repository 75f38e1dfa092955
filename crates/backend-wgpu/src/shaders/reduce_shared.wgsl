// The matrix-vector entry point without subgroup operations: the invocations' sums (ROWS
// rows each) meet in a shared-memory tree (a fixed order).

var<workgroup> partials: array<vec4<f32>, THREADS>;

@compute @workgroup_size(THREADS)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    prologue(wid, lid);
    let r0 = first_row(wid);
    partials[lid] = partial(r0, wid.z, lid);
    workgroupBarrier();
    for (var span = THREADS / 2u; span > 0u; span >>= 1u) {
        if lid < span {
            partials[lid] += partials[lid + span];
        }
        workgroupBarrier();
    }
    finish(r0, wid.z, lid, partials[0]);
}
