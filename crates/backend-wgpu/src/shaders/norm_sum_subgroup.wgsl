// norm_sum_shared.wgsl's total with subgroup operations and one barrier (`WgpuBackend::
// with_subgroup_reductions`): a butterfly of shuffles in each subgroup (add_ff is commutative bit
// for bit, so every lane ends with the same sum), the subgroups' sums through workgroup
// memory, then in every subgroup lane l adds those of subgroups l, l + size, ... in turn and a
// second butterfly sums the lanes. A workgroup's subgroups are its invocations in order, as
// on the adapters the backend allows subgroups on. The order of the additions differs from
// the tree's; the mean's rounding is the CPU's either way (tests/parity.rs).
fn norm_sum(sum: vec2<f32>, lid: u32) -> vec2<f32> {
    let size = subgroupAdd(1u);
    let lane = subgroupExclusiveAdd(1u);
    var own = sum;
    for (var mask = size / 2u; mask > 0u; mask >>= 1u) {
        own = add_ff(own, vec2<f32>(subgroupShuffleXor(own.x, mask), subgroupShuffleXor(own.y, mask)));
    }
    if lane == 0u {
        partial[lid / size] = own;
    }
    workgroupBarrier();
    var total = vec2<f32>(0.0, 0.0);
    for (var group = lane; group < THREADS / size; group += size) {
        total = add_ff(total, partial[group]);
    }
    for (var mask = size / 2u; mask > 0u; mask >>= 1u) {
        total = add_ff(total, vec2<f32>(subgroupShuffleXor(total.x, mask), subgroupShuffleXor(total.y, mask)));
    }
    return total;
}
