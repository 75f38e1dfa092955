// The residual add, the next norm and the rounding of the norm's results for the matmul that
// reads them (`WgpuBackend::add_rms_norm_rows`): one workgroup per row, as
// add_rms_norm_one.wgsl, then the row's blocks (`p.width` a multiple of the mode's block)
// rounded into `rounded` as quantize_x_one.wgsl rounds them (quantize_coop.wgsl, a chunk of
// 4 · THREADS values a call: one call for rows of up to 4,096 values with 1,024 invocations):
// a held row from the values the invocations hold, the loop's from the values the workgroup
// wrote to `out` (hence the storage barrier).

@group(0) @binding(5) var<storage, read_write> rounded: array<u32>;

// The norm's invocations round its row, a chunk a call.
const COOP_LANES: u32 = THREADS;

// quantize_x.wgsl's serial rounding (unused here) reads through it.
fn round_source(i: u32) -> f32 {
    return out[i];
}

@compute @workgroup_size(THREADS)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let row = wid.x + wid.y * p.groups_x;
    if p.held == 1u {
        let normed = normalize_held(row, lid);
        for (var c = 0u; c < HELD; c++) {
            if c * CHUNK < p.width {
                let live = row < p.rows && c * CHUNK + 4u * lid < p.width;
                quantize_coop(row * p.width + c * CHUNK, lid, normed[c], live, p.mode);
            }
        }
        return;
    }
    add_residual(row, lid);
    normalize_row(row, lid);
    storageBarrier();
    // The row 4 · THREADS values at a time (the width is whole blocks).
    for (var c = 0u; c < p.width; c += CHUNK) {
        let at = row * p.width + c + 4u * lid;
        let live = row < p.rows && c + 4u * lid < p.width;
        var values = vec4<f32>(0.0);
        if live {
            values = vec4<f32>(out[at], out[at + 1u], out[at + 2u], out[at + 3u]);
        }
        quantize_coop(row * p.width + c, lid, values, live, p.mode);
    }
}
