// (x0, x1) rotated by `cs`: ggml's rotation as gcc compiles it, the first product of each
// output fused (rope.wgsl's entry points; the RoPE epilogue of the Q/K/V matrix-vector
// kernel, matvec_rope.wgsl).
fn rotate(x0: f32, x1: f32, cs: vec2<f32>) -> vec2<f32> {
    return vec2<f32>(
        fma_exact(x0, cs.x, -opaque(x1 * cs.y)),
        fma_exact(x0, cs.y, opaque(x1 * cs.x)),
    );
}
