// RoPE of a step's queries and keys and the write of its keys and values into their caches
// in one dispatch (`FusedOps::rope_kv_write` where the caches take rows as they are, without
// a Hadamard rotation): workgroup e < p.entries rotates the pairs of entry e's key row in
// place (`pair` and `rotate` of rope.wgsl, as rope_pair.wgsl does), then, after a storage
// barrier, writes that row and the value row into their cells (`write_unit` of kv_write.wgsl,
// as kv_write_one.wgsl does); the workgroups after it rotate the queries' pairs, THREADS each.
// A decode step's one key row is the long pole: with 64 invocations a 7B's row (4 heads of
// 128: 256 pairs, 256 words a cache) took 4 steps of RoPE and 4 of each cache's write, each
// step's load waiting on the last step's store; with 256, one step each.

@group(0) @binding(2) var<storage, read_write> q: array<f32>;
@group(0) @binding(3) var<storage, read_write> k: array<f32>;
@group(0) @binding(4) var<storage, read> v: array<f32>;
@group(0) @binding(5) var<storage, read> pairs: array<u32>; // [entries, 2]
@group(0) @binding(6) var<storage, read_write> k_cache: array<u32>;
@group(0) @binding(7) var<storage, read_write> v_cache: array<u32>;

// Invocations a workgroup (`ROPE_KV_THREADS` in rope.rs).
const THREADS: u32 = 256u;

@compute @workgroup_size(THREADS)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
    @builtin(num_workgroups) groups: vec3<u32>,
) {
    let group = wid.x + wid.y * groups.x;
    if group >= p.entries {
        let i = (group - p.entries) * THREADS + lid;
        if i < p.pairs {
            let at = pair(i, p.heads);
            let r = rotate(q[at.a], q[at.b], at.cs);
            q[at.a] = r.x;
            q[at.b] = r.y;
        }
        return;
    }
    let row_pairs = p.heads_second * p.half_rotary;
    let row = pairs[2u * group];
    for (var j = lid; j < row_pairs; j += THREADS) {
        let at = pair(row * row_pairs + j, p.heads_second);
        let r = rotate(k[at.a], k[at.b], at.cs);
        k[at.a] = r.x;
        k[at.b] = r.y;
    }
    storageBarrier();
    for (var n = 0u; n < 2u; n++) {
        keys = n == 0u;
        let ty = select(V_TYPE, K_TYPE, keys);
        let units = row_units(ty, p.cache_width);
        for (var u = lid; u < units; u += THREADS) {
            write_unit(group * units + u, ty, p.cache_width);
        }
    }
}
