// Float arithmetic the shader compiler must not simplify, for kernels that repeat the CPU's
// roundings. Needs `p.zero`, a parameter that is always 0.

/// Hides `v` from the shader compiler's algebra: an inexact `(a + b) - a` may be folded to
/// `b`, which would erase the two-sums' errors. Needs `p.zero`, a parameter that is 0.
fn opaque(v: f32) -> f32 {
    return bitcast<f32>(bitcast<u32>(v) | p.zero);
}

/// `a + b` and its rounding error (Knuth's two-sum; its steps kept opaque).
fn two_sum(a: f32, b: f32) -> vec2<f32> {
    let s = opaque(a + b);
    let bp = opaque(s - a);
    let ap = opaque(s - bp);
    return vec2<f32>(s, (a - ap) + (b - bp));
}
