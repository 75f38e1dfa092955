// coop_reduce_shared.wgsl's block reductions on subgroups, one barrier each: a butterfly of
// shuffles over the block's lanes in each subgroup (masks below the smaller of the block's
// `seg` lanes and the subgroup's size, so lanes meet only lanes of their block), then, where
// a block spans several subgroups, their results through workgroup memory, combined in
// subgroup order by every lane of the block. A workgroup's subgroups are its invocations in
// order. The maximum (with the first index among equal magnitudes) and the integer sum do not
// depend on the order, so the results are the tree's bit for bit.

// Whether (a, i) comes before (b, j): the larger magnitude, then the lower index.
fn coop_first(a: f32, i: u32, b: f32, j: u32) -> bool {
    return a > b || (a == b && i < j);
}

fn coop_block_max(amax: f32, max_value: f32, index: u32, lane: u32, seg: u32, k_mode: bool) -> vec2<f32> {
    let size = subgroupAdd(1u);
    var a = amax;
    var v = max_value;
    var i = index;
    for (var mask = min(seg, size) / 2u; mask > 0u; mask >>= 1u) {
        let other_a = subgroupShuffleXor(a, mask);
        let other_v = subgroupShuffleXor(v, mask);
        let other_i = subgroupShuffleXor(i, mask);
        if k_mode {
            if coop_first(other_a, other_i, a, i) {
                a = other_a;
                v = other_v;
                i = other_i;
            }
        } else {
            a = max(a, other_a);
        }
    }
    if lane % size == 0u {
        coop_abs[lane / size] = a;
        coop_value[lane / size] = v;
        coop_index[lane / size] = i;
    }
    workgroupBarrier();
    if seg > size {
        let first = (lane - lane % seg) / size;
        a = coop_abs[first];
        v = coop_value[first];
        i = coop_index[first];
        for (var g = first + 1u; g < first + seg / size; g++) {
            if k_mode {
                if coop_first(coop_abs[g], coop_index[g], a, i) {
                    a = coop_abs[g];
                    v = coop_value[g];
                    i = coop_index[g];
                }
            } else {
                a = max(a, coop_abs[g]);
            }
        }
    }
    return vec2<f32>(a, v);
}

fn coop_block_sum(sum: i32, lane: u32, seg: u32) -> i32 {
    let size = subgroupAdd(1u);
    var total = sum;
    for (var mask = min(seg, size) / 2u; mask > 0u; mask >>= 1u) {
        total += subgroupShuffleXor(total, mask);
    }
    if lane % size == 0u {
        coop_sum[lane / size] = total;
    }
    workgroupBarrier();
    if seg > size {
        let first = (lane - lane % seg) / size;
        total = 0;
        for (var g = first; g < first + seg / size; g++) {
            total += coop_sum[g];
        }
    }
    return total;
}
