// The activations' rounding as its own dispatch (`WgpuBackend::activations_as_cpu`).

struct Params {
    blocks: u32,
    mode: u32,
    zero: u32, // always 0 (`opaque` in precise.wgsl)
    _pad1: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> rounded: array<u32>;

fn round_source(i: u32) -> f32 {
    return x[i];
}

// A workgroup per 256 values (quantize_coop.wgsl).
const COOP_LANES: u32 = 64u;

@compute @workgroup_size(COOP_LANES)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let first = (wid.x + wid.y * groups.x) * 256u;
    let at = first + 4u * lid;
    let live = at < p.blocks * mode_block_values(p.mode);
    var values = vec4<f32>(0.0);
    if live {
        values = vec4<f32>(x[at], x[at + 1u], x[at + 2u], x[at + 3u]);
    }
    quantize_coop(first, lid, values, live, p.mode);
}
