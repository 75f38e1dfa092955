// A matrix-vector workgroup's rows and their output without a RoPE epilogue: rows r0 .. r0 + 3
// of its part, each stored by invocation `lid` < ROWS (the entry points' `finish`).

fn row_indices(r0: u32) -> vec4<u32> {
    return vec4<u32>(r0) + vec4<u32>(0u, 1u, 2u, 3u);
}

fn finish(r0: u32, t: u32, lid: u32, sums: vec4<f32>) {
    if lid < ROWS {
        store(r0, lid, t, sums[lid]);
    }
}
