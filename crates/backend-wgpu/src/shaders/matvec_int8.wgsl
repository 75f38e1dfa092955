// The matrix-vector kernel's pieces (matvec.wgsl) on int8 activations: the same pieces and
// lane map as matvec_dot.wgsl, but x holds the CPU's rounding of the activations (Q8_0
// blocks of 32 for Q4_0, Q4_1, Q5_0 and Q8_0, Q8_K blocks of 256 for the K-quants) as the
// integers and their block's scale, not as f32 values, and a piece's products are integer
// dot products of four bytes (`dot4_i8`: WGSL's `dot4I8Packed`, or plain arithmetic), scaled
// once a piece. An activation then costs one byte of cache traffic instead of four, and four
// weights one instruction instead of a conversion each.
//
// x's layout (quantize_x.wgsl's modes 7 and 8), in groups of 256 values, 72 words a group
// (288 bytes, so every 16 bytes of integers start on 16 bytes): words 0 .. 64 the 256
// integers, value v of the group in byte v; words 64 .. 72 the scales (f32): mode 7 one a
// block of 32 (word 64 + v / 32), mode 8 one for the group (word 64). Values are numbered
// over all tokens (token t's value i is t · n + i), as the f32 layout numbers them.

// x is read through `x_vec4` (16 bytes: vector i of the layout) and `x_word` (word i):
// from its binding (matvec_int8_x.wgsl), or from workgroup memory where the kernel made the
// rounding itself (matvec_norm.wgsl).

const ONES: u32 = 0x01010101u;

// The 16 integers of values v .. v + 16 (v a multiple of 16).
fn xq16(v: u32) -> vec4<u32> {
    return x_vec4((v >> 8u) * 18u + ((v & 255u) >> 4u));
}

// The 8 integers of values v .. v + 8 (v a multiple of 8).
fn xq8(v: u32) -> vec2<u32> {
    let q = xq16(v & ~15u);
    return select(q.xy, q.zw, (v & 8u) != 0u);
}

// The scale of the block of value v, blocks of 2^shift values (5: Q8_0, 8: Q8_K).
fn xscale(v: u32, shift: u32) -> f32 {
    let word = (v >> 8u) * 72u + 64u + ((v & 255u) >> shift);
    return bitcast<f32>(x_word(word));
}

// Sums of the integers in 8 and 16 bytes.
fn isum8(q: vec2<u32>) -> i32 {
    return dot4_i8(q.x, ONES) + dot4_i8(q.y, ONES);
}

fn isum16(q: vec4<u32>) -> i32 {
    return isum8(q.xy) + isum8(q.zw);
}

// Dot products of 8 and 16 bytes of weights (each byte a value of 0 ..= 127, or any int8)
// with 8 and 16 integers of x.
fn idot8(w: vec2<u32>, q: vec2<u32>) -> i32 {
    return dot4_i8(w.x, q.x) + dot4_i8(w.y, q.y);
}

fn idot16(w: vec4<u32>, q: vec4<u32>) -> i32 {
    return idot8(w.xy, q.xy) + idot8(w.zw, q.zw);
}

const NIBBLES: u32 = 0x0f0f0f0fu;

// The bytes nibble + 16 · high of four bytes: the nibbles of `v` from bit `shift` (0 or 4),
// the high bits those of each byte of `high` from bit `high_shift` under `high_mask`.
fn nibbles_high_bytes(v: u32, shift: u32, high: u32, high_shift: u32, high_mask: u32) -> u32 {
    return ((v >> shift) & NIBBLES) | (((high >> high_shift) & (high_mask * ONES)) << 4u);
}

// Q4_0: pieces as matvec_dot.wgsl's (half the bytes: values 8h .. 8h + 8 and 16 + 8h ..
// 16 + 8h + 8), the nibbles as bytes of 0 ..= 15 and 8 · sum(x) taken off once.
const PIECE_Q4_0: u32 = 16u;
struct Xs_q4_0 {
    lo: vec2<u32>,
    hi: vec2<u32>,
    sum: i32,
    d: f32,
}

fn xs_q4_0(xi: u32, piece: u32) -> Xs_q4_0 {
    let v = xi + 32u * (piece >> 1u) + 8u * (piece & 1u);
    let lo = xq8(v);
    let hi = xq8(v + 16u);
    return Xs_q4_0(lo, hi, isum8(lo) + isum8(hi), xscale(v, 5u));
}

fn dot_q4_0(row: u32, piece: u32, xs: Xs_q4_0) -> f32 {
    let b = row + (piece >> 1u) * 18u;
    let q = words2_at(b + 2u + 8u * (piece & 1u));
    let sum = idot8(q & vec2<u32>(NIBBLES), xs.lo) + idot8((q >> vec2<u32>(4u)) & vec2<u32>(NIBBLES), xs.hi);
    return half_at(b) * xs.d * f32(sum - 8 * xs.sum);
}

