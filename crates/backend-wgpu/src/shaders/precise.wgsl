// Float arithmetic the shader compiler must not simplify, for kernels that repeat the CPU's
// roundings. Needs `p.zero`, a parameter that is always 0.

// Whether the builtin `fma` rounds once; the backend sets it when it probes the adapter
// (`WgpuBackend::fma_is_fused`; lavapipe's rounds the product first).
const FMA_FUSED: bool = false;

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

/// Veltkamp's split of `a` into two halves of 12 significant bits (their products exact).
fn split(a: f32) -> vec2<f32> {
    let c = opaque(4097.0 * a);
    let high = opaque(c - opaque(c - a));
    return vec2<f32>(high, a - high);
}

/// `a * b` and its rounding error (Dekker's two-product, no fused multiply-add needed).
fn two_product(a: f32, b: f32) -> vec2<f32> {
    let p = opaque(a * b);
    let x = split(a);
    let y = split(b);
    let error = ((opaque(x.x * y.x - p) + x.x * y.y) + x.y * y.x) + x.y * y.y;
    return vec2<f32>(p, error);
}

/// `a * b + c` rounded once (but in rare double-rounding cases), as the CPU's fused
/// multiply-add: WGSL's `fma` may round the product first (lavapipe's does).
fn fma_exact(a: f32, b: f32, c: f32) -> f32 {
    if FMA_FUSED {
        return fma(a, b, c);
    }
    let product = two_product(a, b);
    let sum = two_sum(product.x, c);
    return sum.x + (sum.y + product.y);
}

/// `hi + lo` (a float-float, |lo| below half an ulp of hi or so) rounded to odd at f32:
/// rounding that to f16 gives the f16 nearest the exact value, with no double rounding.
fn round_odd(hi: f32, lo: f32) -> f32 {
    let bits = bitcast<u32>(hi);
    if lo == 0.0 || (bits & 1u) == 1u {
        return hi;
    }
    let away = (lo > 0.0) == (hi > 0.0);
    return bitcast<f32>(select(bits - 1u, bits + 1u, away));
}

/// `a * b + c` rounded to odd at f32 (see [`round_odd`]).
fn fma_odd(a: f32, b: f32, c: f32) -> f32 {
    let product = two_product(a, b);
    let sum = two_sum(product.x, c);
    let total = two_sum(sum.x, sum.y + product.y);
    return round_odd(total.x, total.y);
}

/// `a + b` rounded to odd at f32.
fn add_odd(a: f32, b: f32) -> f32 {
    let sum = two_sum(a, b);
    return round_odd(sum.x, sum.y);
}
