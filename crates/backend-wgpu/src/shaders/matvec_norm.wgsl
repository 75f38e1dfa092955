// The norm prologue of the int8 matrix-vector kernels (`FusedOps::norm_matmul_qkv`, and gate
// and up in `FusedOps::norm_gated_ffn_residual`): each workgroup normalizes the one row of
// the residual stream (`residual`, p.n values) by `norm_weight` and rounds the result into
// workgroup memory in the layout matvec_int8.wgsl reads (modes 7 and 8 of quantize_x.wgsl,
// `p.extra1`; matvec_int8_wg.wgsl), then goes on with its rows. Its eps: `p.extra0`. Workgroup 0 also writes the norm to `normed`.
//
// The result equals rms_norm_one.wgsl's followed by quantize_x's rounding bit for bit: the
// squares are summed in the order of a norm workgroup of NORM_LANES invocations (the one the
// host would launch for this width, `WgpuBackend::norm_lanes`), each of this workgroup's
// THREADS invocations standing in for NORM_LANES / THREADS of them, held rows
// (`p.extra2`) as `normalize_held` sums them and others as `normalize_row`; then the same
// tree of float-float additions (norm_sum_shared.wgsl's), the same scale (`rms_scale`), each
// value `x · scale · weight`, and the rounding of quantize_coop.wgsl (per block, so any
// chunking gives the same words). The host binds `residual`, `norm_weight` and `normed` after
// the parts' bindings (NORM_BINDING, + 1, + 2) and writes ROUNDED_WORDS and NORM_LANES.

@group(0) @binding(NORM_BINDING) var<storage, read> residual: array<f32>;
@group(0) @binding(NORM_WEIGHT_BINDING) var<storage, read> norm_weight: array<f32>;
@group(0) @binding(NORMED_BINDING) var<storage, read_write> normed: array<f32>;

var<workgroup> norm_partial: array<vec2<f32>, NORM_LANES>;

// quantize_coop.wgsl's chunks: 4 values an invocation of this workgroup.
const COOP_LANES: u32 = THREADS;

// quantize_x.wgsl's serial rounding, unused here.
fn round_source(i: u32) -> f32 {
    return 0.0;
}

// rms_norm.wgsl's chunk of a held row and the most values it holds.
const NORM_CHUNK: u32 = 4u * NORM_LANES;
const NORM_HELD_VALUES: u32 = 8192u;

// The sum of squares norm invocation `lane` makes (rms_norm.wgsl's order).
fn lane_squares(lane: u32) -> vec2<f32> {
    let n = p.n;
    var sum = vec2<f32>(0.0, 0.0);
    if p.extra2 == 1u {
        for (var c = 0u; c * NORM_CHUNK < NORM_HELD_VALUES; c++) {
            let i = c * NORM_CHUNK + 4u * lane;
            if i < n {
                for (var k = 0u; k < 4u; k++) {
                    let v = residual[i + k];
                    sum = add_ff(sum, vec2<f32>(v * v, 0.0));
                }
            }
        }
    } else {
        for (var i = lane; i < n; i += NORM_LANES) {
            let v = residual[i];
            sum = add_ff(sum, vec2<f32>(v * v, 0.0));
        }
    }
    return sum;
}

fn prologue(wid: vec3<u32>, lid: u32) {
    let n = p.n;
    for (var lane = lid; lane < NORM_LANES; lane += THREADS) {
        norm_partial[lane] = lane_squares(lane);
    }
    workgroupBarrier();
    for (var span = NORM_LANES / 2u; span > 0u; span >>= 1u) {
        for (var lane = lid; lane < span; lane += THREADS) {
            norm_partial[lane] = add_ff(norm_partial[lane], norm_partial[lane + span]);
        }
        workgroupBarrier();
    }
    let scale = rms_scale(norm_partial[0], n, bitcast<f32>(p.extra0));
    let writes = wid.x == 0u && wid.y == 0u;
    for (var c = 0u; c < n; c += 4u * THREADS) {
        let at = c + 4u * lid;
        let live = at < n;
        var values = vec4<f32>(0.0);
        if live {
            let v = vec4<f32>(residual[at], residual[at + 1u], residual[at + 2u], residual[at + 3u]);
            let w = vec4<f32>(norm_weight[at], norm_weight[at + 1u], norm_weight[at + 2u], norm_weight[at + 3u]);
            values = v * scale * w;
            if writes {
                normed[at] = values.x;
                normed[at + 1u] = values.y;
                normed[at + 2u] = values.z;
                normed[at + 3u] = values.w;
            }
        }
        quantize_coop(c, lid, values, live, p.extra1);
    }
    workgroupBarrier();
}