// Q4_1 (20 bytes: f16 d, f16 m, the nibbles): value q · d + m, so a piece is
// d · dot(q, x) + m · sum(x).
const PIECE_Q4_1: u32 = 16u;
alias Xs_q4_1 = Xs_q4_0;

fn xs_q4_1(xi: u32, piece: u32) -> Xs_q4_1 {
    return xs_q4_0(xi, piece);
}

fn dot_q4_1(row: u32, piece: u32, xs: Xs_q4_1) -> f32 {
    let b = (row >> 2u) + (piece >> 1u) * 5u;
    let dm = unpack2x16float(weight_word(b));
    let q = vec2<u32>(weight_word(b + 1u + 2u * (piece & 1u)), weight_word(b + 2u + 2u * (piece & 1u)));
    let sum = idot8(q & vec2<u32>(NIBBLES), xs.lo) + idot8((q >> vec2<u32>(4u)) & vec2<u32>(NIBBLES), xs.hi);
    return xs.d * (dm.x * f32(sum) + dm.y * f32(xs.sum));
}

// Q5_0: as Q4_0 with the fifth bits (bytes of 0 ..= 31, 16 · sum(x) taken off).
const PIECE_Q5_0: u32 = 16u;
alias Xs_q5_0 = Xs_q4_0;

fn xs_q5_0(xi: u32, piece: u32) -> Xs_q5_0 {
    return xs_q4_0(xi, piece);
}

fn dot_q5_0(row: u32, piece: u32, xs: Xs_q5_0) -> f32 {
    let b = row + (piece >> 1u) * 22u;
    let first = 8u * (piece & 1u);
    let high = word_at(b + 2u);
    let q = words2_at(b + 6u + first);
    let lo = vec2<u32>(
        (q.x & NIBBLES) | (spread_bits(high >> first) << 4u),
        (q.y & NIBBLES) | (spread_bits(high >> (first + 4u)) << 4u),
    );
    let hi = vec2<u32>(
        ((q.x >> 4u) & NIBBLES) | (spread_bits(high >> (first + 16u)) << 4u),
        ((q.y >> 4u) & NIBBLES) | (spread_bits(high >> (first + 20u)) << 4u),
    );
    let sum = idot8(lo, xs.lo) + idot8(hi, xs.hi);
    return half_at(b) * xs.d * f32(sum - 16 * xs.sum);
}

// Q8_0: a piece is a quarter block (8 values), as matvec_dot.wgsl's.
const PIECE_Q8_0: u32 = 8u;
struct Xs_q8_0 {
    q: vec2<u32>,
    d: f32,
}

fn xs_q8_0(xi: u32, piece: u32) -> Xs_q8_0 {
    let v = xi + 8u * piece;
    return Xs_q8_0(xq8(v), xscale(v, 5u));
}

fn dot_q8_0(row: u32, piece: u32, xs: Xs_q8_0) -> f32 {
    let b = row + (piece >> 2u) * 34u;
    let q = words2_at(b + 2u + 8u * (piece & 3u));
    return half_at(b) * xs.d * f32(idot8(q, xs.q));
}

// Q4_K: a piece is 16 bytes of a run (matvec_dot.wgsl's), values 16h .. 16h + 16 of
// sub-blocks 2c (low nibbles) and 2c + 1 (high), with the sums of their integers for the
// mins. One 16-byte load of x each.
const PIECE_Q4_K: u32 = 32u;
struct Xs_q4_k {
    lo: vec4<u32>,
    hi: vec4<u32>,
    sums: vec2<f32>,
    d: f32,
}

fn xs_q4_k(xi: u32, piece: u32) -> Xs_q4_k {
    let l = piece & 7u;
    let v = xi + 256u * (piece >> 3u) + 64u * (l >> 1u) + 16u * (l & 1u);
    let lo = xq16(v);
    let hi = xq16(v + 32u);
    return Xs_q4_k(lo, hi, vec2<f32>(f32(isum16(lo)), f32(isum16(hi))), xscale(v, 8u));
}

fn dot_q4_k(row: u32, piece: u32, xs: Xs_q4_k) -> f32 {
    let b = (row >> 4u) + (piece >> 3u) * 9u;
    let l = piece & 7u;
    let head = weight_vec(b);
    let q = weight_vec(b + 1u + l);
    let lo = idot16(q & vec4<u32>(NIBBLES), xs.lo);
    let hi = idot16((q >> vec4<u32>(4u)) & vec4<u32>(NIBBLES), xs.hi);
    return xs.d * k4_pair(head, l >> 1u, vec2<f32>(f32(lo), f32(hi)), xs.sums);
}

