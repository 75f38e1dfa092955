// The float-float sum over the norm's workgroup of each invocation's `sum`, in workgroup
// memory: a tree of THREADS / 2, THREADS / 4, ... additions, a barrier at each level. Every
// invocation calls it (it holds barriers) and gets the total. The backend puts
// norm_sum_subgroup.wgsl's in its place where it runs the norms on subgroups.
fn norm_sum(sum: vec2<f32>, lid: u32) -> vec2<f32> {
    partial[lid] = sum;
    workgroupBarrier();
    for (var span = THREADS / 2u; span > 0u; span >>= 1u) {
        if lid < span {
            partial[lid] = add_ff(partial[lid], partial[lid + span]);
        }
        workgroupBarrier();
    }
    return partial[0];
}
