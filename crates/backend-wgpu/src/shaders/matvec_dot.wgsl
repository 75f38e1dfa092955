// The pieces of a row the matrix-vector kernel (matvec.wgsl) hands its invocations, per type:
// `PIECE_TYPE` values a piece, `xs_TYPE(xi, piece)` the piece's activations (token t's from
// x[xi], read once for all the workgroup's rows) and `dot_TYPE(row, piece, xs)` the piece's
// dot product with them in the row whose first byte is `row`. Piece k + 1 lies in the bytes
// after piece k (or beside it in the same block), so a subgroup's load reads a run of
// neighbouring words. Each computes the values of `value_TYPE` (dequant.wgsl), factoring
// the block's scales out of the sums. The 16-byte types read `weight_vec` (matvec_vecs.wgsl),
// the others words (`weight_word`, through bytes.wgsl's helpers where blocks are 2-byte
// aligned).

@group(0) @binding(2) var<storage, read> x: array<vec4<f32>>;

// x[i .. i + 4] (i a multiple of 4).
fn x4(i: u32) -> vec4<f32> {
    return x[i >> 2u];
}

// The four bytes of `v`, lowest first, as floats less `offset` (an integer of at most 2^8):
// each byte is put into the mantissa of 2^23 and 2^23 + offset subtracted, exactly, with no
// integer-to-float conversion (NVIDIA's run at a quarter of the float rate: one a value would
// cap a 4-bit matrix-vector product near half the memory bandwidth of an H100).
fn byte_floats(v: u32, offset: f32) -> vec4<f32> {
    let bytes = (vec4<u32>(v) >> vec4<u32>(0u, 8u, 16u, 24u)) & vec4<u32>(0xffu);
    return bitcast<vec4<f32>>(bytes | vec4<u32>(0x4b000000u)) - (8388608.0 + offset);
}

// The four bytes of `v`, lowest first, each shifted right by `shift` and masked (`mask` at
// most 255 >> shift, so that the whole word shifts at once).
fn bytes4(v: u32, shift: u32, mask: u32) -> vec4<f32> {
    return byte_floats((v >> shift) & (mask * 0x01010101u), 0.0);
}

// The four bytes of `v` as ggml's int8_t, lowest first (each byte + 128 as unsigned).
fn signed4(v: u32) -> vec4<f32> {
    return byte_floats(v ^ 0x80808080u, 128.0);
}

// The values nibble + 16 · high less `offset` of four bytes: the nibbles of `v` from bit
// `shift` (0 or 4), the high bits those of each byte of `high` from bit `high_shift` under
// `high_mask`, put together as integers first (one float a value).
fn nibbles_high(v: u32, shift: u32, high: u32, high_shift: u32, high_mask: u32, offset: f32) -> vec4<f32> {
    let top = ((high >> high_shift) & (high_mask * 0x01010101u)) << 4u;
    return byte_floats(((v >> shift) & 0x0f0f0f0fu) | top, offset);
}

// Sixteen activations from x[i] and x[i + gap] (eight each).
fn x8x2(i: u32, gap: u32) -> array<vec4<f32>, 4> {
    return array<vec4<f32>, 4>(x4(i), x4(i + 4u), x4(i + gap), x4(i + gap + 4u));
}

// F32: a piece is one vector of 4 values.
const PIECE_F32: u32 = 4u;
alias Xs_f32 = vec4<f32>;

fn xs_f32(xi: u32, piece: u32) -> Xs_f32 {
    return x4(xi + 4u * piece);
}

fn dot_f32(row: u32, piece: u32, xs: Xs_f32) -> f32 {
    return dot(bitcast<vec4<f32>>(weight_vec((row >> 4u) + piece)), xs);
}

// F16 and BF16: a piece is one vector of 8 values.
const PIECE_F16: u32 = 8u;
alias Xs_f16 = array<vec4<f32>, 2>;

fn xs_f16(xi: u32, piece: u32) -> Xs_f16 {
    let i = xi + 8u * piece;
    return Xs_f16(x4(i), x4(i + 4u));
}

