// The residual add before the next norm (`FusedOps::add_rms_norm`): x += delta for a row.
// Held rows (`normalize_held`) read x and delta through `row_values` and write the sum back
// through `keep_row`; the loop (`normalize_row`) first adds by `add_residual`, by the
// invocations that then read those values (i ≡ lid mod THREADS), so each reads its own
// writes. The entry points (add_rms_norm_one.wgsl, add_rms_norm_quantize.wgsl) call one of
// the two.

@group(0) @binding(1) var<storage, read_write> x: array<f32>;
@group(0) @binding(4) var<storage, read> delta: array<f32>;

fn row_values(at: u32) -> vec4<f32> {
    let before = vec4<f32>(x[at], x[at + 1u], x[at + 2u], x[at + 3u]);
    return before + vec4<f32>(delta[at], delta[at + 1u], delta[at + 2u], delta[at + 3u]);
}

fn keep_row(at: u32, values: vec4<f32>) {
    x[at] = values.x;
    x[at + 1u] = values.y;
    x[at + 2u] = values.z;
    x[at + 3u] = values.w;
}

fn add_residual(row: u32, lid: u32) {
    if row < p.rows {
        let base = row * p.width;
        for (var i = lid; i < p.width; i += THREADS) {
            x[base + i] = x[base + i] + delta[base + i];
        }
    }
}
