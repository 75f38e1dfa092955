//! The CUDA backend's fused ops against its own primitive sequences, value for value:
//! `matmul_bias` (= matmul + add_bias), `matmul_qkv` (= three matmul_bias),
//! `gated_ffn_hidden` (= two matmuls + the SiLU gated activation), `add_rms_norm` (= add +
//! rms_norm) and `rope_kv_write` (= QK norms, two ropes + kv_write, the caches compared
//! through attention over them; f16, f32, tq4 and tq3 caches), for every weight type and the shapes that pick each matvec
//! variant, decode and prompt row counts.
//!
//! Without a CUDA driver or device every test prints a notice and passes, unless
//! `RUNIT_REQUIRE_GPU=1` (set on the GPU machine), where that fails.

use runit_backend::testing::parity::WEIGHT_TYPES;
use runit_backend::testing::{make_weight, Rng};
use runit_backend::{
    Activation, AddRmsNorm, Attention, AttentionParams, Backend, BackendError, Buffer, Device,
    FusedOps, GatedFfn, GatedFfnRun, KvType, KvWrite, PrimitiveOps, Projection, QkNorms, RmsNorm,
    RopeKvWrite, RopeParams, RopeStyle, SequenceSpan, Weight,
};
use runit_backend_cuda::CudaBackend;
use runit_quant::GgmlType;

fn gpu() -> Option<CudaBackend> {
    match CudaBackend::new(0) {
        Ok(cuda) => Some(cuda),
        Err(error) => {
            let require = std::env::var("RUNIT_REQUIRE_GPU").is_ok_and(|v| v == "1");
            assert!(!require, "RUNIT_REQUIRE_GPU=1 but: {error}");
            println!("NOTICE: no CUDA device, fused GPU op tests not run: {error}");
            None
        }
    }
}

fn buffer(backend: &dyn Backend, values: &[f32]) -> Result<Buffer, BackendError> {
    let mut buffer = backend.alloc(values.len())?;
    backend.upload(&mut buffer, values)?;
    Ok(buffer)
}

fn read(backend: &dyn Backend, buffer: &Buffer, len: usize) -> Vec<f32> {
    let mut values = vec![0.0; len];
    backend.download(buffer, &mut values).expect("download");
    values
}

/// The first index where `a` and `b` differ bitwise (NaNs of any payload equal), if any.
fn first_difference(a: &[f32], b: &[f32]) -> Option<(usize, f32, f32)> {
    a.iter()
        .zip(b)
        .enumerate()
        .find(|(_, (x, y))| x.to_bits() != y.to_bits() && !(x.is_nan() && y.is_nan()))
        .map(|(i, (x, y))| (i, *x, *y))
}

fn expect_same(label: &str, fused: &[f32], primitive: &[f32], failures: &mut Vec<String>) {
    assert_eq!(fused.len(), primitive.len());
    if let Some((i, f, p)) = first_difference(fused, primitive) {
        failures.push(format!(
            "{label}: element {i}: fused {f:e}, primitive {p:e}"
        ));
    }
}

/// Weight shapes `(n_in, n_out)` for a type: small, and the shapes that take the float
/// kernels' warp-per-row, four-loads and element-wise variants.
fn shapes(ty: GgmlType) -> Vec<(usize, usize)> {
    let mut shapes = vec![(256, 64), (512, 4224)];
    match ty {
        GgmlType::F32 => shapes.extend([(1024, 8192), (100, 48)]),
        GgmlType::F16 | GgmlType::BF16 => shapes.extend([(2048, 8192), (104, 48)]),
        _ => {}
    }
    shapes
}

const TOKEN_COUNTS: [usize; 6] = [1, 2, 3, 5, 8, 20];