fn dot_f16(row: u32, piece: u32, xs: Xs_f16) -> f32 {
    let v = weight_vec((row >> 4u) + piece);
    let a = vec4<f32>(unpack2x16float(v.x), unpack2x16float(v.y));
    let b = vec4<f32>(unpack2x16float(v.z), unpack2x16float(v.w));
    return dot(a, xs[0]) + dot(b, xs[1]);
}

const PIECE_BF16: u32 = 8u;
alias Xs_bf16 = Xs_f16;

fn xs_bf16(xi: u32, piece: u32) -> Xs_bf16 {
    return xs_f16(xi, piece);
}

// The two bf16 of a word, lowest first.
fn bf16_pair(v: u32) -> vec2<f32> {
    return bitcast<vec2<f32>>(vec2<u32>(v << 16u, v & 0xffff0000u));
}

fn dot_bf16(row: u32, piece: u32, xs: Xs_bf16) -> f32 {
    let v = weight_vec((row >> 4u) + piece);
    let a = vec4<f32>(bf16_pair(v.x), bf16_pair(v.y));
    let b = vec4<f32>(bf16_pair(v.z), bf16_pair(v.w));
    return dot(a, xs[0]) + dot(b, xs[1]);
}

// Q4_0 (18 bytes): f16 d, 16 bytes whose low nibbles are values 0..16, high ones 16..32.
// A piece is half the bytes: values 8h .. 8h + 8 and 16 + 8h .. 16 + 8h + 8 of half h.
const PIECE_Q4_0: u32 = 16u;
alias Xs_q4_0 = array<vec4<f32>, 4>;

fn xs_q4_0(xi: u32, piece: u32) -> Xs_q4_0 {
    return x8x2(xi + 32u * (piece >> 1u) + 8u * (piece & 1u), 16u);
}

fn dot_q4_0(row: u32, piece: u32, xs: Xs_q4_0) -> f32 {
    let b = row + (piece >> 1u) * 18u;
    let q = words2_at(b + 2u + 8u * (piece & 1u));
    let sum = dot(byte_floats(q.x & 0x0f0f0f0fu, 8.0), xs[0]) + dot(byte_floats(q.y & 0x0f0f0f0fu, 8.0), xs[1])
        + dot(byte_floats((q.x >> 4u) & 0x0f0f0f0fu, 8.0), xs[2]) + dot(byte_floats((q.y >> 4u) & 0x0f0f0f0fu, 8.0), xs[3]);
    return half_at(b) * sum;
}

// Q4_1 (20 bytes, so rows and blocks start on words): f16 d, f16 m, 16 bytes of nibbles as
// Q4_0's; value q · d + m. Pieces as Q4_0's, with the sum of their activations for m.
const PIECE_Q4_1: u32 = 16u;
struct Xs_q4_1 {
    x: array<vec4<f32>, 4>,
    sum: f32,
}

fn xs_q4_1(xi: u32, piece: u32) -> Xs_q4_1 {
    let v = xs_q4_0(xi, piece);
    return Xs_q4_1(v, dot(v[0] + v[1] + v[2] + v[3], vec4<f32>(1.0)));
}

fn dot_q4_1(row: u32, piece: u32, xs: Xs_q4_1) -> f32 {
    let b = (row >> 2u) + (piece >> 1u) * 5u;
    let dm = unpack2x16float(weight_word(b));
    let lo = weight_word(b + 1u + 2u * (piece & 1u));
    let hi = weight_word(b + 2u + 2u * (piece & 1u));
    let sum = dot(bytes4(lo, 0u, 15u), xs.x[0]) + dot(bytes4(hi, 0u, 15u), xs.x[1])
        + dot(bytes4(lo, 4u, 15u), xs.x[2]) + dot(bytes4(hi, 4u, 15u), xs.x[3]);
    return dm.x * sum + dm.y * xs.sum;
}

