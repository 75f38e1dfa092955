// out[t][out_row0 + r] = sum_i W[row0 + r][i] * x[t][i] for one token per z: ROWS output
// rows a workgroup of THREADS invocations, all of them on all ROWS rows. A row is cut into
// pieces of PIECE values (matvec_dot.wgsl, per type: 4 to 32 values, 8 to 24 bytes, cut so
// that consecutive pieces lie in consecutive bytes); invocation i takes pieces i,
// i + THREADS, ... of every row: it reads the piece's activations once (`piece_xs`) and then
// the piece of each of the ROWS rows (`piece_dot`), so that
// - one load instruction of a subgroup reads neighbouring words of a row (coalesced),
// - each invocation has ROWS independent weight loads in flight before it uses them,
// - each activation read serves ROWS rows (x is f32: read per row it would move four bytes
//   through the cache for every byte of a Q8_0 weight, eight for a 4-bit one).
// `partial` (matvec_pieces.wgsl, or for Q6_K matvec_staged.wgsl: the rows staged through
// workgroup memory first) gives each invocation's sums, a vec4 of the ROWS rows, which the
// entry point of the variant reduces (reduce_shared.wgsl or reduce_subgroup.wgsl). x is f32,
// read four values a load (matvec_dot.wgsl; row lengths are multiples of 32), or int8 with a
// scale a block (matvec_int8.wgsl), each declaring its binding.

// One dispatch may take several weights of one input (matvec_parts: the Q, K and V
// projections, gate and up): workgroups from part k's first on work on part k's weight
// (`weight_word`, `weight_vec`) and output (`write_out`); a kernel of one weight
// (matvec_one.wgsl) has only part 0.

struct Params {
    n: u32,          // values per row (a multiple of 32)
    rows: u32,       // rows of this dispatch (of part 0)
    row_bytes: u32,
    row0: u32,       // first row, in the chunk
    out_row0: u32,   // first output column
    out_stride: u32, // output row length (all rows of the weight)
    groups_x: u32,
    zero: u32,       // always 0 (precise.wgsl's `opaque`, for the norm prologue)
    token0: u32,     // x's token of z = 0 (int8 activations, bound whole; else 0)
    // The prologues' words, 0 without one. matvec_norm.wgsl: the norm's eps (f32 bits), the
    // rounding's mode, 1 where the norm holds its row (rms_norm.wgsl's `held`);
    // matvec_gated.wgsl: unused, the rounding's mode, the activation's kind.
    extra0: u32,
    extra1: u32,
    extra2: u32,
    // Parts 1 and 2: (rows, row0, out_stride, first workgroup), each a whole weight.
    parts: array<vec4<u32>, 2>,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;

const THREADS: u32 = 128u;
const ROWS: u32 = 4u;

// The part the workgroup works on (set by `first_row`).
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

// The workgroup's first row, in its part.
fn first_row(wid: vec3<u32>) -> u32 {
    let group = wid.x + wid.y * p.groups_x;
    part = part_of(group);
    var first = 0u;
    if part > 0u {
        first = p.parts[part - 1u].w;
    }
    return (group - first) * ROWS;
}

// Row k of the workgroup's (`row_indices(r0)`: r0 + k, or a RoPE epilogue's pairs), stored
// where the row exists.
fn store(r0: u32, k: u32, t: u32, sum: f32) {
    let q = part_params();
    let r = row_indices(r0)[k];
    if r < q.rows {
        write_out(t * q.out_stride + q.out_row0 + r, sum);
    }
}
