// out[t][out_row0 + r] = W[row0 + r] · x[t] for F32, F16 and BF16 weights (FLOAT_TYPE 0, 1, 2) in
// exactly the CPU's arithmetic (`runit_quant::dot::tinyblas` and `dot::float`), in one of
// two orders (`p.tiled`, chosen on the host as the CPU chooses):
// - tinyBLAS (2 tokens or more, rows a multiple of 16 values and 4 rows): sixteen f32
//   lanes, lane q taking fma(w[i], x[i]) for i % 16 == q, reduced as
//   `_mm512_reduce_add_ps` (lanes q + (q + 8), then ggml's `hsum_float_8`);
// - `vec_dot` (one token): F32 in four 16-lane accumulators (element i < n - n % 64 by fma
//   into lane i % 64), combined as (0 + 2) + (1 + 3) and reduced as above, the last n % 64
//   products added by fma in order; F16 with ggml's native f16 body for the first
//   n - n % 128 values (`runit_quant::dot::half_arith`), the other products added as ggml's
//   f64 sum (a float-float here) and rounded to f32.
// BF16 follows `vdpbf16ps` (AVX512_BF16): per 32 values, lane q takes the fused product of
// value 2q + 1, then of 2q (denormals in are zero, out are flushed); tinyBLAS sums one such
// set of lanes over the row, `vec_dot` two (values [i, i + 32) and [i + 32, i + 64) of every
// 64) whose reductions and the leftover products it adds in f64.
// F16 and BF16 activations come rounded to f16 or bf16 (quantize_x.wgsl's modes 1 and 2).
// One invocation per output (row, token); 64 rows a workgroup.

