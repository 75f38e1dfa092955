// RoPE of the queries and the keys of a step in one dispatch (`FusedOps::rope_kv_write`,
// the same angles): the first p.pairs invocations rotate the pairs of q, the next
// p.pairs_second those of k.

@group(0) @binding(2) var<storage, read_write> q: array<f32>;
@group(0) @binding(3) var<storage, read_write> k: array<f32>;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let i = gid.x + gid.y * groups.x * 64u;
    if i < p.pairs {
        let at = pair(i, p.heads);
        let r = rotate(q[at.a], q[at.b], at.cs);
        q[at.a] = r.x;
        q[at.b] = r.y;
    } else if i - p.pairs < p.pairs_second {
        let at = pair(i - p.pairs, p.heads_second);
        let r = rotate(k[at.a], k[at.b], at.cs);
        k[at.a] = r.x;
        k[at.b] = r.y;
    }
}