#[test]
fn matmul_bias_equals_matmul_then_add_bias() {
    let Some(cuda) = gpu() else { return };
    let mut failures = Vec::new();
    for ty in WEIGHT_TYPES {
        for (n_in, n_out) in shapes(ty) {
            let mut rng = Rng::new(0xb1a5 + ty.id() as u64 * 13 + n_out as u64);
            let w = rng.normal(n_in * n_out, 0.05);
            let weight = make_weight(&cuda, "test.w", ty, &[n_in, n_out], &w).expect("weight");
            let b = rng.values(n_out, -1.0, 1.0);
            let bias = make_weight(&cuda, "test.b", GgmlType::F32, &[n_out], &b).expect("bias");
            for tokens in TOKEN_COUNTS {
                let label = format!("{ty} [{n_in}, {n_out}] x {tokens}");
                let x = buffer(&cuda, &rng.values(tokens * n_in, -1.0, 1.0)).expect("x");
                let len = tokens * n_out;
                let mut fused = cuda.alloc(len).expect("out");
                let mut primitive = cuda.alloc(len).expect("out");
                let projection = Projection {
                    weight: &weight,
                    bias: Some(&bias),
                };
                let mut run = || -> Result<(), BackendError> {
                    cuda.matmul_bias(projection, &x, tokens, &mut fused)?;
                    cuda.matmul(&weight, &x, tokens, &mut primitive)?;
                    cuda.add_bias(&mut primitive, &bias, tokens)
                };
                if let Err(error) = run() {
                    failures.push(format!("{label}: {error}"));
                    continue;
                }
                let (f, p) = (read(&cuda, &fused, len), read(&cuda, &primitive, len));
                expect_same(&format!("{label} bias"), &f, &p, &mut failures);
                // Without a bias: the plain matmul.
                let projection = Projection {
                    bias: None,
                    ..projection
                };
                cuda.matmul_bias(projection, &x, tokens, &mut fused)
                    .expect("matmul_bias without bias");
                cuda.matmul(&weight, &x, tokens, &mut primitive)
                    .expect("matmul");
                let (f, p) = (read(&cuda, &fused, len), read(&cuda, &primitive, len));
                expect_same(&format!("{label} no bias"), &f, &p, &mut failures);
            }
        }
    }
    assert!(failures.is_empty(), "failures:\n{}", failures.join("\n"));
}

#[test]
fn matmul_qkv_equals_three_matmul_bias() {
    let Some(cuda) = gpu() else { return };
    let mut failures = Vec::new();
    // Every type for all three, and V of another type than Q and K (as Q4_K_M files have
    // Q6_K values): the batched path then runs kernels of two types and merges them together.
    let pairs = WEIGHT_TYPES.iter().map(|&ty| (ty, ty)).chain([
        (GgmlType::Q4_K, GgmlType::Q6_K),
        (GgmlType::Q4_0, GgmlType::Q8_0),
    ]);
    for (ty, v_ty) in pairs {
        // (n_in, n_q, n_kv): short rows, and rows long enough for the Q8_0 long-row variant.
        for (n_in, n_q, n_kv) in [(256, 96, 32), (2048, 256, 64)] {
            let mut rng = Rng::new(0x9c7 + ty.id() as u64 * 7 + v_ty.id() as u64 + n_in as u64);
            let weight = |name: &str, ty: GgmlType, rows: usize, rng: &mut Rng| {
                let w = rng.normal(n_in * rows, 0.05);
                make_weight(&cuda, name, ty, &[n_in, rows], &w).expect("weight")
            };
            let (wq, wk, wv) = (
                weight("test.q", ty, n_q, &mut rng),
                weight("test.k", ty, n_kv, &mut rng),
                weight("test.v", v_ty, n_kv, &mut rng),
            );
            let bias = |name: &str, rows: usize, rng: &mut Rng| {
                let b = rng.values(rows, -1.0, 1.0);
                make_weight(&cuda, name, GgmlType::F32, &[rows], &b).expect("bias")
            };
            let (bq, bk, bv) = (
                bias("test.bq", n_q, &mut rng),
                bias("test.bk", n_kv, &mut rng),
                bias("test.bv", n_kv, &mut rng),
            );
            // Past TOKEN_COUNTS: the pipelined kernels' larger tiles (33 and 64 rows).
            for tokens in TOKEN_COUNTS.into_iter().chain([33, 64]) {
                for with_bias in [true, false] {
                    let label = format!(
                        "{ty}/{v_ty} [{n_in}] q {n_q} kv {n_kv} x {tokens} bias {with_bias}"
                    );
                    let x = buffer(&cuda, &rng.values(tokens * n_in, -1.0, 1.0)).expect("x");
                    let biases = if with_bias {
                        [Some(&bq), Some(&bk), Some(&bv)]
                    } else {
                        [None; 3]
                    };
                    let lens = [tokens * n_q, tokens * n_kv, tokens * n_kv];
                    let mut fused: Vec<Buffer> =
                        lens.iter().map(|&l| cuda.alloc(l).expect("out")).collect();
                    let mut primitive: Vec<Buffer> =
                        lens.iter().map(|&l| cuda.alloc(l).expect("out")).collect();
                    let weights = [&wq, &wk, &wv];
                    let projections = std::array::from_fn(|i| Projection {
                        weight: weights[i],
                        bias: biases[i],
                    });
                    let mut run = || -> Result<(), BackendError> {
                        let [a, b, c] = &mut fused[..] else {
                            unreachable!()
                        };
                        cuda.matmul_qkv(projections, &x, tokens, [a, b, c])?;
                        for (projection, out) in projections.into_iter().zip(primitive.iter_mut()) {
                            cuda.matmul_bias(projection, &x, tokens, out)?;
                        }
                        Ok(())
                    };
                    if let Err(error) = run() {
                        failures.push(format!("{label}: {error}"));
                        continue;
                    }
                    for (i, len) in lens.iter().enumerate() {
                        let (f, p) = (
                            read(&cuda, &fused[i], *len),
                            read(&cuda, &primitive[i], *len),
                        );
                        expect_same(
                            &format!("{label} {}", ["q", "k", "v"][i]),
                            &f,
                            &p,
                            &mut failures,
                        );
                    }
                }
            }
        }
    }
    assert!(failures.is_empty(), "failures:\n{}", failures.join("\n"));
}