// Q5_0 (22 bytes): f16 d, 32 fifth bits (bit j for value j), 16 bytes of nibbles; pieces as
// Q4_0's.
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
    let lo0 = byte_floats((q.x & 0x0f0f0f0fu) | (spread_bits(high >> first) << 4u), 16.0);
    let lo1 = byte_floats((q.y & 0x0f0f0f0fu) | (spread_bits(high >> (first + 4u)) << 4u), 16.0);
    let hi0 = byte_floats(((q.x >> 4u) & 0x0f0f0f0fu) | (spread_bits(high >> (first + 16u)) << 4u), 16.0);
    let hi1 = byte_floats(((q.y >> 4u) & 0x0f0f0f0fu) | (spread_bits(high >> (first + 20u)) << 4u), 16.0);
    let sum = dot(lo0, xs[0]) + dot(lo1, xs[1]) + dot(hi0, xs[2]) + dot(hi1, xs[3]);
    return half_at(b) * sum;
}

// Q8_0 (34 bytes): f16 d, 32 signed bytes; a piece is a quarter, 8 values.
const PIECE_Q8_0: u32 = 8u;
alias Xs_q8_0 = array<vec4<f32>, 2>;

fn xs_q8_0(xi: u32, piece: u32) -> Xs_q8_0 {
    let i = xi + 8u * piece;
    return Xs_q8_0(x4(i), x4(i + 4u));
}

fn dot_q8_0(row: u32, piece: u32, xs: Xs_q8_0) -> f32 {
    let b = row + (piece >> 2u) * 34u;
    let q = words2_at(b + 2u + 8u * (piece & 3u));
    return half_at(b) * (dot(signed4(q.x), xs[0]) + dot(signed4(q.y), xs[1]));
}

// Q4_K (144 bytes): f16 d, f16 dmin, 12 bytes of 6-bit scales and mins, then four runs of
// 32 bytes whose low nibbles are sub-block 2c and high ones 2c + 1. A piece is 16 bytes of
// a run (half h of run c: vector 1 + 2c + h of the block): values 16h .. 16h + 16 of both
// sub-blocks, with the sums of their activations for the mins.
const PIECE_Q4_K: u32 = 32u;
struct Xs_q4_k {
    lo: array<vec4<f32>, 4>,
    hi: array<vec4<f32>, 4>,
    sums: vec2<f32>,
}

fn xs_q4_k(xi: u32, piece: u32) -> Xs_q4_k {
    let l = piece & 7u;
    let i = xi + 256u * (piece >> 3u) + 64u * (l >> 1u) + 16u * (l & 1u);
    let lo = array<vec4<f32>, 4>(x4(i), x4(i + 4u), x4(i + 8u), x4(i + 12u));
    let hi = array<vec4<f32>, 4>(x4(i + 32u), x4(i + 36u), x4(i + 40u), x4(i + 44u));
    let one = vec4<f32>(1.0);
    let sums = vec2<f32>(dot(lo[0] + lo[1] + lo[2] + lo[3], one), dot(hi[0] + hi[1] + hi[2] + hi[3], one));
    return Xs_q4_k(lo, hi, sums);
}

fn dot_q4_k(row: u32, piece: u32, xs: Xs_q4_k) -> f32 {
    let b = (row >> 4u) + (piece >> 3u) * 9u;
    let l = piece & 7u;
    let head = weight_vec(b);
    let q = weight_vec(b + 1u + l);
    let lo = dot(bytes4(q.x, 0u, 15u), xs.lo[0]) + dot(bytes4(q.y, 0u, 15u), xs.lo[1])
        + dot(bytes4(q.z, 0u, 15u), xs.lo[2]) + dot(bytes4(q.w, 0u, 15u), xs.lo[3]);
    let hi = dot(bytes4(q.x, 4u, 15u), xs.hi[0]) + dot(bytes4(q.y, 4u, 15u), xs.hi[1])
        + dot(bytes4(q.z, 4u, 15u), xs.hi[2]) + dot(bytes4(q.w, 4u, 15u), xs.hi[3]);
    return k4_pair(head, l >> 1u, vec2<f32>(lo, hi), xs.sums);
}

