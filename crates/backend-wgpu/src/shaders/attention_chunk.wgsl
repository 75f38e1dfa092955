// ggml's one-chunk flash attention (`ggml_compute_forward_flash_attn_ext_f16_one_chunk`, what
// the CPU backend's `ops/attention/chunk.rs` repeats), taken by spans of fewer than 64 query
// rows: one workgroup per (query row, head), keys one by one in position order.
//
// - The query is rounded to the key cache's `vec_dot_type`: f16 for an f16 cache, ggml's x86
//   Q8_0 for a Q8_0 or Q4_0 cache (d = amax / 127 stored as f16, q = round(x · 127 / amax)).
// - Q·K: exact products (f16 × f16 fit f32) summed with their rounding errors (two-sum), so
//   the score is the f32 rounding of the exact sum, as ggml's f64 (`ggml_float`) sum gives;
//   with head_dim of 128 and more, f16 caches take ggml's AVX512-FP16 body instead
//   (`runit_quant::dot::half_arith`: f16 fused multiply-adds into 128 lanes, summed in f16,
//   each f16 result rounded once from the exact value through f32 rounded to odd).
// - The softmax is online key by key (`S = S·ms + vs` fused); V is accumulated in the V
//   cache's type: an f16 cache rounds the accumulator to f16 after every step (ggml's
//   `ggml_vec_mad_f16` and `ggml_vec_scale_f16`), the others accumulate in f32.
//
// Keys come in tiles of 64, one thread per key for the scores; then every thread runs the
// same softmax recurrence over the tile for the head dims it owns. `round_output` follows
// (attention_chunk_plain.wgsl: nothing; attention_chunk_quantize.wgsl: the rounding of the
// row's head for the output projection). Its parameters: attention_params.wgsl.

@group(0) @binding(1) var<storage, read> q: array<f32>;
@group(0) @binding(2) var<storage, read> k_cache: array<u32>;
@group(0) @binding(3) var<storage, read> v_cache: array<u32>;
@group(0) @binding(4) var<storage, read> cells: array<u32>;
@group(0) @binding(5) var<storage, read> queries: array<Query>;
@group(0) @binding(6) var<storage, read_write> out: array<f32>;

const TILE: u32 = 64u;
const MAX_HEAD_DIM: u32 = 256u;
const DIMS_PER_THREAD: u32 = 4u;
/// Elements per step of ggml's native f16 kernels (`GGML_F16_STEP` with AVX512-FP16).
const HALF_STEP: u32 = 128u;

var<workgroup> query: array<f32, MAX_HEAD_DIM>;
var<workgroup> block_scale: array<f32, 8>;
var<workgroup> scores: array<f32, TILE>;
var<workgroup> tile_cells: array<u32, TILE>;
var<workgroup> bounds: vec2<u32>;