#[test]
fn gated_ffn_hidden_equals_two_matmuls_then_silu_mul() {
    let Some(cuda) = gpu() else { return };
    let mut failures = Vec::new();
    for ty in WEIGHT_TYPES {
        for (n_in, n_out) in shapes(ty) {
            let mut rng = Rng::new(0x5e1 + ty.id() as u64 * 17 + n_out as u64);
            let load = |rng: &mut Rng, name: &str| -> Weight {
                let w = rng.normal(n_in * n_out, 0.05);
                make_weight(&cuda, name, ty, &[n_in, n_out], &w).expect("weight")
            };
            let gate = load(&mut rng, "test.gate");
            let up = load(&mut rng, "test.up");
            for tokens in TOKEN_COUNTS {
                let label = format!("{ty} [{n_in}, {n_out}] x {tokens}");
                // Large enough values that silu's exponential matters.
                let x = buffer(&cuda, &rng.values(tokens * n_in, -3.0, 3.0)).expect("x");
                let len = tokens * n_out;
                let mut fused = cuda.alloc(len).expect("out");
                let mut up_scratch = cuda.alloc(len).expect("up");
                let mut primitive = cuda.alloc(len).expect("out");
                let mut up_out = cuda.alloc(len).expect("up");
                let mut run = || -> Result<(), BackendError> {
                    cuda.gated_ffn_hidden(GatedFfnRun {
                        // The hidden layer does not read the down projection.
                        ffn: GatedFfn {
                            gate: &gate,
                            up: &up,
                            down: &gate,
                            activation: Activation::Silu,
                        },
                        x: &x,
                        tokens,
                        up: &mut up_scratch,
                        hidden: &mut fused,
                    })?;
                    cuda.matmul(&gate, &x, tokens, &mut primitive)?;
                    cuda.matmul(&up, &x, tokens, &mut up_out)?;
                    cuda.gated_activation(Activation::Silu, &mut primitive, &up_out, len)
                };
                if let Err(error) = run() {
                    failures.push(format!("{label}: {error}"));
                    continue;
                }
                let (f, p) = (read(&cuda, &fused, len), read(&cuda, &primitive, len));
                expect_same(&label, &f, &p, &mut failures);
            }
        }
    }
    assert!(failures.is_empty(), "failures:\n{}", failures.join("\n"));
}

