// The matrix-vector kernel of one weight: part 0 only (its `write_out` is the host's:
// plain, or with the residual epilogue, `kernels::matvec_source`).

fn part_of(group: u32) -> u32 {
    return 0u;
}

fn weight_elem(i: u32) -> WeightElem {
    return w[i];
}
