// RoPE of x ([tokens, heads, head_dim]) with the host's (cos, sin) of each token's pairs
// (`RopeParams::angles`, so the angles are the CPU's): pair k of a head is (2k, 2k + 1) in the
// normal style, (k, k + rotary_dim / 2) in the NEOX style; dims past rotary_dim are kept.

struct Params {
    pairs: u32,     // tokens × heads × rotary_dim / 2
    heads: u32,
    head_dim: u32,
    half_rotary: u32,
    neox: u32,
    zero: u32,      // always 0 (`opaque` in precise.wgsl)
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> angles: array<vec2<f32>>; // [tokens, half_rotary]
@group(0) @binding(2) var<storage, read_write> x: array<f32>;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let i = gid.x + gid.y * groups.x * 64u;
    if i >= p.pairs {
        return;
    }
    let k = i % p.half_rotary;
    let head = (i / p.half_rotary) % p.heads;
    let token = i / (p.half_rotary * p.heads);
    let base = (token * p.heads + head) * p.head_dim;
    var a = base + 2u * k;
    var b = a + 1u;
    if p.neox != 0u {
        a = base + k;
        b = a + p.half_rotary;
    }
    let cs = angles[token * p.half_rotary + k];
    let x0 = x[a];
    let x1 = x[b];
    // ggml's rotation as gcc compiles it: the first product of each output fused.
    x[a] = fma_exact(x0, cs.x, -opaque(x1 * cs.y));
    x[b] = fma_exact(x0, cs.y, opaque(x1 * cs.x));
}
