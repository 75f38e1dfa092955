// The matrix-vector kernel's loop over a row's pieces (matvec.wgsl), reading each piece's
// weights where they lie (`piece_dot`).

// Invocation `lid`'s share of the dot products of rows r0 .. r0 + ROWS with token t, one
// component a row. Rows past the part's last read its last row (their sums are not stored).
fn partial(r0: u32, t: u32, lid: u32) -> vec4<f32> {
    let q = part_params();
    let last = q.rows - 1u;
    let rows = (q.row0 + min(row_indices(r0), vec4<u32>(last))) * p.row_bytes;
    let pieces = p.n / PIECE;
    let xi = (t + p.token0) * p.n;
    var acc = vec4<f32>(0.0);
    for (var i = lid; i < pieces; i += THREADS) {
        let xs = piece_xs(xi, i);
        acc += vec4<f32>(
            piece_dot(rows.x, i, xs),
            piece_dot(rows.y, i, xs),
            piece_dot(rows.z, i, xs),
            piece_dot(rows.w, i, xs),
        );
    }
    return acc;
}
