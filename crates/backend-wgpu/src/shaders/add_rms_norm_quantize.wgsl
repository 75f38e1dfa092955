// The residual add, the next norm and the rounding of the norm's results for the matmul that
// reads them (`WgpuBackend::add_rms_norm_rows`): one workgroup per row, as
// add_rms_norm_one.wgsl, then the row's blocks (`p.width` a multiple of the mode's block)
// rounded into `rounded` as quantize_x_one.wgsl rounds them, from the values the workgroup
// wrote to `out` (hence the storage barrier).

@group(0) @binding(5) var<storage, read_write> rounded: array<u32>;

fn round_source(i: u32) -> f32 {
    return out[i];
}

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let row = wid.x + wid.y * p.groups_x;
    add_residual(row, lid);
    normalize_row(row, lid);
    storageBarrier();
    if row < p.rows {
        let blocks = p.width / mode_block_values(p.mode);
        for (var b = lid; b < blocks; b += THREADS) {
            quantize_block(row * blocks + b, p.mode);
        }
    }
}
