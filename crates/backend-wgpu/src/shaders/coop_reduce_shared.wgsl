// quantize_coop.wgsl's block reductions in workgroup memory: a tree over the block's `seg`
// invocations (lanes lane - lane % seg ..), a barrier at each level. Every invocation of the
// workgroup calls them (they hold barriers). The backend puts coop_reduce_subgroup.wgsl's in
// their place where it reduces on subgroups.

// The block's largest magnitude and, in the K-quant modes (`k_mode`), the value of its first
// occurrence (the lowest `index` among equals), as (magnitude, value).
fn coop_block_max(amax: f32, max_value: f32, index: u32, lane: u32, seg: u32, k_mode: bool) -> vec2<f32> {
    coop_abs[lane] = amax;
    coop_value[lane] = max_value;
    coop_index[lane] = index;
    for (var stride = seg / 2u; stride > 0u; stride /= 2u) {
        workgroupBarrier();
        if lane % seg < stride {
            let other = lane + stride;
            let mine = coop_abs[lane];
            let theirs = coop_abs[other];
            if k_mode {
                if theirs > mine || (theirs == mine && coop_index[other] < coop_index[lane]) {
                    coop_abs[lane] = theirs;
                    coop_value[lane] = coop_value[other];
                    coop_index[lane] = coop_index[other];
                }
            } else {
                coop_abs[lane] = max(mine, theirs);
            }
        }
    }
    workgroupBarrier();
    let head = lane - lane % seg;
    return vec2<f32>(coop_abs[head], coop_value[head]);
}

// The block's sum of `sum`.
fn coop_block_sum(sum: i32, lane: u32, seg: u32) -> i32 {
    coop_sum[lane] = sum;
    for (var stride = seg / 2u; stride > 0u; stride /= 2u) {
        workgroupBarrier();
        if lane % seg < stride {
            coop_sum[lane] += coop_sum[lane + stride];
        }
    }
    workgroupBarrier();
    return coop_sum[lane - lane % seg];
}