/// Gate, up (`[n_embd, n_ff]`) and down (`[n_ff, n_embd]`) weights of type `ty`.
fn ffn_weights(
    cuda: &CudaBackend,
    ty: GgmlType,
    n_embd: usize,
    n_ff: usize,
    rng: &mut Rng,
) -> (Weight, Weight, Weight) {
    let mut load = |name: &str, shape: [usize; 2]| -> Weight {
        let w = rng.normal(shape[0] * shape[1], 0.05);
        make_weight(cuda, name, ty, &shape, &w).expect("weight")
    };
    (
        load("test.gate", [n_embd, n_ff]),
        load("test.up", [n_embd, n_ff]),
        load("test.down", [n_ff, n_embd]),
    )
}

/// The batched FFN (beyond the matvecs' rows) writes the down projection's f16 input with
/// the activation (`silu_mul_f16_cpu`, or `silu_mul_merge_f16_cpu` adding the pipelined gate
/// and up matmuls' cut row blocks itself): the hidden layer, up's output and the result equal
/// the primitive sequence's bit for bit, for the q8 rounding of each weight type and both
/// batched paths (pipelined kernels and GEMM); rows of 2,048 values cut the gate's and up's
/// row blocks between grid blocks (stream-K slots), rows of 256 do not.
#[test]
fn gated_ffn_equals_two_matmuls_silu_mul_then_down() {
    let Some(cuda) = gpu() else { return };
    let mut failures = Vec::new();
    for (ty, (n_embd, n_ff)) in WEIGHT_TYPES
        .into_iter()
        .flat_map(|ty| [(ty, (256, 768)), (ty, (2048, 768))])
    {
        let mut rng = Rng::new(0xd0e + ty.id() as u64 * 31 + n_embd as u64);
        let (gate, up, down) = ffn_weights(&cuda, ty, n_embd, n_ff, &mut rng);
        for tokens in [9, 20, 64, 100] {
            let label = format!("{ty} [{n_embd}, {n_ff}] x {tokens}");
            let x = buffer(&cuda, &rng.values(tokens * n_embd, -3.0, 3.0)).expect("x");
            let (len, out_len) = (tokens * n_ff, tokens * n_embd);
            let mut hidden = cuda.alloc(len).expect("hidden");
            let mut up_scratch = cuda.alloc(len).expect("up");
            let mut out = cuda.alloc(out_len).expect("out");
            let mut primitive = cuda.alloc(len).expect("hidden");
            let mut up_out = cuda.alloc(len).expect("up");
            let mut primitive_out = cuda.alloc(out_len).expect("out");
            let mut run = || -> Result<(), BackendError> {
                let run = GatedFfnRun {
                    ffn: GatedFfn {
                        gate: &gate,
                        up: &up,
                        down: &down,
                        activation: Activation::Silu,
                    },
                    x: &x,
                    tokens,
                    up: &mut up_scratch,
                    hidden: &mut hidden,
                };
                cuda.gated_ffn(run, &mut out)?;
                cuda.matmul(&gate, &x, tokens, &mut primitive)?;
                cuda.matmul(&up, &x, tokens, &mut up_out)?;
                cuda.gated_activation(Activation::Silu, &mut primitive, &up_out, len)?;
                cuda.matmul(&down, &primitive, tokens, &mut primitive_out)
            };
            if let Err(error) = run() {
                failures.push(format!("{label}: {error}"));
                continue;
            }
            let (h, p) = (read(&cuda, &hidden, len), read(&cuda, &primitive, len));
            expect_same(&format!("{label} hidden"), &h, &p, &mut failures);
            let (u, p) = (read(&cuda, &up_scratch, len), read(&cuda, &up_out, len));
            expect_same(&format!("{label} up"), &u, &p, &mut failures);
            let (o, p) = (
                read(&cuda, &out, out_len),
                read(&cuda, &primitive_out, out_len),
            );
            expect_same(&format!("{label} out"), &o, &p, &mut failures);
        }
    }
    assert!(failures.is_empty(), "failures:\n{}", failures.join("\n"));
}

