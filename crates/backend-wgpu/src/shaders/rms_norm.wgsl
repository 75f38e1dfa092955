// out[r] = x[r] * (1 / sqrt(mean(x[r]²) + eps)) * weight, one workgroup per row, with the
// CPU's (ggml's) precision: each square rounded to f32, the squares summed as a float-float
// (value and error, by two-sums) standing in for ggml's f64 sum, the mean rounded once to f32
// (`two_sum`: precise.wgsl). The entry points (rms_norm_one.wgsl; add_rms_norm_one.wgsl and
// add_rms_norm_quantize.wgsl, which first add the residual) declare x and call `normalize_row`.

struct Params {
    width: u32,
    rows: u32,
    eps: f32,
    groups_x: u32,
    // Always 0: `opaque` hides a value from the shader compiler's algebra (an inexact
    // `(a + b) - a` may be folded to `b`, which would erase the two-sums' errors).
    zero: u32,
    mode: u32, // add_rms_norm_quantize.wgsl's rounding (quantize_x.wgsl's mode)
    _pad1: u32,
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
    // f32(sum / width): the quotient of the high part, corrected by the remainder.
    let total = partial[0];
    let n = f32(p.width);
    let q = total.x / n;
    let remainder = fma_exact(-q, n, total.x) + total.y;
    let mean = q + remainder / n;
    let scale = 1.0 / sqrt(mean + p.eps);
    for (var i = lid; i < p.width; i += THREADS) {
        out[base + i] = x[base + i] * scale * weight[i];
    }
}