/// ggml's native f16 `ggml_vec_dot_f16` body over the first `body` dims of the key at `key`:
/// element i goes by an f16 fused multiply-add into lane i % 128; lanes j, j + 32, j + 64,
/// j + 96 combine as (j + (j + 64)) + ((j + 32) + (j + 96)), then `_mm512_reduce_add_ph`.
fn half_dot_body(key: u32, body: u32) -> f32 {
    var lanes: array<f32, 32>;
    for (var j = 0u; j < 32u; j++) {
        var acc = array<f32, 4>(0.0, 0.0, 0.0, 0.0);
        for (var r = 0u; r < 4u; r++) {
            let lane = j + 32u * r;
            var a = 0.0;
            for (var i = lane; i < body; i += HALF_STEP) {
                a = f16_rn(fma_odd(query[i], cache_value(key + i, true), a));
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

/// The score's dot product: the f32 rounding of the exact sum of the products, the body of
/// a native f16 dot first where there is one.
fn key_dot(key: u32, body: u32) -> f32 {
    var sum = vec2<f32>(0.0, 0.0);
    if body > 0u {
        sum.x = half_dot_body(key, body);
    }
    for (var d = body; d < p.head_dim; d++) {
        let product = query[d] * cache_value(key + d, true);
        let s = two_sum(sum.x, product);
        sum = vec2<f32>(s.x, sum.y + s.y);
    }
    return sum.x + sum.y;
}

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let info = queries[wid.x];
    let head = wid.y;
    let kv_base = (head / p.group) * p.head_dim;
    let q_base = info.row * p.q_width + head * p.head_dim;
    let f16_keys = K_TYPE == 1u;
    let quantized_keys = K_TYPE >= 2u;
    let f16_values = V_TYPE == 1u;
    // The dims ggml's native f16 code covers (none below 128).
    let body = select(0u, p.head_dim - p.head_dim % HALF_STEP, f16_keys);
    let v_body = select(0u, p.head_dim - p.head_dim % HALF_STEP, f16_values);
    if quantized_keys && lid < p.head_dim / 32u {
        var amax = 0.0;
        for (var j = 0u; j < 32u; j++) {
            amax = max(amax, abs(q[q_base + lid * 32u + j]));
        }
        block_scale[lid] = amax;
    }
    workgroupBarrier();
    for (var d = lid; d < p.head_dim; d += TILE) {
        let x = q[q_base + d];
        if f16_keys {
            query[d] = f16_rn(x);
        } else if quantized_keys {
            let amax = block_scale[d / 32u];
            let id = select(0.0, div_rn(127.0, amax), amax != 0.0);
            query[d] = f16_rn(div_rn(amax, 127.0)) * round(x * id);
        } else {
            query[d] = x;
        }
    }
    if lid == 0u {
        bounds = vec2<u32>(info.lo, info.pos);
    }
    let range = workgroupUniformLoad(&bounds);
    var m = 0.0;
    var l = 0.0;
    var first = true;
    var acc = array<f32, DIMS_PER_THREAD>(0.0, 0.0, 0.0, 0.0);
    for (var start = range.x; start <= range.y; start += TILE) {
        let position = start + lid;
        if position <= range.y {
            let cell = cells[info.cells + position];
            tile_cells[lid] = cell;
            scores[lid] = key_dot(cell * p.kv_width + kv_base, body) * p.scale;
        }
        workgroupBarrier();
        let count = min(TILE, range.y + 1u - start);
        for (var k = 0u; k < count; k++) {
            let score = scores[k];
            // `rescale` shrinks what was accumulated when the maximum grows; `weight` is
            // exp(score - max) of this key.
            var rescale = 1.0;
            var weight = 1.0;
            if first || score > m {
                rescale = select(expf(m - score), 0.0, first);
                m = score;
                first = false;
                for (var j = 0u; j < DIMS_PER_THREAD; j++) {
                    let d = lid + j * TILE;
                    if f16_values && d < v_body {
                        acc[j] = f16_rn(acc[j] * f16_rn(rescale));
                    } else if f16_values {
                        acc[j] = f16_rn(acc[j] * rescale);
                    } else {
                        acc[j] *= rescale;
                    }
                }
            } else {
                weight = expf(score - m);
            }
            let value = tile_cells[k] * p.kv_width + kv_base;
            for (var j = 0u; j < DIMS_PER_THREAD; j++) {
                let d = lid + j * TILE;
                if d < p.head_dim {
                    let v = cache_value(value + d, false);
                    if f16_values && d < v_body {
                        acc[j] = f16_rn(fma_odd(v, f16_rn(weight), acc[j]));
                    } else if f16_values {
                        acc[j] = f16_rn(fma_exact(v, weight, acc[j]));
                    } else {
                        acc[j] = fma_exact(v, weight, acc[j]);
                    }
                }
            }
            l = fma_exact(l, rescale, weight);
        }
        workgroupBarrier();
    }
    let inverse = select(div_rn(1.0, l), 0.0, l == 0.0);
    for (var j = 0u; j < DIMS_PER_THREAD; j++) {
        let d = lid + j * TILE;
        if d < p.head_dim {
            out[q_base + d] = acc[j] * inverse;
        }
    }
    round_output(q_base, lid);
}