#[test]
fn add_rms_norm_equals_add_then_rms_norm() {
    let Some(cuda) = gpu() else { return };
    let mut failures = Vec::new();
    let mut rng = Rng::new(0xadd);
    for width in [64, 256, 896, 1000, 4096] {
        let w = rng.values(width, 0.5, 1.5);
        let weight = make_weight(&cuda, "test.norm", GgmlType::F32, &[width], &w).expect("w");
        for rows in [1, 3, 9] {
            let label = format!("width {width} x {rows}");
            let len = rows * width;
            let x0 = rng.values(len, -2.0, 2.0);
            let delta = buffer(&cuda, &rng.values(len, -2.0, 2.0)).expect("delta");
            let mut x_fused = buffer(&cuda, &x0).expect("x");
            let mut x_primitive = buffer(&cuda, &x0).expect("x");
            let mut fused = cuda.alloc(len).expect("out");
            let mut primitive = cuda.alloc(len).expect("out");
            let norm = RmsNorm {
                weight: &weight,
                eps: 1e-6,
            };
            let mut run = || -> Result<(), BackendError> {
                cuda.add_rms_norm(AddRmsNorm {
                    x: &mut x_fused,
                    delta: &delta,
                    norm,
                    rows,
                    out: &mut fused,
                })?;
                cuda.add(&mut x_primitive, &delta, len)?;
                cuda.rms_norm(&x_primitive, norm, rows, &mut primitive)
            };
            if let Err(error) = run() {
                failures.push(format!("{label}: {error}"));
                continue;
            }
            let (xf, xp) = (read(&cuda, &x_fused, len), read(&cuda, &x_primitive, len));
            expect_same(&format!("{label} residual"), &xf, &xp, &mut failures);
            let (f, p) = (read(&cuda, &fused, len), read(&cuda, &primitive, len));
            expect_same(&format!("{label} norm"), &f, &p, &mut failures);
        }
    }
    assert!(failures.is_empty(), "failures:\n{}", failures.join("\n"));
}

/// An add + norm over a batch writes its output's f16 conversion for the batched matmul that
/// reads it (in the q8 mode the last conversion of rows of that length took): the matmul's
/// result equals add, rms_norm and matmul run as primitives, bit for bit, for each mode (Q8_0:
/// 0, Q4_1: 1, Q4_K: 2), a warp a row (256) and a block a row (4096), 9 and 33 rows.
#[test]
fn add_rms_norm_then_a_batched_matmul_equals_the_primitives() {
    let Some(cuda) = gpu() else { return };
    let mut failures = Vec::new();
    let mut rng = Rng::new(0xadd16);
    for ty in [GgmlType::Q8_0, GgmlType::Q4_1, GgmlType::Q4_K] {
        for width in [256, 4096] {
            let n_out = 384;
            let w = rng.normal(width * n_out, 0.05);
            let weight = make_weight(&cuda, "test.w", ty, &[width, n_out], &w).expect("weight");
            let g = rng.values(width, 0.5, 1.5);
            let norm_weight =
                make_weight(&cuda, "test.norm", GgmlType::F32, &[width], &g).expect("norm");
            let norm = RmsNorm {
                weight: &norm_weight,
                eps: 1e-6,
            };
            for rows in [9, 33] {
                let label = format!("{ty} width {width} x {rows}");
                let len = rows * width;
                let x0 = rng.values(len, -2.0, 2.0);
                let delta = buffer(&cuda, &rng.values(len, -2.0, 2.0)).expect("delta");
                let mut x_fused = buffer(&cuda, &x0).expect("x");
                let mut x_primitive = buffer(&cuda, &x0).expect("x");
                let mut normed_fused = cuda.alloc(len).expect("normed");
                let mut normed_primitive = cuda.alloc(len).expect("normed");
                let mut fused = cuda.alloc(rows * n_out).expect("out");
                let mut primitive = cuda.alloc(rows * n_out).expect("out");
                let mut run = || -> Result<(), BackendError> {
                    // The primitives first: their matmul's conversion sets the mode.
                    cuda.add(&mut x_primitive, &delta, len)?;
                    cuda.rms_norm(&x_primitive, norm, rows, &mut normed_primitive)?;
                    cuda.matmul(&weight, &normed_primitive, rows, &mut primitive)?;
                    cuda.add_rms_norm(AddRmsNorm {
                        x: &mut x_fused,
                        delta: &delta,
                        norm,
                        rows,
                        out: &mut normed_fused,
                    })?;
                    cuda.matmul(&weight, &normed_fused, rows, &mut fused)
                };
                if let Err(error) = run() {
                    failures.push(format!("{label}: {error}"));
                    continue;
                }
                let (f, p) = (
                    read(&cuda, &normed_fused, len),
                    read(&cuda, &normed_primitive, len),
                );
                expect_same(&format!("{label} norm"), &f, &p, &mut failures);
                let (f, p) = (
                    read(&cuda, &fused, rows * n_out),
                    read(&cuda, &primitive, rows * n_out),
                );
                expect_same(&format!("{label} matmul"), &f, &p, &mut failures);
            }
        }
    }
    assert!(failures.is_empty(), "failures:\n{}", failures.join("\n"));
}

