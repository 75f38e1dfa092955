// gate[i] = activation(gate[i]) * up[i] for i < len: SiLU (kind 0) or GELU-tanh (kind 1)
// through ggml's table of f16 results (`runit_backend::gelu`, packed two entries a word).

struct Params {
    len: u32,
    kind: u32,
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> up: array<f32>;
@group(0) @binding(2) var<storage, read> gelu_table: array<u32>;
@group(0) @binding(3) var<storage, read_write> gate: array<f32>;

fn gelu(x: f32) -> f32 {
    if x <= -10.0 {
        return 0.0;
    }
    if x >= 10.0 {
        return x;
    }
    let bits = pack2x16float(vec2<f32>(x, 0.0)) & 0xffffu;
    let word = gelu_table[bits >> 1u] >> ((bits & 1u) * 16u);
    return unpack2x16float(word & 0xffffu).x;
}

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let i = gid.x + gid.y * groups.x * 64u;
    if i >= p.len {
        return;
    }
    let x = gate[i];
    if p.kind == 0u {
        gate[i] = x / (1.0 + exp(-x)) * up[i];
    } else if x >= 10.0 {
        gate[i] = x * up[i];
    } else {
        gate[i] = gelu(x) * up[i];
    }
}
