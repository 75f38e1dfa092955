// matvec_int8.wgsl's x in workgroup memory, where a prologue made the rounding
// (matvec_norm.wgsl, matvec_gated.wgsl): ROUNDED_WORDS words, which the host writes.

var<workgroup> rounded: array<u32, ROUNDED_WORDS>;

fn x_vec4(i: u32) -> vec4<u32> {
    return vec4<u32>(rounded[4u * i], rounded[4u * i + 1u], rounded[4u * i + 2u], rounded[4u * i + 3u]);
}

fn x_word(i: u32) -> u32 {
    return rounded[i];
}
