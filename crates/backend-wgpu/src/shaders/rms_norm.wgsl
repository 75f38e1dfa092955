// out[r] = x[r] * (1 / sqrt(mean(x[r]²) + eps)) * weight, one workgroup per row, with the
// CPU's (ggml's) precision: each square rounded to f32, the squares summed as a float-float
// (value and error, by two-sums) standing in for ggml's f64 sum, the mean rounded once to f32
// (`two_sum`: precise.wgsl). The entry points (rms_norm_one.wgsl; add_rms_norm_one.wgsl and
// add_rms_norm_quantize.wgsl, which first add the residual) declare x and call
// `normalize_held` (rows of up to HELD · CHUNK values) or `normalize_row` (any other).

struct Params {
    width: u32,
    rows: u32,
    eps: f32,
    groups_x: u32,
    // Always 0: `opaque` hides a value from the shader compiler's algebra (an inexact
    // `(a + b) - a` may be folded to `b`, which would erase the two-sums' errors).
    zero: u32,
    mode: u32, // add_rms_norm_quantize.wgsl's rounding (quantize_x.wgsl's mode)
    // 1: the row is held in registers (`normalize_held`; a width of a multiple of 4 and at
    // most HELD · CHUNK values), 0: the loop over the row (`normalize_row`). The host sets it
    // by the same rule for every norm kernel, so that their sums agree.
    held: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(2) var<storage, read> weight: array<f32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;

// A workgroup's invocations: a 3,584-value row takes 14 values each (with 64, 56 in a row
// of dependent float-float additions kept a GPU's invocations waiting).
const THREADS: u32 = 256u;
var<workgroup> partial: array<vec2<f32>, THREADS>;

/// The float-float sum of `a` and `b`.
fn add_ff(a: vec2<f32>, b: vec2<f32>) -> vec2<f32> {
    let s = two_sum(a.x, b.x);
    return two_sum(s.x, s.y + (a.y + b.y));
}

// Row `row` of x normalized into out by the workgroup's invocation `lid` (every invocation
// calls it: it holds barriers), which reads only the values i ≡ lid (mod THREADS) of the row.
fn normalize_row(row: u32, lid: u32) {
    let base = row * p.width;
    var sum = vec2<f32>(0.0, 0.0);
    if row < p.rows {
        for (var i = lid; i < p.width; i += THREADS) {
            let square = x[base + i] * x[base + i];
            sum = add_ff(sum, vec2<f32>(square, 0.0));
        }
    }
    partial[lid] = sum;
    workgroupBarrier();
    for (var span = THREADS / 2u; span > 0u; span >>= 1u) {
        if lid < span {
            partial[lid] = add_ff(partial[lid], partial[lid + span]);
        }
        workgroupBarrier();
    }
    if row >= p.rows {
        return;
    }
    let scale = row_scale(partial[0]);
    for (var i = lid; i < p.width; i += THREADS) {
        out[base + i] = x[base + i] * scale * weight[i];
    }
}

// 1 / sqrt(mean + eps) of a row whose squares sum to `total`, the mean f32(total / width):
// the quotient of the high part, corrected by the remainder.
fn row_scale(total: vec2<f32>) -> f32 {
    let n = f32(p.width);
    let q = total.x / n;
    let remainder = fma_exact(-q, n, total.x) + total.y;
    let mean = q + remainder / n;
    return 1.0 / sqrt(mean + p.eps);
}

// Values a chunk of a held row: four an invocation.
const CHUNK: u32 = 4u * THREADS;
// Chunks a held row has at most (HELD · CHUNK = 8,192 values).
const HELD: u32 = 8u;

// Row `row` normalized into out by the workgroup's invocation `lid` (every invocation calls
// it: it holds barriers), the row held in registers: invocation `lid` holds values
// c · CHUNK + 4 lid .. + 4 of each chunk c, read through `row_values` (the entry point's: x,
// or x plus the residual) with their weights, every load before any store (the residual's,
// through `keep_row`, and the output's), so that all of a row's loads are in flight at once.
// The loops of `normalize_row` waited on a load at every step (three passes over the row, 14
// steps each for 3,584 values): about 40 µs a row on an H100 (session 36). Returns the
// normalized values, for the caller to round. The same roundings as `normalize_row` (each
// square rounded to f32, a float-float sum, the same scale and products); the sum's order is
// its own, the same in every kernel that holds its rows.
fn normalize_held(row: u32, lid: u32) -> array<vec4<f32>, HELD> {
    let base = row * p.width;
    let live = row < p.rows;
    var values: array<vec4<f32>, HELD>;
    var weights: array<vec4<f32>, HELD>;
    for (var c = 0u; c < HELD; c++) {
        let i = c * CHUNK + 4u * lid;
        if live && i < p.width {
            values[c] = row_values(base + i);
            weights[c] = vec4<f32>(weight[i], weight[i + 1u], weight[i + 2u], weight[i + 3u]);
        }
    }
    var sum = vec2<f32>(0.0, 0.0);
    for (var c = 0u; c < HELD; c++) {
        if live && c * CHUNK + 4u * lid < p.width {
            for (var k = 0u; k < 4u; k++) {
                sum = add_ff(sum, vec2<f32>(values[c][k] * values[c][k], 0.0));
            }
        }
    }
    partial[lid] = sum;
    workgroupBarrier();
    for (var span = THREADS / 2u; span > 0u; span >>= 1u) {
        if lid < span {
            partial[lid] = add_ff(partial[lid], partial[lid + span]);
        }
        workgroupBarrier();
    }
    let scale = row_scale(partial[0]);
    var normed: array<vec4<f32>, HELD>;
    for (var c = 0u; c < HELD; c++) {
        let i = c * CHUNK + 4u * lid;
        if live && i < p.width {
            let at = base + i;
            keep_row(at, values[c]);
            normed[c] = values[c] * scale * weights[c];
            out[at] = normed[c].x;
            out[at + 1u] = normed[c].y;
            out[at + 2u] = normed[c].z;
            out[at + 3u] = normed[c].w;
        }
    }
    return normed;
}
