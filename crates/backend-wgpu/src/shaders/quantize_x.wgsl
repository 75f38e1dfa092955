// The activations as the CPU's dot products see them (ggml's `vec_dot_type` of the weight):
// mode 0 rounds each block of 32 to Q8_0/Q8_1 (x86 rounding: d = amax / 127, q = round(x · 127
// / amax), value f16(d) · q), mode 1 rounds each value to f16. One invocation per block of 32.

struct Params {
    blocks: u32,
    mode: u32,
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let block = gid.x + gid.y * groups.x * 64u;
    if block >= p.blocks {
        return;
    }
    let base = block * 32u;
    if p.mode == 1u {
        for (var j = 0u; j < 32u; j++) {
            out[base + j] = unpack2x16float(pack2x16float(vec2<f32>(x[base + j], 0.0))).x;
        }
        return;
    }
    var amax = 0.0;
    for (var j = 0u; j < 32u; j++) {
        amax = max(amax, abs(x[base + j]));
    }
    let d = unpack2x16float(pack2x16float(vec2<f32>(amax / 127.0, 0.0))).x;
    let id = select(0.0, 127.0 / amax, amax != 0.0);
    for (var j = 0u; j < 32u; j++) {
        out[base + j] = d * round(x[base + j] * id);
    }
}
