// Q6_K's loop over a row's pieces (matvec.wgsl) with the workgroup's rows staged through
// workgroup memory: the pieces and sums of matvec_pieces.wgsl, but the weights are read
// twice, first by all 128 invocations together, 8 bytes each of consecutive bytes of a row
// (`words2_at`: three neighbouring words), into one slot a block, then each piece's runs
// from its slot in 8-byte reads (`staged_weights`).
//
// Why: a Q6_K block is 210 bytes, so blocks start on 2-byte boundaries and a piece's 8-byte
// runs lie 8 to 64 bytes apart in 4 blocks a subgroup. Read in place (matvec_pieces.wgsl),
// a piece is 13 word loads (each run three words, as it may start on 2 bytes) and each load
// of a subgroup of 32 touches about 7 cache lines of its 4 blocks for 128 bytes it uses.
// Staged, a subgroup's word load reads 256 consecutive bytes (2 to 3 lines, each byte used
// by the three loads of its run), and a piece then makes 5 reads of 8 bytes (d: 4) from
// workgroup memory, 2 to 4 bank wavefronts each a subgroup. The docs (perf-wgpu.md,
// session 38b) count both. Measured on an H100's Vulkan driver (session 41), the staging
// (its barriers a stage) lost: 131 against 170 tok/s on the 7B Q4_K_M, so it runs only under
// `RUNIT_WGPU_Q6K_ALIGNED=1`.
//
// A stage is STAGE blocks of each of the ROWS rows (a block's 8 pieces to 8 invocations:
// 128 pieces, one an invocation); rows of more blocks take several stages, each between
// two barriers. The last stage of a row may hold fewer blocks.

const STAGE: u32 = 16u;
// vec2s of workgroup memory a block: 27 hold its 210 bytes (vec2 v bytes 8v .. 8v + 8 for
// v < 26; vec2 26 its last 8 bytes, 202 .. 210, d in the high half of .y), padded to 28
// (224 bytes: blocks k and k + 1 then start 12 vec2s apart modulo 16 of the 16 banks of 8
// bytes, so a half-subgroup's low-byte reads of its two blocks take different banks; its
// high-pair reads share 4 banks, a second wavefront).
const SLOT: u32 = 28u;
const SLOT_USED: u32 = 27u;

var<workgroup> staged: array<vec2<u32>, 1792>; // ROWS x STAGE x SLOT: 14,336 bytes

// Piece l's weights of the block in slot `slot` (matvec_bits.wgsl's `q6_k_weights`, read
// from workgroup memory).
fn staged_weights(slot: u32, l: u32) -> Q6kWeights {
    let s = slot * SLOT;
    let h = l >> 2u;
    let m = l & 3u;
    return Q6kWeights(
        staged[s + 8u * h + m],
        staged[s + 8u * h + 4u + m],
        staged[s + 16u + 4u * h + m],
        staged[s + 24u + h],
        unpack2x16float(staged[s + 26u].y >> 16u).x,
    );
}

// Invocation `lid`'s share of the dot products of rows r0 .. r0 + ROWS with token t, one
// component a row. Rows past the part's last read its last row (their sums are not stored).
fn partial(r0: u32, t: u32, lid: u32) -> vec4<f32> {
    let q = part_params();
    let last = q.rows - 1u;
    let rows = (q.row0 + min(row_indices(r0), vec4<u32>(last))) * p.row_bytes;
    let blocks = p.n / 256u;
    let xi = (t + p.token0) * p.n;
    // The invocation's piece of each block of a stage: block lid / 8 of the stage, l = lid % 8.
    let slot = lid >> 3u;
    let l = lid & 7u;
    var acc = vec4<f32>(0.0);
    for (var first = 0u; first < blocks; first += STAGE) {
        let count = min(STAGE, blocks - first);
        // The last stage's reads are done before its slots are written again.
        workgroupBarrier();
        // Item i: vec2 i % 27 of slot i / 27 (row slot / STAGE, block first + slot % STAGE).
        for (var i = lid; i < ROWS * STAGE * SLOT_USED; i += THREADS) {
            let s = i / SLOT_USED;
            let k = s % STAGE;
            if k < count {
                let v = i - s * SLOT_USED;
                let b = rows[s / STAGE] + (first + k) * 210u;
                staged[s * SLOT + v] = words2_at(b + min(8u * v, 202u));
            }
        }
        workgroupBarrier();
        if slot < count {
            let xs = piece_xs(xi, 8u * (first + slot) + l);
            acc += vec4<f32>(
                q6_k_dot(staged_weights(slot, l), l, xs),
                q6_k_dot(staged_weights(STAGE + slot, l), l, xs),
                q6_k_dot(staged_weights(2u * STAGE + slot, l), l, xs),
                q6_k_dot(staged_weights(3u * STAGE + slot, l), l, xs),
            );
        }
    }
    return acc;
}
