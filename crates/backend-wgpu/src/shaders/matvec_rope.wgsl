// The RoPE epilogue of the Q/K/V matrix-vector kernel (`FusedOps::qkv_rope_kv_write`, one
// token): the rows of Q's and K's parts are taken as rotation pairs, a workgroup's four rows
// two pairs of one head (NEOX: i, i + 1, i + half, i + half + 1 with i even; normal: 2k .. 2k
// + 3), so that invocation 0 has both values of each pair from the reduction. It adds the
// biases, rotates Q's and K's pairs (`rotate`, as rope.wgsl does, with the token's angles
// `angles[k]`), writes the three outputs and writes K's and V's rows into the cache cell
// `p.extra0` (f16 words of two adjacent values, or f32: `p.extra2` bit 0 for the keys, bit 1
// for the values, as kv_write.wgsl writes them). The results equal the Q/K/V dispatch, then
// rope_kv_write.wgsl's, bit for bit. HEAD_DIM and NEOX are the host's; the angles and the two
// caches are bound after the parts (and the biases) at ANGLES_BINDING, + 1 and + 2.

@group(0) @binding(ANGLES_BINDING) var<storage, read> angles: array<vec2<f32>>;
@group(0) @binding(K_CACHE_BINDING) var<storage, read_write> k_cache: array<u32>;
@group(0) @binding(V_CACHE_BINDING) var<storage, read_write> v_cache: array<u32>;

fn row_indices(r0: u32) -> vec4<u32> {
    if part == 2u || !NEOX {
        return vec4<u32>(r0) + vec4<u32>(0u, 1u, 2u, 3u);
    }
    let half = HEAD_DIM / 2u;
    let base = r0 - r0 % HEAD_DIM;
    let i = 2u * ((r0 % HEAD_DIM) / 4u);
    return vec4<u32>(base + i, base + i + 1u, base + i + half, base + i + half + 1u);
}

fn cache_word(keys: bool, at: u32, value: u32) {
    if keys {
        k_cache[at] = value;
    } else {
        v_cache[at] = value;
    }
}

fn finish(r0: u32, t: u32, lid: u32, sums: vec4<f32>) {
    if lid != 0u {
        return;
    }
    let q = part_params();
    let rows = row_indices(r0);
    let first = t * q.out_stride + q.out_row0;
    var v = vec4<f32>(0.0);
    for (var k = 0u; k < 4u; k++) {
        v[k] = biased(first + rows[k], sums[k]);
    }
    if part < 2u {
        let d = rows[0] % HEAD_DIM;
        if NEOX {
            let a = rotate(v.x, v.z, angles[d]);
            let b = rotate(v.y, v.w, angles[d + 1u]);
            v = vec4<f32>(a.x, b.x, a.y, b.y);
        } else {
            let a = rotate(v.x, v.y, angles[d / 2u]);
            let b = rotate(v.z, v.w, angles[d / 2u + 1u]);
            v = vec4<f32>(a, b);
        }
    }
    for (var k = 0u; k < 4u; k++) {
        write_part(first + rows[k], v[k]);
    }
    if part == 0u {
        return;
    }
    // The cache row of the token's cell: rows (0, 1) and (2, 3) are adjacent values.
    let keys = part == 1u;
    let f16 = ((p.extra2 >> (part - 1u)) & 1u) == 1u;
    let at = p.extra0 * q.rows;
    if f16 {
        cache_word(keys, (at + rows[0]) / 2u, pack_f16_rn(v.x, v.y));
        cache_word(keys, (at + rows[2]) / 2u, pack_f16_rn(v.z, v.w));
    } else {
        for (var k = 0u; k < 4u; k++) {
            cache_word(keys, at + rows[k], bitcast<u32>(v[k]));
        }
    }
}
