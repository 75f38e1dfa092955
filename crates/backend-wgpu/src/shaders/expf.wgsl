// `expf` as glibc computes it (the CPU backend calls libm's; `sysdeps/ieee754/flt-32/e_expf.c`,
// needs precise.wgsl), whose double arithmetic is carried here in float-floats: k = round(x ·
// 32 / ln2), r = x · 32 / ln2 - k, y = (C0 r + C1) r² + (C2 r + 1), result y · 2^((k mod 32) /
// 32) · 2^floor(k / 32), the constants and table glibc's doubles (split into f32 parts).
// glibc's result is not always the correctly rounded one (0.502 ulp at worst: exp(-4.381999)
// rounds up), so a correctly rounded exp differs from it now and then. An f32 model of this
// code (no fused multiply-add, as lavapipe's `fma` is not fused) equals glibc's `expf` on
// every f32 in [-87.33, 0] but 6 of 1.1e9. Results below the normal range are 0; arguments
// are at most 88.72 (results up to 2^128 are not kept apart from the largest f32).

// glibc's 2^(j / 32) (`__exp2f_data.tab[j]` + j << 47, doubles) in three f32 parts each.
var<private> EXP_TABLE: array<u32, 96> = array<u32, 96>(
    0x3f800000u, 0x00000000u, 0x00000000u,
    0x3f82cd87u, 0xb34ea7a9u, 0x26800000u,
    0x3f85aac3u, 0x334f9891u, 0xa5800000u,
    0x3f88980fu, 0xb37eda4bu, 0x25800000u,
    0x3f8b95c2u, 0xb260aba1u, 0xa5800000u,
    0x3f8ea43au, 0xb3697465u, 0xa6c00000u,
    0x3f91c3d3u, 0x33675624u, 0xa7000000u,
    0x3f94f4f0u, 0xb32e0212u, 0x25800000u,
    0x3f9837f0u, 0x33231b71u, 0x26a00000u,
    0x3f9b8d3au, 0xb30c5563u, 0xa6a00000u,
    0x3f9ef532u, 0x33412342u, 0x26000000u,
    0x3fa27043u, 0x30c3125au, 0x00000000u,
    0x3fa5fed7u, 0xb32c9d5eu, 0x26e00000u,
    0x3fa9a15bu, 0xb3162b08u, 0x26000000u,
    0x3fad583fu, 0xb22deaf6u, 0x25800000u,
    0x3fb123f6u, 0xb37c5aa8u, 0x26a00000u,
    0x3fb504f3u, 0x32cfe77au, 0xa6400000u,
    0x3fb8fbafu, 0x330ec5f7u, 0x26800000u,
    0x3fbd08a4u, 0xb3414fe8u, 0x26e00000u,
    0x3fc12c4du, 0xb2d6663eu, 0x26400000u,
    0x3fc5672au, 0x320aa837u, 0xa5800000u,
    0x3fc9b9beu, 0xb37323a2u, 0x26a00000u,
    0x3fce248cu, 0x3228fc24u, 0x00000000u,
    0x3fd2a81eu, 0xb35c1daau, 0xa6400000u,
    0x3fd744fdu, 0xb2d4a58au, 0xa6400000u,
    0x3fdbfbb8u, 0xb3504a1cu, 0x26e00000u,
    0x3fe0ccdfu, 0xb21eab59u, 0x00000000u,
    0x3fe5b907u, 0xb2441be6u, 0x25800000u,
    0x3feac0c7u, 0xb24116deu, 0xa5800000u,
    0x3fefe4bau, 0xb348464au, 0xa5800000u,
    0x3ff5257du, 0x32292436u, 0x26000000u,
    0x3ffa83b3u, 0xb2923758u, 0x00000000u,
);

/// `a + b` normalized, for |a| >= |b| (Dekker's fast two-sum, its step kept opaque).
fn fast_two_sum(a: f32, b: f32) -> vec2<f32> {
    let s = opaque(a + b);
    return vec2<f32>(s, b - opaque(s - a));
}

/// The product of two float-floats, normalized.
fn ff_mul(a: vec2<f32>, b: vec2<f32>) -> vec2<f32> {
    let product = two_product(a.x, b.x);
    return fast_two_sum(product.x, product.y + (a.x * b.y + a.y * b.x));
}

/// The sum of two float-floats, normalized.
fn ff_add(a: vec2<f32>, b: vec2<f32>) -> vec2<f32> {
    let sum = two_sum(a.x, b.x);
    return fast_two_sum(sum.x, sum.y + (a.y + b.y));
}

fn expf(x: f32) -> f32 {
    if x < -87.33 {
        return 0.0;
    }
    let y = min(x, 88.72);
    // z = y · 32 / ln2 (glibc's `InvLn2N` in three parts; the first two products exact).
    let z0 = two_product(y, bitcast<f32>(0x4238aa3bu));
    let z1 = two_product(y, bitcast<f32>(0x35257060u));
    let z2 = y * bitcast<f32>(0xa8800000u);
    let k = round(z0.x + z1.x);
    // r = z - k (z0.x - k is exact).
    let r = ff_add(fast_two_sum(z0.x - k, z1.x), vec2<f32>(z0.y, z1.y + z2));
    let ki = i32(k);
    let j = u32(ki & 31);
    let n = (ki - i32(j)) >> 5u;
    // glibc's `poly_scaled` C0, C1, C2.
    let c0 = vec2<f32>(bitcast<f32>(0x35e357c2u), bitcast<f32>(0x29391239u));
    let c1 = vec2<f32>(bitcast<f32>(0x3975fe73u), bitcast<f32>(0xacf053b1u));
    let c2 = vec2<f32>(bitcast<f32>(0x3cb17218u), bitcast<f32>(0xae73ad2au));
    let high = ff_add(ff_mul(c0, r), c1);
    let poly = ff_add(ff_mul(high, ff_mul(r, r)), ff_add(ff_mul(c2, r), vec2<f32>(1.0, 0.0)));
    let t0 = bitcast<f32>(EXP_TABLE[3u * j]);
    let t1 = bitcast<f32>(EXP_TABLE[3u * j + 1u]);
    let t2 = bitcast<f32>(EXP_TABLE[3u * j + 2u]);
    let product = two_product(poly.x, t0);
    let low = product.y + ((poly.x * t1 + poly.y * t0) + (poly.x * t2 + poly.y * t1));
    return ldexp(product.x + low, n);
}
