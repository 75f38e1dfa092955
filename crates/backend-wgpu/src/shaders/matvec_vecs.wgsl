// The matrix-vector kernel's weights as 16-byte vectors: the types whose rows and pieces
// start on 16-byte boundaries (F32, F16, BF16: rows of a multiple of 32 values; Q4_K and
// Q5_K: blocks of 144 and 176 bytes), read one vector a load. `weight_elem` reads the
// workgroup's weight (matvec_one.wgsl, or matvec_parts' part).

alias WeightElem = vec4<u32>;

@group(0) @binding(1) var<storage, read> w: array<WeightElem>;

fn weight_vec(i: u32) -> vec4<u32> {
    return weight_elem(i);
}

fn weight_word(i: u32) -> u32 {
    return weight_elem(i >> 2u)[i & 3u];
}
