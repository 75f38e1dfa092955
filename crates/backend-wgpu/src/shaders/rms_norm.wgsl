// out[r] = x[r] * (1 / sqrt(mean(x[r]²) + eps)) * weight, one workgroup per row, with the
// CPU's (ggml's) precision: each square rounded to f32, the squares summed as a float-float
// (value and error, by two-sums) standing in for ggml's f64 sum, the mean rounded once to f32
// (`two_sum`: precise.wgsl). The entry points (rms_norm_one.wgsl; add_rms_norm_one.wgsl and
// add_rms_norm_quantize.wgsl, which first add the residual) declare x and call
// `normalize_held` (rows of up to HELD_VALUES values) or `normalize_row` (any other).

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
    // most HELD_VALUES values), 0: the loop over the row (`normalize_row`). The host sets it
    // by the same rule for every norm kernel, so that their sums agree.
    held: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(2) var<storage, read> weight: array<f32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;

// A workgroup's invocations: 256, what every adapter grants, as written here; 1,024 where the
// adapter grants that many (`WgpuBackend::norm_threads` writes it when it makes the kernel).
// A 3,584-value row then takes a vec4 an invocation (with 256, 14 values: the float-float
// additions, the stores and the rounding's calls of a held row came four times over).
const THREADS: u32 = 256u;
var<workgroup> partial: array<vec2<f32>, THREADS>;

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
    let total = norm_sum(sum, lid);
    if row >= p.rows {
        return;
    }
    let scale = row_scale(total);
    for (var i = lid; i < p.width; i += THREADS) {
        out[base + i] = x[base + i] * scale * weight[i];
    }
}

// 1 / sqrt(mean + eps) of a row whose squares sum to `total` (precise.wgsl's `rms_scale`).
fn row_scale(total: vec2<f32>) -> f32 {
    return rms_scale(total, p.width, p.eps);
}

// Values a chunk of a held row: four an invocation.
const CHUNK: u32 = 4u * THREADS;
// Values a held row has at most, whatever THREADS is (the host's rule, `norm_held`).
const HELD_VALUES: u32 = 8192u;
// Chunks a held row has at most: 8 with 256 invocations, 2 with 1,024. `normalize_held`
// names MAX_HELD chunks; those from HELD on are constant zeros, which the driver drops.
const HELD: u32 = HELD_VALUES / CHUNK;
const MAX_HELD: u32 = 8u;

// Chunk c of a held row as invocation `lid` holds it: its values (through the entry point's
// `row_values`: x, or x plus the residual) and their weights, zero where it holds none.
struct Held {
    values: vec4<f32>,
    weights: vec4<f32>,
}

fn held_chunk(base: u32, c: u32, lid: u32, live: bool) -> Held {
    let i = c * CHUNK + 4u * lid;
    if c >= HELD || !live || i >= p.width {
        return Held(vec4<f32>(0.0), vec4<f32>(0.0));
    }
    let weights = vec4<f32>(weight[i], weight[i + 1u], weight[i + 2u], weight[i + 3u]);
    return Held(row_values(base + i), weights);
}

// `sum` plus the squares of a held chunk's values, in order (each rounded to f32).
fn add_squares(sum: vec2<f32>, chunk: Held, c: u32, lid: u32, live: bool) -> vec2<f32> {
    var total = sum;
    if c < HELD && live && c * CHUNK + 4u * lid < p.width {
        for (var k = 0u; k < 4u; k++) {
            total = add_ff(total, vec2<f32>(chunk.values[k] * chunk.values[k], 0.0));
        }
    }
    return total;
}

// A held chunk normalized by `scale`: the residual kept (`keep_row`), the output written and
// returned.
fn held_out(base: u32, chunk: Held, scale: f32, c: u32, lid: u32, live: bool) -> vec4<f32> {
    let i = c * CHUNK + 4u * lid;
    if c >= HELD || !live || i >= p.width {
        return vec4<f32>(0.0);
    }
    let at = base + i;
    keep_row(at, chunk.values);
    let normed = chunk.values * scale * chunk.weights;
    out[at] = normed.x;
    out[at + 1u] = normed.y;
    out[at + 2u] = normed.z;
    out[at + 3u] = normed.w;
    return normed;
}

// Row `row` normalized into out by the workgroup's invocation `lid` (every invocation calls
// it: it holds barriers), the row held in registers: invocation `lid` holds values
// c · CHUNK + 4 lid .. + 4 of each chunk c with their weights, all loaded before any is
// used or stored (the residual's store, through `keep_row`, and the output's), so that all
// of a row's loads are in flight at once. The chunks are named one by one rather than
// looped over, so that they are registers whether or not the driver unrolls a loop (an
// array indexed in a loop it keeps would make each load wait for the last). The loops of
// `normalize_row` waited on a load at every step (three passes over the row, 14 steps each
// for 3,584 values): about 40 µs a row on an H100 (session 36); held with 256 invocations,
// still 40 µs (session 41: four chunks' code and four rounding calls a row, each executed
// once by a lone workgroup), hence 1,024 invocations where the adapter grants them: a chunk
// (a vec4 an invocation) for rows of up to 4,096 values. Returns the normalized
// values, for the caller to round. The same roundings as `normalize_row` (each square
// rounded to f32, a float-float sum, the same scale and products); the sum's order is its
// own, the same in every kernel that holds its rows.
fn normalize_held(row: u32, lid: u32) -> array<vec4<f32>, MAX_HELD> {
    let base = row * p.width;
    let live = row < p.rows;
    let c0 = held_chunk(base, 0u, lid, live);
    let c1 = held_chunk(base, 1u, lid, live);
    let c2 = held_chunk(base, 2u, lid, live);
    let c3 = held_chunk(base, 3u, lid, live);
    let c4 = held_chunk(base, 4u, lid, live);
    let c5 = held_chunk(base, 5u, lid, live);
    let c6 = held_chunk(base, 6u, lid, live);
    let c7 = held_chunk(base, 7u, lid, live);
    var sum = add_squares(vec2<f32>(0.0, 0.0), c0, 0u, lid, live);
    sum = add_squares(sum, c1, 1u, lid, live);
    sum = add_squares(sum, c2, 2u, lid, live);
    sum = add_squares(sum, c3, 3u, lid, live);
    sum = add_squares(sum, c4, 4u, lid, live);
    sum = add_squares(sum, c5, 5u, lid, live);
    sum = add_squares(sum, c6, 6u, lid, live);
    sum = add_squares(sum, c7, 7u, lid, live);
    let scale = row_scale(norm_sum(sum, lid));
    return array<vec4<f32>, MAX_HELD>(
        held_out(base, c0, scale, 0u, lid, live),
        held_out(base, c1, scale, 1u, lid, live),
        held_out(base, c2, scale, 2u, lid, live),
        held_out(base, c3, scale, 3u, lid, live),
        held_out(base, c4, scale, 4u, lid, live),
        held_out(base, c5, scale, 5u, lid, live),
        held_out(base, c6, scale, 6u, lid, live),
        held_out(base, c7, scale, 7u, lid, live),
    );
}
