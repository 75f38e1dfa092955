// attention_split.wgsl's tail for two passes: the chunk's record in `partials` (record
// (query · heads + head) · chunks + chunk, of head_dim + 2 floats: the scores' maximum m, the
// sum l and the accumulated values), which attention_merge.wgsl combines.

@group(0) @binding(6) var<storage, read_write> partials: array<f32>;

fn finish(wid: vec3<u32>, head: u32, q_base: u32, lid: u32, m: f32, sums: Sums) {
    let record = ((wid.z * p.heads + head) * p.chunks + wid.x) * (p.head_dim + 2u);
    if lid == 0u {
        partials[record] = m;
        partials[record + 1u] = sums.l;
    }
    for (var j = 0u; j < DIMS_PER_THREAD; j++) {
        let d = lid + j * THREADS;
        if d < p.head_dim {
            partials[record + 2u + d] = sums.acc[j];
        }
    }
}
