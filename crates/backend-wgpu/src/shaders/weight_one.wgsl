// Word i of the kernel's one weight chunk, `w` (bytes.wgsl reads blocks through it).
fn weight_word(i: u32) -> u32 {
    return w[i];
}
