// The gated activation and the rounding of its results for the next matmul in one dispatch
// (`FusedOps::gated_ffn`): each invocation makes four values of x (the gate, which becomes
// the hidden layer) as gated_one.wgsl does, and the workgroup rounds its 256 into `rounded` as
// quantize_x_one.wgsl does (quantize_coop.wgsl).

struct Params {
    blocks: u32,
    mode: u32,
    zero: u32, // always 0 (`opaque` in precise.wgsl)
    len: u32,  // blocks × block_values
    kind: u32,
    block_values: u32, // 256 in the Q8_K modes (3, 5), else 32
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> rounded: array<u32>;
@group(0) @binding(3) var<storage, read> up: array<f32>;
@group(0) @binding(4) var<storage, read> gelu_table: array<u32>;

// quantize_x.wgsl's serial rounding (unused here) reads through it.
fn round_source(i: u32) -> f32 {
    return x[i];
}

// A workgroup per 256 values (quantize_coop.wgsl), an invocation per 4.
const COOP_LANES: u32 = 64u;

@compute @workgroup_size(COOP_LANES)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let first = (wid.x + wid.y * groups.x) * 256u;
    let at = first + 4u * lid;
    let live = at < p.len;
    var values = vec4<f32>(0.0);
    if live {
        // Every load before the first store (a store to x between them would keep the next
        // load of x waiting for it).
        let gates = vec4<f32>(x[at], x[at + 1u], x[at + 2u], x[at + 3u]);
        let ups = vec4<f32>(up[at], up[at + 1u], up[at + 2u], up[at + 3u]);
        for (var k = 0u; k < 4u; k++) {
            values[k] = activated(at + k, gates[k], ups[k], p.len, p.kind);
        }
        for (var k = 0u; k < 4u; k++) {
            x[at + k] = values[k];
        }
    }
    quantize_coop(first, lid, values, live, p.mode);
}