#[test]
fn rope_kv_write_equals_ropes_then_kv_write() {
    let Some(cuda) = gpu() else { return };
    let mut failures = Vec::new();
    let (heads, kv_heads, head_dim) = (14, 2, 64);
    let (q_width, kv_width) = (heads * head_dim, kv_heads * head_dim);
    let block_size = 16;
    // Two prompt chunks from position 0 (every attended cell is written) and a decode row.
    let spans = vec![
        SequenceSpan {
            first_row: 0,
            rows: 5,
            start_position: 0,
            block_table: vec![3],
            block_size,
        },
        SequenceSpan {
            first_row: 5,
            rows: 18,
            start_position: 0,
            block_table: vec![0, 2],
            block_size,
        },
        SequenceSpan {
            first_row: 23,
            rows: 1,
            start_position: 0,
            block_table: vec![1],
            block_size,
        },
    ];
    let positions: Vec<u32> = spans
        .iter()
        .flat_map(|s| (s.start_position..s.start_position + s.rows).map(|p| p as u32))
        .collect();
    let tokens = positions.len();
    let n_cells = 4 * block_size;
    let mut rng = Rng::new(0x20be);
    let q0 = rng.values(tokens * q_width, -1.0, 1.0);
    let k0 = rng.values(tokens * kv_width, -1.0, 1.0);
    let v0 = rng.values(tokens * kv_width, -1.0, 1.0);
    let attention = AttentionParams {
        heads,
        kv_heads,
        head_dim,
        scale: 1.0 / (head_dim as f32).sqrt(),
        sliding_window: None,
    };
    // TurboQuant caches take rope_kv_write_turbo (one launch), Q8_0 and Q4_0 caches
    // rope_kv_write_blocks under RUNIT_CUDA_BLOCK_ROPE_WRITE=1: the same values.
    for kv_type in [
        KvType::F16,
        KvType::F32,
        KvType::Tq4,
        KvType::Tq3,
        KvType::Q8_0,
        KvType::Q4_0,
    ] {
        for (style, rotary_dim, with_factors, with_norms, full_width) in [
            (RopeStyle::Neox, 64, false, false, false),
            (RopeStyle::Normal, 64, true, false, false),
            (RopeStyle::Neox, 32, false, false, false),
            (RopeStyle::Neox, 64, false, true, false),
            (RopeStyle::Normal, 32, true, true, false),
            (RopeStyle::Neox, 64, true, true, true),
        ] {
            let label = format!(
                "{kv_type:?} {style:?} rotary {rotary_dim} factors {with_factors} norms {with_norms} (full width {full_width})"
            );
            // Qwen3-style per-head q/k norms (weights of head_dim values), or OLMoE-style
            // norms over the whole projection.
            let norms = with_norms.then(|| {
                let weight = |name: &str, width: usize, rng: &mut Rng| {
                    let width = if full_width { width } else { head_dim };
                    let w = rng.values(width, 0.5, 1.5);
                    make_weight(&cuda, name, GgmlType::F32, &[width], &w).expect("norm")
                };
                (
                    weight("test.q_norm", q_width, &mut rng),
                    weight("test.k_norm", kv_width, &mut rng),
                )
            });
            let qk_norms = norms.as_ref().map(|(q, k)| QkNorms { q, k, eps: 1e-6 });
            let q_params = RopeParams {
                style,
                heads,
                head_dim,
                rotary_dim,
                theta: 1_000_000.0,
                freq_scale: 1.0,
                yarn: None,
            };
            let k_params = RopeParams {
                heads: kv_heads,
                ..q_params.clone()
            };
            let factors = with_factors.then(|| {
                let f = rng.values(rotary_dim / 2, 1.0, 4.0);
                make_weight(
                    &cuda,
                    "test.rope_freqs",
                    GgmlType::F32,
                    &[rotary_dim / 2],
                    &f,
                )
                .expect("factors")
            });
            let mut outputs = Vec::new();
            for fused in [true, false] {
                let run = || -> Result<[Vec<f32>; 3], BackendError> {
                    let mut q = buffer(&cuda, &q0)?;
                    let mut k = buffer(&cuda, &k0)?;
                    let mut v = buffer(&cuda, &v0)?;
                    let mut k_cache = cuda.alloc_kv(
                        n_cells,
                        kv_width,
                        head_dim,
                        kv_type,
                        runit_backend::KvRole::Keys,
                    )?;
                    let mut v_cache = cuda.alloc_kv(
                        n_cells,
                        kv_width,
                        head_dim,
                        kv_type,
                        runit_backend::KvRole::Values,
                    )?;
                    if fused {
                        cuda.rope_kv_write(RopeKvWrite {
                            q: &mut q,
                            k: &mut k,
                            v: &mut v,
                            positions: &positions,
                            q_rope: &q_params,
                            k_rope: &k_params,
                            freq_factors: factors.as_ref(),
                            k_cache: &mut k_cache,
                            v_cache: &mut v_cache,
                            spans: &spans,
                            qk_norms,
                        })?;
                    } else {
                        if let Some(n) = qk_norms {
                            let q_rows = tokens * q_width / n.q.row_len();
                            let k_rows = tokens * kv_width / n.k.row_len();
                            let norm = |weight| RmsNorm { weight, eps: n.eps };
                            cuda.rms_norm_in_place(&mut q, norm(n.q), q_rows)?;
                            cuda.rms_norm_in_place(&mut k, norm(n.k), k_rows)?;
                        }
                        cuda.rope(&mut q, &positions, &q_params, factors.as_ref())?;
                        cuda.rope(&mut k, &positions, &k_params, factors.as_ref())?;
                        cuda.kv_write(KvWrite {
                            k: &k,
                            v: &v,
                            k_cache: &mut k_cache,
                            v_cache: &mut v_cache,
                            spans: &spans,
                        })?;
                    }
                    let mut out = cuda.alloc(tokens * q_width)?;
                    let attend = Attention {
                        q: &q,
                        k_cache: &k_cache,
                        v_cache: &v_cache,
                        spans: &spans,
                        params: &attention,
                    };
                    cuda.attention(&attend, &mut out)?;
                    Ok([
                        read(&cuda, &q, tokens * q_width),
                        read(&cuda, &k, tokens * kv_width),
                        read(&cuda, &out, tokens * q_width),
                    ])
                };
                match run() {
                    Ok(values) => outputs.push(values),
                    Err(error) => failures.push(format!("{label} fused {fused}: {error}")),
                }
            }
            if let [f, p] = &outputs[..] {
                for (what, a, b) in [("q", &f[0], &p[0]), ("k", &f[1], &p[1])] {
                    expect_same(&format!("{label} {what}"), a, b, &mut failures);
                }
                expect_same(&format!("{label} attention"), &f[2], &p[2], &mut failures);
            }
        }
    }
    assert!(failures.is_empty(), "failures:\n{}", failures.join("\n"));
}
