// The gated activation's prologue of the down projection's int8 matrix-vector kernel
// (`FusedOps::norm_gated_ffn_residual`, one token): each workgroup makes the p.n values
// act(gate) · up (gated.wgsl's `activated`, kind `p.extra2`) and rounds them into workgroup
// memory (quantize_x.wgsl's serial `quantize_block`, an invocation a block of 32: mode 7,
// `p.extra1`), then goes on with its rows (the activation's values themselves are written
// nowhere: `NormFfnResidual` leaves `hidden` unspecified). The rounding equals
// gated_quantize.wgsl's bit for bit: the same function of each value, the same rounding of
// each block. The gate is at binding 2 (x), up and ggml's GELU table after the residual
// epilogue's binding.

@group(0) @binding(2) var<storage, read> gate: array<f32>;
@group(0) @binding(5) var<storage, read> up: array<f32>;
@group(0) @binding(6) var<storage, read> gelu_table: array<u32>;

// The block being rounded: its values and its first value's index.
var<private> block_values: array<f32, 32>;
var<private> block_first: u32;

fn round_source(i: u32) -> f32 {
    return block_values[i - block_first];
}

fn prologue(wid: vec3<u32>, lid: u32) {
    let n = p.n;
    for (var block = lid; block < n / 32u; block += THREADS) {
        block_first = block * 32u;
        for (var j = 0u; j < 32u; j++) {
            let i = block_first + j;
            block_values[j] = activated(i, gate[i], up[i], n, p.extra2);
        }
        quantize_block(block, p.extra1);
    }
    workgroupBarrier();
}