// Q5_K: Q4_K's pieces with the fifth bits (bytes of 0 ..= 31).
const PIECE_Q5_K: u32 = 32u;
alias Xs_q5_k = Xs_q4_k;

fn xs_q5_k(xi: u32, piece: u32) -> Xs_q5_k {
    return xs_q4_k(xi, piece);
}

fn dot_q5_k(row: u32, piece: u32, xs: Xs_q5_k) -> f32 {
    let b = (row >> 4u) + (piece >> 3u) * 11u;
    let l = piece & 7u;
    let c = l >> 1u;
    let head = weight_vec(b);
    let h = weight_vec(b + 1u + (l & 1u));
    let q = weight_vec(b + 3u + l);
    let lo = vec4<u32>(
        nibbles_high_bytes(q.x, 0u, h.x, 2u * c, 1u),
        nibbles_high_bytes(q.y, 0u, h.y, 2u * c, 1u),
        nibbles_high_bytes(q.z, 0u, h.z, 2u * c, 1u),
        nibbles_high_bytes(q.w, 0u, h.w, 2u * c, 1u),
    );
    let hi = vec4<u32>(
        nibbles_high_bytes(q.x, 4u, h.x, 2u * c + 1u, 1u),
        nibbles_high_bytes(q.y, 4u, h.y, 2u * c + 1u, 1u),
        nibbles_high_bytes(q.z, 4u, h.z, 2u * c + 1u, 1u),
        nibbles_high_bytes(q.w, 4u, h.w, 2u * c + 1u, 1u),
    );
    let sums = vec2<f32>(f32(idot16(lo, xs.lo)), f32(idot16(hi, xs.hi)));
    return xs.d * k4_pair(head, c, sums, xs.sums);
}

// Q6_K: pieces as matvec_dot.wgsl's (8 consecutive l of a half, 4 values of each of its 4
// sets: 32 values); the 6-bit values as bytes of 0 ..= 63, 32 · sum(x) taken off per set.
const PIECE_Q6_K: u32 = 32u;
struct Xs_q6_k {
    q: array<vec2<u32>, 4>,
    sums: vec4<i32>,
    d: f32,
}

fn xs_q6_k(xi: u32, piece: u32) -> Xs_q6_k {
    let l = piece & 7u;
    let v = xi + 256u * (piece >> 3u) + 128u * (l >> 2u) + 8u * (l & 3u);
    let q = array<vec2<u32>, 4>(xq8(v), xq8(v + 32u), xq8(v + 64u), xq8(v + 96u));
    let sums = vec4<i32>(isum8(q[0]), isum8(q[1]), isum8(q[2]), isum8(q[3]));
    return Xs_q6_k(q, sums, xscale(v, 8u));
}

fn dot_q6_k(row: u32, piece: u32, xs: Xs_q6_k) -> f32 {
    let l = piece & 7u;
    return q6_k_dot(q6_k_weights(row + (piece >> 3u) * 210u, l), l, xs);
}

// Piece l's dot product from its weights (matvec_bits.wgsl; matvec_staged.wgsl reads them
// from workgroup memory).
fn q6_k_dot(w: Q6kWeights, l: u32, xs: Xs_q6_k) -> f32 {
    // Set s's scale: byte 2s + m / 2 of the half's 8, as ggml's int8_t.
    let k = 8u * ((l & 3u) >> 1u);
    let sc = vec4<i32>(
        bitcast<i32>(w.scales.x << (24u - k)) >> 24u,
        bitcast<i32>(w.scales.x << (8u - k)) >> 24u,
        bitcast<i32>(w.scales.y << (24u - k)) >> 24u,
        bitcast<i32>(w.scales.y << (8u - k)) >> 24u,
    );
    let s0 = idot8(vec2<u32>(nibbles_high_bytes(w.low0.x, 0u, w.high.x, 0u, 3u), nibbles_high_bytes(w.low0.y, 0u, w.high.y, 0u, 3u)), xs.q[0]);
    let s1 = idot8(vec2<u32>(nibbles_high_bytes(w.low1.x, 0u, w.high.x, 2u, 3u), nibbles_high_bytes(w.low1.y, 0u, w.high.y, 2u, 3u)), xs.q[1]);
    let s2 = idot8(vec2<u32>(nibbles_high_bytes(w.low0.x, 4u, w.high.x, 4u, 3u), nibbles_high_bytes(w.low0.y, 4u, w.high.y, 4u, 3u)), xs.q[2]);
    let s3 = idot8(vec2<u32>(nibbles_high_bytes(w.low1.x, 4u, w.high.x, 6u, 3u), nibbles_high_bytes(w.low1.y, 4u, w.high.y, 6u, 3u)), xs.q[3]);
    let sums = vec4<i32>(s0, s1, s2, s3) - 32 * xs.sums;
    return w.d * xs.d * f32(dot(sc, sums));
}
