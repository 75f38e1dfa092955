// gate[i] = activation(gate[i]) * up[i] for i < len: SiLU (kind 0) or GELU-tanh (kind 1)
// through ggml's table of f16 results (`runit_backend::gelu`, packed two entries a word).
// SiLU is ggml's `ggml_vec_swiglu_f32` on the CPU's reference machine (the CPU backend's
// `vector/silu.rs`): x / (1 + v_expf(0 - x)) with ggml's polynomial `ggml_v_expf` for whole
// groups of 16 values, libm's `expf` (`expf.wgsl`) for the last len % 16.
// `activated` takes the length and the kind from its caller and needs the table `gelu_table`,
// which the entry points declare (gated_one.wgsl; gated_quantize.wgsl, which then rounds the
// results for the next matmul; matvec_gated.wgsl, the down projection's prologue).

fn gelu(x: f32) -> f32 {
    if x <= -10.0 {
        return 0.0;
    }
    if x >= 10.0 {
        return x;
    }
    let bits = f16_bits_rn(x);
    let word = gelu_table[bits >> 1u] >> ((bits & 1u) * 16u);
    return unpack2x16float(word & 0xffffu).x;
}

// Value i of the `len` results from its gate value `x` and up value `u` (`kind` 0: SiLU, 1:
// GELU-tanh).
fn activated(i: u32, x: f32, u: f32, len: u32, kind: u32) -> f32 {
    if kind == 0u {
        // One of the two exponentials (`select` would compute both, and glibc's `expf` in
        // float-floats is the longer).
        var e: f32;
        if i < len - len % 16u {
            e = vector_exp(0.0 - x);
        } else {
            e = expf(0.0 - x);
        }
        return div_rn(x, 1.0 + e) * u;
    } else if x >= 10.0 {
        return x * u;
    }
    return gelu(x) * u;
}

/// One lane of ggml's AVX-512 `ggml_v_expf` (the CPU backend's `vector_exp`).
fn vector_exp(x: f32) -> f32 {
    let shift = bitcast<f32>(0x4b400000u);
    let z = opaque(fma_exact(x, bitcast<f32>(0x3fb8aa3bu), shift));
    let n = z - shift;
    let b = fma_exact(-n, bitcast<f32>(0x35bfbe8eu), fma_exact(-n, bitcast<f32>(0x3f317200u), x));
    let u = b * b;
    let c5 = bitcast<f32>(0x3c072010u);
    let c4 = bitcast<f32>(0x3d2b9f17u);
    let c3 = bitcast<f32>(0x3e2aaf33u);
    let c2 = bitcast<f32>(0x3efffedbu);
    let c1 = bitcast<f32>(0x3f7ffff6u);
    let j = fma_exact(fma_exact(fma_exact(c5, b, c4), u, fma_exact(c3, b, c2)), u, fma_exact(c1, b, 1.0));
    if abs(n) > 192.0 {
        // 0, or infinity (j is about 1).
        return select(ldexp(j, 200), 0.0, n <= 0.0);
    }
    if n >= -126.0 && n <= 127.0 {
        // 2^n is a normal f32: one multiplication, one rounding.
        return j * bitcast<f32>(u32(i32(n) + 127) << 23u);
    }
    return ldexp(j, i32(n));
}
