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

/// The float-float sum of `a` and `b`.
fn add_ff(a: vec2<f32>, b: vec2<f32>) -> vec2<f32> {
    let s = two_sum(a.x, b.x);
    return two_sum(s.x, s.y + (a.y + b.y));
}

/// The RMS norm's scale 1 / sqrt(mean + eps) of a row of `width` values whose squares sum
/// to the float-float `total`, the mean f32(total / width): the quotient of the high part,
/// corrected by the remainder.
fn rms_scale(total: vec2<f32>, width: u32, eps: f32) -> f32 {
    let n = f32(width);
    let q = div_rn(total.x, n);
    let remainder = fma_exact(-q, n, total.x) + total.y;
    let mean = q + div_rn(remainder, n);
    return div_rn(1.0, sqrt_rn(mean + eps));
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

/// Most ulps `div_rn` and `sqrt_rn` move a start: the driver's error plus the tests' shift of
/// up to three (on NVIDIA's 580 driver 3-ulp starts ended one ulp short after four steps). The
/// loop stops once it holds the nearest value, so the bound costs nothing when starts are near.
const STEPS_RN: u32 = 8u;

/// `a / b` rounded to nearest (ties to even), as the CPU divides: a driver's `/` may be a few
/// ulps off (Vulkan allows 2.5 ulps; a constant divisor may become a reciprocal's product).
/// The driver's quotient is moved an ulp at a time while the exact remainder `a - q b`
/// (`fma_exact`) says a neighbour is nearer. Operands or quotients outside [2^-100, 2^100]
/// in magnitude (zeros, infinities and NaNs among them) keep the driver's quotient.
fn div_rn(a: f32, b: f32) -> f32 {
    return div_from(opaque(a / b), a, b);
}

/// `div_rn` from the quotient `start` (a few ulps from a / b; tests start it off on purpose).
fn div_from(start: f32, a: f32, b: f32) -> f32 {
    var q = start;
    let lo = 7.8886e-31; // 2^-100
    let hi = 1.2676e30; // 2^100
    if !(abs(q) >= lo && abs(q) <= hi && abs(a) >= lo && abs(a) <= hi && abs(b) >= lo && abs(b) <= hi) {
        return q;
    }
    for (var i = 0u; i < STEPS_RN; i++) {
        let r = fma_exact(-q, b, a);
        if r == 0.0 {
            break;
        }
        let bits = bitcast<u32>(q);
        // Whether the exact quotient lies away from zero from q (else toward zero).
        let away = ((r > 0.0) == (b > 0.0)) == (q > 0.0);
        let ulp = bitcast<f32>((bits & 0x7f800000u) - (23u << 23u));
        // The neighbour toward zero of a power of two is half an ulp away.
        let gap = select(ulp, 0.5 * ulp, !away && (bits & 0x7fffffu) == 0u);
        let half = abs(b) * gap * 0.5;
        if abs(r) < half || (abs(r) == half && (bits & 1u) == 0u) {
            break;
        }
        q = bitcast<f32>(select(bits - 1u, bits + 1u, away));
    }
    return q;
}

/// `sqrt(x)` rounded to nearest, as the CPU's `sqrtf`: a driver's may be ulps off. The
/// driver's root s is moved an ulp at a time while `x` lies past the midpoint to a neighbour
/// (x - (s ± g/2)² = (x - s²) ± s g - g²/4, with x - s² from Dekker's exact square). `x`
/// outside [2^-60, 2^60] keeps the driver's root.
fn sqrt_rn(x: f32) -> f32 {
    return sqrt_from(opaque(sqrt(x)), x);
}

/// `sqrt_rn` from the root `start` (a few ulps from sqrt(x)).
fn sqrt_from(start: f32, x: f32) -> f32 {
    var s = start;
    if !(x >= 8.6736e-19 && x <= 1.1529e18) {
        return s;
    }
    for (var i = 0u; i < STEPS_RN; i++) {
        let square = two_product(s, s);
        let r = opaque(x - square.x) - square.y; // x - s², x - s².hi exact (Sterbenz)
        if r == 0.0 {
            break;
        }
        let bits = bitcast<u32>(s);
        let ulp = bitcast<f32>((bits & 0x7f800000u) - (23u << 23u));
        if r > 0.0 {
            if opaque(r - s * ulp) <= 0.25 * ulp * ulp {
                break;
            }
            s = bitcast<f32>(bits + 1u);
        } else {
            let gap = select(ulp, 0.5 * ulp, (bits & 0x7fffffu) == 0u);
            if opaque(r + s * gap) >= 0.25 * gap * gap {
                break;
            }
            s = bitcast<f32>(bits - 1u);
        }
    }
    return s;
}


/// The bits of `x` rounded to the nearest f16 (ties to even), as the CPU converts (F16C, and
/// ggml's scalar code): WGSL leaves `pack2x16float`'s rounding to the implementation, and
/// NVIDIA's Vulkan driver (580) did not round f16 scales to nearest where lavapipe does.
/// Magnitudes from 65520 give infinity; NaNs stay NaNs.
fn f16_bits_rn(x: f32) -> u32 {
    let bits = bitcast<u32>(x);
    let sign = (bits >> 16u) & 0x8000u;
    let a = bits & 0x7fffffffu;
    if a >= 0x7f800000u {
        return sign | select(0x7c00u, 0x7e00u | ((a >> 13u) & 0x3ffu), a > 0x7f800000u);
    }
    if a >= 0x477ff000u {
        return sign | 0x7c00u;
    }
    if a >= 0x38800000u {
        // A normal f16: the exponent rebased by 127 - 15, the mantissa rounded to 10 bits.
        let m = a - 0x38000000u;
        return sign | ((m + 0xfffu + ((m >> 13u) & 1u)) >> 13u);
    }
    // Below 2^-14: a subnormal f16 in units of 2^-24 (zero at or below 2^-25).
    let e = a >> 23u;
    if e < 102u {
        return sign;
    }
    let mantissa = (a & 0x7fffffu) | 0x800000u;
    let shift = 126u - e;
    let q = mantissa >> shift;
    let rest = mantissa & ((1u << shift) - 1u);
    let half = 1u << (shift - 1u);
    return sign | (q + select(0u, 1u, rest > half || (rest == half && (q & 1u) == 1u)));
}

/// `x` rounded to the nearest f16 (ties to even), as an f32.
fn f16_rn(x: f32) -> f32 {
    return unpack2x16float(f16_bits_rn(x)).x;
}

/// `a` and `b` rounded to the nearest f16s, packed as `pack2x16float` packs them.
fn pack_f16_rn(a: f32, b: f32) -> u32 {
    return f16_bits_rn(a) | (f16_bits_rn(b) << 16u);
}