// Q5_K (176 bytes): as Q4_K with 32 bytes of fifth bits after the scales (bit 2c of byte l
// for value l of sub-block 2c, bit 2c + 1 for sub-block 2c + 1), the runs after them.
// Pieces as Q4_K's; a piece's fifth bits are vector 1 + h of the block.
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
    let lo = dot(nibbles_high(q.x, 0u, h.x, 2u * c, 1u, 0.0), xs.lo[0])
        + dot(nibbles_high(q.y, 0u, h.y, 2u * c, 1u, 0.0), xs.lo[1])
        + dot(nibbles_high(q.z, 0u, h.z, 2u * c, 1u, 0.0), xs.lo[2])
        + dot(nibbles_high(q.w, 0u, h.w, 2u * c, 1u, 0.0), xs.lo[3]);
    let hi = dot(nibbles_high(q.x, 4u, h.x, 2u * c + 1u, 1u, 0.0), xs.hi[0])
        + dot(nibbles_high(q.y, 4u, h.y, 2u * c + 1u, 1u, 0.0), xs.hi[1])
        + dot(nibbles_high(q.z, 4u, h.z, 2u * c + 1u, 1u, 0.0), xs.hi[2])
        + dot(nibbles_high(q.w, 4u, h.w, 2u * c + 1u, 1u, 0.0), xs.hi[3]);
    return k4_pair(head, c, vec2<f32>(lo, hi), xs.sums);
}

// Q6_K (210 bytes): 128 bytes of low nibbles, 64 of high pairs, 16 signed scales, f16 d.
// Half h (128 values) holds, for l < 32, value 32s + l of set s in: the low (s = 0, 1) or
// high (s = 2, 3) nibble of low byte 64h + 32 (s & 1) + l, bits 2s of high byte 128 + 32h
// + l, with scale 8h + 2s + l / 16. A piece is 8 consecutive l of a half (m = l / 8): 32
// values, 4 of each set.
const PIECE_Q6_K: u32 = 32u;
alias Xs_q6_k = array<vec4<f32>, 8>;

fn xs_q6_k(xi: u32, piece: u32) -> Xs_q6_k {
    let l = piece & 7u;
    let i = xi + 256u * (piece >> 3u) + 128u * (l >> 2u) + 8u * (l & 3u);
    return Xs_q6_k(x4(i), x4(i + 4u), x4(i + 32u), x4(i + 36u), x4(i + 64u), x4(i + 68u), x4(i + 96u), x4(i + 100u));
}

fn dot_q6_k(row: u32, piece: u32, xs: Xs_q6_k) -> f32 {
    let l = piece & 7u;
    return q6_k_dot(q6_k_weights(row + (piece >> 3u) * 210u, l), l, xs);
}

// Piece l's dot product from its weights (matvec_bits.wgsl; matvec_staged.wgsl reads them
// from workgroup memory).
fn q6_k_dot(w: Q6kWeights, l: u32, xs: Xs_q6_k) -> f32 {
    // Set s's scale: byte 2s + m / 2 of the half's 8.
    let k = (l & 3u) >> 1u;
    let lo = signed4(w.scales.x);
    let hi = signed4(w.scales.y);
    let sc = vec4<f32>(lo[k], lo[k + 2u], hi[k], hi[k + 2u]);
    let s0 = dot(nibbles_high(w.low0.x, 0u, w.high.x, 0u, 3u, 32.0), xs[0])
        + dot(nibbles_high(w.low0.y, 0u, w.high.y, 0u, 3u, 32.0), xs[1]);
    let s1 = dot(nibbles_high(w.low1.x, 0u, w.high.x, 2u, 3u, 32.0), xs[2])
        + dot(nibbles_high(w.low1.y, 0u, w.high.y, 2u, 3u, 32.0), xs[3]);
    let s2 = dot(nibbles_high(w.low0.x, 4u, w.high.x, 4u, 3u, 32.0), xs[4])
        + dot(nibbles_high(w.low0.y, 4u, w.high.y, 4u, 3u, 32.0), xs[5]);
    let s3 = dot(nibbles_high(w.low1.x, 4u, w.high.x, 6u, 3u, 32.0), xs[6])
        + dot(nibbles_high(w.low1.y, 4u, w.high.y, 6u, 3u, 32.0), xs[7]);
    return w.d * dot(sc, vec4<f32>(s0, s1, s2, s3));
}
