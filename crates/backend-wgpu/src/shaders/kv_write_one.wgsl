// The cache write of keys and values as its own dispatch (`PrimitiveOps::kv_write`): one
// invocation per unit, the keys' first.

struct Params {
    len_k: u32, // the keys' invocations: entries × row_units
    len_v: u32, // the values'
    width_k: u32,
    width_v: u32,
    zero: u32, // always 0 (`opaque` in precise.wgsl: the roundings' divisions)
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> k: array<f32>;
@group(0) @binding(2) var<storage, read> v: array<f32>;
@group(0) @binding(3) var<storage, read> pairs: array<u32>; // [entries, 2]
@group(0) @binding(4) var<storage, read_write> k_cache: array<u32>;
@group(0) @binding(5) var<storage, read_write> v_cache: array<u32>;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let n = gid.x + gid.y * groups.x * 64u;
    if n >= p.len_k + p.len_v {
        return;
    }
    keys = n < p.len_k;
    let i = select(n - p.len_k, n, keys);
    write_unit(i, select(V_TYPE, K_TYPE, keys), select(p.width_v, p.width_k, keys));
}
