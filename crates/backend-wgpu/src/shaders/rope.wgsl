// RoPE of x ([tokens, heads, head_dim]) with the host's (cos, sin) of each token's pairs
// (`RopeParams::angles`, so the angles are the CPU's): pair k of a head is (2k, 2k + 1) in the
// normal style, (k, k + rotary_dim / 2) in the NEOX style; dims past rotary_dim are kept.
// The entry points (rope_one.wgsl: one buffer; rope_pair.wgsl: queries and keys;
// rope_kv_write.wgsl: queries and keys, then the cache write) rotate each pair by `pair` and
// `rotate`.

struct Params {
    pairs: u32,        // tokens × heads × rotary_dim / 2 (of the first buffer)
    heads: u32,        // of the first buffer
    head_dim: u32,
    half_rotary: u32,
    neox: u32,
    zero: u32,         // always 0 (`opaque` in precise.wgsl)
    pairs_second: u32, // of the second buffer (rope_pair.wgsl, rope_kv_write.wgsl)
    heads_second: u32,
    entries: u32,      // rope_kv_write.wgsl: the key rows, each written to a cell
    cache_width: u32,  // rope_kv_write.wgsl: of both caches' rows
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> angles: array<vec2<f32>>; // [tokens, half_rotary]

// Pair `i` of a buffer of `heads` heads: the indices of its two values and its (cos, sin).
struct Pair {
    a: u32,
    b: u32,
    cs: vec2<f32>,
}

fn pair(i: u32, heads: u32) -> Pair {
    let k = i % p.half_rotary;
    let head = (i / p.half_rotary) % heads;
    let token = i / (p.half_rotary * heads);
    let base = (token * heads + head) * p.head_dim;
    var a = base + 2u * k;
    var b = a + 1u;
    if p.neox != 0u {
        a = base + k;
        b = a + p.half_rotary;
    }
    return Pair(a, b, angles[token * p.half_rotary + k]);
}

// `rotate` (rotate.wgsl) turns a pair.