struct Params {
    n: u32,          // values per row
    rows: u32,       // rows of this dispatch
    row_bytes: u32,
    row0: u32,       // first row, in the chunk
    out_row0: u32,   // first output column
    out_stride: u32, // output row length (all rows of the weight)
    groups_x: u32,
    tiled: u32,      // 1: tinyBLAS order, 0: vec_dot order
    zero: u32,       // always 0 (`opaque` in precise.wgsl)
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> w: array<u32>;
@group(0) @binding(2) var<storage, read> x: array<f32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;

const HALF_STEP: u32 = 128u;

// Element i of the row starting at word `word`.
fn weight(word: u32, i: u32) -> f32 {
    if FLOAT_TYPE == 0u {
        return bitcast<f32>(w[word + i]);
    }
    if FLOAT_TYPE == 2u {
        return bitcast<f32>(((w[word + (i >> 1u)] >> (16u * (i & 1u))) & 0xffffu) << 16u);
    }
    return unpack2x16float(w[word + (i >> 1u)])[i & 1u];
}

// A denormal read or written by `vdpbf16ps` is a zero of the same sign.
fn flush(v: f32) -> f32 {
    return select(v, bitcast<f32>(bitcast<u32>(v) & 0x80000000u), abs(v) < 1.17549435e-38);
}

// One `vdpbf16ps` lane step over values i, i + 1: the odd one first.
fn dpbf16(acc: f32, word: u32, xt: u32, i: u32) -> f32 {
    let first = flush(fma_exact(flush(weight(word, i + 1u)), flush(x[xt + i + 1u]), flush(acc)));
    return flush(fma_exact(flush(weight(word, i)), flush(x[xt + i]), first));
}

// `_mm512_reduce_add_ps`: lanes q + (q + 8), then ggml's `hsum_float_8`.
fn reduce16(lanes: array<f32, 16>) -> f32 {
    var eight: array<f32, 8>;
    for (var q = 0u; q < 8u; q++) {
        eight[q] = lanes[q] + lanes[q + 8u];
    }
    return ((eight[0] + eight[4]) + (eight[2] + eight[6])) + ((eight[1] + eight[5]) + (eight[3] + eight[7]));
}

// ggml's native f16 `ggml_vec_dot_f16` body over the first `body` values (attention_chunk's
// `half_dot_body` over a weight row).
fn half_dot_body(word: u32, xt: u32, body: u32) -> f32 {
    var lanes: array<f32, 32>;
    for (var j = 0u; j < 32u; j++) {
        var acc = array<f32, 4>(0.0, 0.0, 0.0, 0.0);
        for (var r = 0u; r < 4u; r++) {
            var a = 0.0;
            for (var i = j + 32u * r; i < body; i += HALF_STEP) {
                a = f16_rn(fma_odd(weight(word, i), x[xt + i], a));
            }
            acc[r] = a;
        }
        lanes[j] = f16_rn(add_odd(f16_rn(add_odd(acc[0], acc[2])), f16_rn(add_odd(acc[1], acc[3]))));
    }
    for (var width = 16u; width >= 4u; width >>= 1u) {
        for (var j = 0u; j < width; j++) {
            lanes[j] = f16_rn(add_odd(lanes[j], lanes[j + width]));
        }
    }
    return f16_rn(add_odd(f16_rn(add_odd(lanes[0], lanes[2])), f16_rn(add_odd(lanes[1], lanes[3]))));
}

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let r = (wid.x + wid.y * p.groups_x) * 64u + lid;
    let t = wid.z;
    if r >= p.rows {
        return;
    }
    let word = (p.row0 + r) * p.row_bytes / 4u;
    let xt = t * p.n;
    var result = 0.0;
    if FLOAT_TYPE == 2u && p.tiled == 1u {
        var lanes: array<f32, 16>;
        for (var q = 0u; q < 16u; q++) {
            lanes[q] = 0.0;
        }
        for (var step = 0u; step < p.n; step += 32u) {
            for (var q = 0u; q < 16u; q++) {
                lanes[q] = dpbf16(lanes[q], word, xt, step + 2u * q);
            }
        }
        result = reduce16(lanes);
    } else if FLOAT_TYPE == 2u {
        var first: array<f32, 16>;
        var second: array<f32, 16>;
        for (var q = 0u; q < 16u; q++) {
            first[q] = 0.0;
            second[q] = 0.0;
        }
        let body = p.n - p.n % 64u;
        for (var step = 0u; step < body; step += 64u) {
            for (var q = 0u; q < 16u; q++) {
                first[q] = dpbf16(first[q], word, xt, step + 2u * q);
                second[q] = dpbf16(second[q], word, xt, step + 32u + 2u * q);
            }
        }
        var sum = two_sum(reduce16(first), reduce16(second));
        for (var i = body; i < p.n; i++) {
            let s = two_sum(sum.x, weight(word, i) * x[xt + i]);
            sum = vec2<f32>(s.x, sum.y + s.y);
        }
        result = sum.x + sum.y;
    } else if p.tiled == 1u {
        var lanes: array<f32, 16>;
        for (var q = 0u; q < 16u; q++) {
            lanes[q] = 0.0;
        }
        for (var i = 0u; i < p.n; i++) {
            lanes[i & 15u] = fma_exact(weight(word, i), x[xt + i], lanes[i & 15u]);
        }
        var eight: array<f32, 8>;
        for (var q = 0u; q < 8u; q++) {
            eight[q] = lanes[q] + lanes[q + 8u];
        }
        result = ((eight[0] + eight[4]) + (eight[2] + eight[6])) + ((eight[1] + eight[5]) + (eight[3] + eight[7]));
    } else if FLOAT_TYPE == 0u {
        var lanes: array<f32, 64>;
        for (var q = 0u; q < 64u; q++) {
            lanes[q] = 0.0;
        }
        let body = p.n - p.n % 64u;
        for (var i = 0u; i < body; i++) {
            lanes[i & 63u] = fma_exact(weight(word, i), x[xt + i], lanes[i & 63u]);
        }
        var first: array<f32, 16>;
        for (var q = 0u; q < 16u; q++) {
            first[q] = (lanes[q] + lanes[q + 32u]) + (lanes[q + 16u] + lanes[q + 48u]);
        }
        var eight: array<f32, 8>;
        for (var q = 0u; q < 8u; q++) {
            eight[q] = first[q] + first[q + 8u];
        }
        result = ((eight[0] + eight[4]) + (eight[2] + eight[6])) + ((eight[1] + eight[5]) + (eight[3] + eight[7]));
        for (var i = body; i < p.n; i++) {
            result = fma_exact(weight(word, i), x[xt + i], result);
        }
    } else {
        var body = 0u;
        if FLOAT_TYPE == 1u {
            body = p.n - p.n % HALF_STEP;
        }
        var sum = vec2<f32>(0.0, 0.0);
        if body > 0u {
            sum.x = half_dot_body(word, xt, body);
        }
        for (var i = body; i < p.n; i++) {
            let s = two_sum(sum.x, opaque(weight(word, i) * x[xt + i]));
            sum = vec2<f32>(s.x, sum.y + s.y);
        }
        result = sum.x + sum.y;
    }
    out[t * p.out_stride + p.out_row0 + r] = result;
}
