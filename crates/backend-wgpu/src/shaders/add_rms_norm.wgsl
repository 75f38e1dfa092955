// The residual add before the next norm (`FusedOps::add_rms_norm`): x += delta for a row, by
// the invocations that then read those values in `normalize_row` (i ≡ lid mod THREADS), so
// each reads its own writes. The entry points (add_rms_norm_one.wgsl,
// add_rms_norm_quantize.wgsl) call `add_residual`, then `normalize_row`.

@group(0) @binding(1) var<storage, read_write> x: array<f32>;
@group(0) @binding(4) var<storage, read> delta: array<f32>;

fn add_residual(row: u32, lid: u32) {
    if row < p.rows {
        let base = row * p.width;
        for (var i = lid; i < p.width; i += THREADS) {
            x[base + i] = x[base + i] + delta[base + i];
        }
    }
}
