// The matrix-vector kernel's weights as words: the types whose blocks start on 2-byte
// boundaries (Q4_0, Q4_1, Q5_0, Q8_0, Q6_K). `weight_elem` reads the workgroup's weight
// (matvec_one.wgsl, or matvec_parts' part).

alias WeightElem = u32;

@group(0) @binding(1) var<storage, read> w: array<WeightElem>;

fn weight_word(i: u32) -> u32 {
    return weight_elem(i);
}

// Never called for these types (their pieces read words); present for matvec_dot.wgsl.
fn weight_vec(i: u32) -> vec4<u32> {
    return vec4<u32>(weight_elem(4u * i), weight_elem(4u * i + 1u), weight_elem(4u * i + 2u), weight_elem(4u * i + 3u));
}
