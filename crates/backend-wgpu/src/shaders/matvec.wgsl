// out[t][out_row0 + r] = sum_i W[row0 + r][i] * x[t][i] for one token per z: ROWS output
// rows a workgroup, LANES threads a row. Each lane takes whole units of 32 values (a legacy
// block, an eighth of a K-quant block, 32 floats), reads them as words and sums their dot
// product with `unit_dot` (matvec_dot.wgsl, chosen per type by the host); the lanes' sums
// are then reduced by the entry point of the variant (reduce_shared.wgsl or
// reduce_subgroup.wgsl). x is read four values a load (row lengths are multiples of 32).

// One dispatch may take several weights of one input (matvec_parts: the Q, K and V
// projections, gate and up): workgroups from part k's first on work on part k's weight
// (`weight_word`) and output (`write_out`); a kernel of one weight (matvec_one.wgsl) has only
// part 0.

struct Params {
    n: u32,          // values per row (a multiple of 32)
    rows: u32,       // rows of this dispatch (of part 0)
    row_bytes: u32,
    row0: u32,       // first row, in the chunk
    out_row0: u32,   // first output column
    out_stride: u32, // output row length (all rows of the weight)
    groups_x: u32,
    _pad: u32,
    _exact: vec4<u32>, // the exact kernels' words, unused here
    // Parts 1 and 2: (rows, row0, out_stride, first workgroup), each a whole weight.
    parts: array<vec4<u32>, 2>,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> w: array<u32>;
@group(0) @binding(2) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;

const LANES: u32 = 32u;
const ROWS: u32 = 4u;
const UNIT: u32 = 32u;

// The part the workgroup works on (set by `row_of`).
var<private> part: u32 = 0u;

// A part's rows: how many, the first in its chunk, and where they go in its output.
struct Part {
    rows: u32,
    row0: u32,
    out_row0: u32,
    out_stride: u32,
}

fn part_params() -> Part {
    if part == 0u {
        return Part(p.rows, p.row0, p.out_row0, p.out_stride);
    }
    let q = p.parts[part - 1u];
    return Part(q.x, q.y, 0u, q.z);
}

// The row lane `lid` works on, in its workgroup's part.
fn row_of(wid: vec3<u32>, lid: u32) -> u32 {
    let group = wid.x + wid.y * p.groups_x;
    part = part_of(group);
    var first = 0u;
    if part > 0u {
        first = p.parts[part - 1u].w;
    }
    return (group - first) * ROWS + lid / LANES;
}

// Lane `lane`'s share of row r's dot product with token t: units lane, lane + LANES, ...
fn partial(r: u32, t: u32, lane: u32) -> f32 {
    let q = part_params();
    var acc = 0.0;
    if r < q.rows {
        let row = (q.row0 + r) * p.row_bytes;
        let units = p.n / UNIT;
        for (var u = lane; u < units; u += LANES) {
            acc += unit_dot(row, u, t * p.n + u * UNIT);
        }
    }
    return acc;
}

fn store(r: u32, t: u32, sum: f32) {
    let q = part_params();
    if r < q.rows {
        write_out(t * q.out_stride + q.out_row0 + r, sum);
    }
}
