// matvec_int8.wgsl's x from its binding: the rounding another dispatch made.

@group(0) @binding(2) var<storage, read> x: array<vec4<u32>>;

fn x_vec4(i: u32) -> vec4<u32> {
    return x[i];
}

fn x_word(i: u32) -> u32 {
    return x[i >> 2u][i & 3u];
}
