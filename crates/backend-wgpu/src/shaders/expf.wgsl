// `expf` (needs precise.wgsl) to within a hair of correct rounding (libm's, which the CPU backend calls, is
// correctly rounded but for rare ties): x = (32 n + j) ln2 / 32 + r with |r| <= ln2 / 64, the
// reduction and 1 + r + r²/2 + r³/6 + r⁴/24 carried in float-float (a value and its error),
// times 2^(j / 32) from a float-float table, times 2^n. The builtin `exp` is allowed 3 ulp
// and more (and lavapipe's is a short polynomial), which is enough to move f16 roundings of
// an attention accumulator. Results below the normal range are 0; arguments are at most
// 88.7 (results up to 2^128 are not kept apart from the largest f32).

var<private> EXP_TABLE_HIGH: array<u32, 32> = array<u32, 32>(
    0x3f800000u, 0x3f82cd87u, 0x3f85aac3u, 0x3f88980fu,
    0x3f8b95c2u, 0x3f8ea43au, 0x3f91c3d3u, 0x3f94f4f0u,
    0x3f9837f0u, 0x3f9b8d3au, 0x3f9ef532u, 0x3fa27043u,
    0x3fa5fed7u, 0x3fa9a15bu, 0x3fad583fu, 0x3fb123f6u,
    0x3fb504f3u, 0x3fb8fbafu, 0x3fbd08a4u, 0x3fc12c4du,
    0x3fc5672au, 0x3fc9b9beu, 0x3fce248cu, 0x3fd2a81eu,
    0x3fd744fdu, 0x3fdbfbb8u, 0x3fe0ccdfu, 0x3fe5b907u,
    0x3feac0c7u, 0x3fefe4bau, 0x3ff5257du, 0x3ffa83b3u,
);
var<private> EXP_TABLE_LOW: array<u32, 32> = array<u32, 32>(
    0x00000000u, 0xb34ea7a9u, 0x334f9891u, 0xb37eda4bu,
    0xb260aba1u, 0xb3697465u, 0x33675624u, 0xb32e0212u,
    0x33231b71u, 0xb30c5563u, 0x33412342u, 0x30c3125au,
    0xb32c9d5eu, 0xb3162b08u, 0xb22deaf6u, 0xb37c5aa8u,
    0x32cfe77au, 0x330ec5f7u, 0xb3414fe8u, 0xb2d6663eu,
    0x320aa837u, 0xb37323a2u, 0x3228fc24u, 0xb35c1daau,
    0xb2d4a58au, 0xb3504a1cu, 0xb21eab59u, 0xb2441be6u,
    0xb24116deu, 0xb348464au, 0x32292436u, 0xb2923758u,
);

fn expf(x: f32) -> f32 {
    if x < -87.33 {
        return 0.0;
    }
    // ln2 / 32 in two parts, the first with 12 trailing zero bits (k · high is exact).
    let ln2_high = bitcast<f32>(0x3cb17000u);
    let ln2_low = bitcast<f32>(0x3585fdf4u);
    let y = min(x, 88.7);
    let k = round(y * bitcast<f32>(0x4238aa3bu));
    let ki = i32(k);
    let j = u32(ki & 31);
    let n = (ki - i32(j)) / 32;
    let r1 = fma(-k, ln2_high, y);
    let product_low = two_product(k, ln2_low);
    let r = two_sum(r1, -product_low.x);
    let r_low = r.y - product_low.y;
    let s = r.x;
    let q = s * s * fma(fma(s, 1.0 / 24.0, 1.0 / 6.0), s, 0.5);
    let e = two_sum(1.0, s);
    let e_low = e.y + (r_low + q);
    let t_high = bitcast<f32>(EXP_TABLE_HIGH[j]);
    let t_low = bitcast<f32>(EXP_TABLE_LOW[j]);
    let product = two_product(t_high, e.x);
    let sum = product.x + (product.y + (t_high * e_low + t_low * e.x));
    return ldexp(sum, n);
}
