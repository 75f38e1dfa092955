// attention_split.wgsl's tail where every query's keys are one chunk (p.chunks 1): the
// head's output itself, the accumulated values times 1 / l as attention_merge.wgsl computes
// them from the one record (whose scale exp(m - m) is 1: the same bits), so that decode at
// short depths takes one dispatch instead of two; then `round_values`
// (attention_split_plain.wgsl: nothing; attention_split_quantize.wgsl: the head's values
// rounded for the output projection, blocks within a head).

@group(0) @binding(6) var<storage, read_write> out: array<f32>;

fn finish(wid: vec3<u32>, head: u32, q_base: u32, lid: u32, m: f32, sums: Sums) {
    let values = sums.acc * select(1.0 / sums.l, 0.0, sums.l == 0.0);
    for (var j = 0u; j < DIMS_PER_THREAD; j++) {
        let d = lid + j * THREADS;
        if d < p.head_dim {
            out[q_base + d] = values[j];
        }
    }
    round_values(q_base, lid, values);
}
