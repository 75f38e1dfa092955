// The matrix-vector kernel of one weight: part 0 only.

fn part_of(group: u32) -> u32 {
    return 0u;
}

fn weight_elem(i: u32) -> WeightElem {
    return w[i];
}

fn write_out(i: u32, value: f32) {
    out[i] = value;
}
