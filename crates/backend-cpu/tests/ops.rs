//! Hand-checked values of the CPU ops through the `Backend` trait.

use std::sync::Arc;

use runit_backend::testing::{make_weight, Rng};
use runit_backend::{
    Activation, Attention, AttentionOutput, AttentionParams, Backend, BackendError, Buffer, Device,
    FusedOps, GatedFfn, GatedFfnRun, KvType, KvWrite, PrimitiveOps, Projection, RopeParams,
    RopeStyle, SequenceSpan, Weight, WeightRole, WeightSource,
};
use runit_backend_cpu::{CpuBackend, SimdLevel};
use runit_quant::GgmlType;

fn backends() -> Vec<CpuBackend> {
    vec![
        CpuBackend::with_simd(1, SimdLevel::Scalar).unwrap(),
        CpuBackend::new(2).unwrap(),
    ]
}

fn buffer(b: &dyn Backend, values: &[f32]) -> Buffer {
    let mut buffer = b.alloc(values.len()).unwrap();
    b.upload(&mut buffer, values).unwrap();
    buffer
}

fn read(b: &dyn Backend, buffer: &Buffer) -> Vec<f32> {
    let mut out = vec![0.0; buffer.len()];
    b.download(buffer, &mut out).unwrap();
    out
}

fn span(first_row: usize, rows: usize, start_position: usize, table: &[u32]) -> SequenceSpan {
    SequenceSpan {
        first_row,
        rows,
        start_position,
        block_table: table.to_vec(),
        block_size: 4,
    }
}

/// Attention of two tokens, one head pair sharing a KV head, computed in f64 by hand.
#[test]
fn attention_of_two_tokens_matches_f64() {
    let head_dim = 4;
    // Two query heads over one KV head; tokens at positions 0 and 1.
    let q = [
        [0.5, -1.0, 0.25, 2.0, -0.5, 0.75, 1.0, 0.0], // token 0: head 0, head 1
        [1.5, 0.5, -0.25, 1.0, 0.0, -1.0, 0.5, 0.25], // token 1
    ];
    let k: [[f32; 4]; 2] = [[1.0, 0.5, -0.5, 0.25], [-0.75, 1.0, 0.5, 2.0]];
    let v: [[f32; 4]; 2] = [[0.5, 1.0, -1.0, 2.0], [1.5, -0.5, 0.25, 0.0]];
    let scale = 0.5f64;
    let mut expected = vec![0.0f64; 2 * 2 * head_dim];
    for t in 0..2 {
        for h in 0..2 {
            let query = &q[t][h * head_dim..(h + 1) * head_dim];
            let scores: Vec<f64> = (0..=t)
                .map(|j| {
                    let dot: f64 = (0..head_dim).map(|d| f64::from(query[d] * k[j][d])).sum();
                    scale * dot
                })
                .collect();
            let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let weights: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
            let total: f64 = weights.iter().sum();
            for d in 0..head_dim {
                expected[(t * 2 + h) * head_dim + d] = (0..=t)
                    .map(|j| weights[j] * f64::from(v[j][d]))
                    .sum::<f64>()
                    / total;
            }
        }
    }
    let params = AttentionParams {
        heads: 2,
        kv_heads: 1,
        head_dim,
        scale: scale as f32,
        sliding_window: None,
    };
    for b in backends() {
        // All values are multiples of 1/4: exact in f16, so both cache types give ~f32 results.
        for (kv_type, tolerance) in [(KvType::F32, 1e-6), (KvType::F16, 2e-3)] {
            let mut k_cache = b
                .alloc_kv(8, head_dim, head_dim, kv_type, runit_backend::KvRole::Keys)
                .unwrap();
            let mut v_cache = b
                .alloc_kv(
                    8,
                    head_dim,
                    head_dim,
                    kv_type,
                    runit_backend::KvRole::Values,
                )
                .unwrap();
            // Positions 0..2 live in block 1 (cells 4, 5).
            let spans = [span(0, 2, 0, &[1])];
            let k_buffer = buffer(&b, &k.concat());
            let v_buffer = buffer(&b, &v.concat());
            b.kv_write(KvWrite {
                k: &k_buffer,
                v: &v_buffer,
                k_cache: &mut k_cache,
                v_cache: &mut v_cache,
                spans: &spans,
            })
            .unwrap();
            let mut out = b.alloc(16).unwrap();
            let attention = Attention {
                q: &buffer(&b, &q.concat()),
                k_cache: &k_cache,
                v_cache: &v_cache,
                spans: &spans,
                params: &params,
            };
            b.attention(&attention, &mut out).unwrap();
            for (got, want) in read(&b, &out).iter().zip(&expected) {
                assert!(
                    (f64::from(*got) - want).abs() < tolerance,
                    "{kv_type:?}: {got} vs {want}"
                );
            }
            // Token 0 sees only itself: exactly its value row.
            assert_eq!(read(&b, &out)[..4], v[0]);
        }
    }
}

/// A window of 1 shows each query only its own key: the output is its value, rounded to f16.
#[test]
fn sliding_window_of_one_returns_own_value() {
    let params = AttentionParams {
        heads: 1,
        kv_heads: 1,
        head_dim: 2,
        scale: 1.0,
        sliding_window: Some(1),
    };
    for b in backends() {
        let mut k_cache = b
            .alloc_kv(8, 2, 2, KvType::F16, runit_backend::KvRole::Keys)
            .unwrap();
        let mut v_cache = b
            .alloc_kv(8, 2, 2, KvType::F16, runit_backend::KvRole::Values)
            .unwrap();
        let spans = [span(0, 3, 0, &[1, 0])];
        let v = [0.1f32, 0.2, 0.3, 0.4, 0.5, 0.6];
        let k = [1.0f32, 0.0, 0.0, 1.0, 1.0, 1.0];
        b.kv_write(KvWrite {
            k: &buffer(&b, &k),
            v: &buffer(&b, &v),
            k_cache: &mut k_cache,
            v_cache: &mut v_cache,
            spans: &spans,
        })
        .unwrap();
        let mut out = b.alloc(6).unwrap();
        let attention = Attention {
            q: &buffer(&b, &[1.0; 6]),
            k_cache: &k_cache,
            v_cache: &v_cache,
            spans: &spans,
            params: &params,
        };
        b.attention(&attention, &mut out).unwrap();
        let rounded: Vec<f32> = v.iter().map(|x| half::f16::from_f32(*x).to_f32()).collect();
        assert_eq!(read(&b, &out), rounded);
    }
}

#[test]
fn rope_of_a_known_vector() {
    let params = RopeParams {
        style: RopeStyle::Neox,
        heads: 1,
        head_dim: 6,
        rotary_dim: 4,
        theta: 10_000.0,
        freq_scale: 1.0,
        yarn: None,
    };
    for b in backends() {
        let mut x = buffer(&b, &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
        b.rope(&mut x, &[2], &params, None).unwrap();
        // Pairs (0, 2) and (1, 3): angles 2 and 2 / 100; dims 4 and 5 untouched.
        let (a, c) = (2.0f64, 0.02f64);
        let expected = [
            a.cos() - 3.0 * a.sin(),
            2.0 * c.cos() - 4.0 * c.sin(),
            a.sin() + 3.0 * a.cos(),
            2.0 * c.sin() + 4.0 * c.cos(),
            5.0,
            6.0,
        ];
        for (got, want) in read(&b, &x).iter().zip(expected) {
            assert!((f64::from(*got) - want).abs() < 1e-5, "{got} vs {want}");
        }
    }
}

#[test]
fn embedding_dequantizes_rows() {
    let values: Vec<f32> = (0..96).map(|i| (i as f32 - 40.0) / 16.0).collect();
    for b in backends() {
        let table = make_weight(&b, "token_embd", GgmlType::Q8_0, &[32, 3], &values).unwrap();
        let mut out = b.alloc(64).unwrap();
        b.embedding(&table, &[2, 0], &mut out).unwrap();
        let mut packed = vec![0u8; 3 * 34];
        runit_quant::quantize(GgmlType::Q8_0, &values, &mut packed).unwrap();
        let mut exact = vec![0.0f32; 96];
        runit_quant::dequantize(GgmlType::Q8_0, &packed, &mut exact).unwrap();
        let got = read(&b, &out);
        assert_eq!(got[..32], exact[64..]);
        assert_eq!(got[32..], exact[..32]);
    }
}

#[test]
fn matmul_of_a_small_f32_matrix() {
    // W = [[1, 2, ...], [-1, ...]] of 32 columns; x = ones and a ramp.
    let w: Vec<f32> = (0..64)
        .map(|i| if i < 32 { 1.0 } else { (i - 32) as f32 })
        .collect();
    let x: Vec<f32> = (0..64).map(|i| if i < 32 { 1.0 } else { 0.5 }).collect();
    for b in backends() {
        let weight = make_weight(&b, "w", GgmlType::F32, &[32, 2], &w).unwrap();
        let mut out = b.alloc(4).unwrap();
        b.matmul(&weight, &buffer(&b, &x), 2, &mut out).unwrap();
        assert_eq!(read(&b, &out), [32.0, 496.0, 16.0, 248.0]);
    }
}

#[test]
fn bad_inputs_are_errors() {
    let b = CpuBackend::new(1).unwrap();
    let foreign = Buffer::new(4, Box::new(7u8));
    let mut dst = b.alloc(4).unwrap();
    assert!(matches!(
        b.add(&mut dst, &foreign, 4),
        Err(BackendError::ForeignBuffer { .. })
    ));
    assert!(matches!(
        b.add(&mut dst, &b.alloc(3).unwrap(), 4),
        Err(BackendError::Shape {
            expected: 4,
            found: 3,
            ..
        })
    ));
    let memory: Arc<dyn runit_backend::HostMemory> = Arc::new(vec![0u8; 10]);
    let source = |shape| WeightSource {
        name: "w",
        role: WeightRole::Matrix,
        ty: GgmlType::Q4_0,
        shape,
        memory: memory.clone(),
        range: 0..10,
    };
    assert!(matches!(
        b.load_weight(source(&[32, 1])),
        Err(BackendError::Shape {
            expected: 18,
            found: 10,
            ..
        })
    ));
    assert!(b.load_weight(source(&[30, 1])).is_err());
    let mut q = b.alloc(8).unwrap();
    let params = RopeParams {
        style: RopeStyle::Normal,
        heads: 1,
        head_dim: 4,
        rotary_dim: 3,
        theta: 1.0,
        freq_scale: 1.0,
        yarn: None,
    };
    assert!(b.rope(&mut q, &[0, 1], &params, None).is_err());
    assert!(CpuBackend::with_simd(1, SimdLevel::Neon).is_err() || cfg!(target_arch = "aarch64"));
}

// Batch invariance of the CPU matmul: every output row is bit-identical whether its
// activation row is multiplied alone or inside a batch of any size (the server's outputs must
// not depend on what else is in the batch, and llama.cpp's per-row order does not either for
// the `vec_dot` types).

fn matmul_rows(
    b: &dyn Backend,
    w: &runit_backend::Weight,
    x: &[f32],
    tokens: usize,
    n_out: usize,
) -> Vec<f32> {
    let input = buffer(b, x);
    let mut out = b.alloc(tokens * n_out).unwrap();
    b.matmul(w, &input, tokens, &mut out).unwrap();
    read(b, &out)
}

/// Types whose ggml order is the same for one row and for many (`vec_dot` or tinyBLAS with the
/// same per-element arithmetic). Q4_0, Q4_K, IQ4_NL and Q2_K follow ggml's repacked gemm for
/// groups of four rows and its gemv for the rest, as llama.cpp does, so they are not invariant
/// by design; F16/BF16/F32 batches follow tinyBLAS.
const INVARIANT: &[GgmlType] = &[
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Q3_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
    GgmlType::IQ4_XS,
];

#[test]
fn matmul_rows_do_not_depend_on_the_batch() {
    let backend = CpuBackend::new(2).unwrap();
    let (k, n_out) = (1536, 64);
    let mut rng = Rng::new(11);
    let weights = rng.normal(k * n_out, 0.06);
    let mut x = rng.normal(k * 128, 1.0);
    // Massive outliers like SmolLM2's SwiGLU outputs.
    for t in 0..128 {
        x[t * k + (t * 37) % k] = 40.0;
    }
    let mut failures = Vec::new();
    for &ty in INVARIANT {
        let w = make_weight(&backend, "w", ty, &[k, n_out], &weights).unwrap();
        let whole = matmul_rows(&backend, &w, &x, 128, n_out);
        for batch in [1usize, 3, 4, 8, 32, 48, 64] {
            let mut pieces = Vec::new();
            let mut t = 0;
            while t < 128 {
                let rows = batch.min(128 - t);
                pieces.extend(matmul_rows(
                    &backend,
                    &w,
                    &x[t * k..(t + rows) * k],
                    rows,
                    n_out,
                ));
                t += rows;
            }
            let differing = whole
                .iter()
                .zip(&pieces)
                .filter(|(a, b)| a.to_bits() != b.to_bits())
                .count();
            if differing > 0 {
                failures.push(format!("{ty}: batch {batch}: {differing} outputs differ"));
            }
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

// The fused matmuls (Q/K/V in one dispatch, gate and up with the SwiGLU in one) give every
// output the bits of their primitive sequences, for every weight type, with biases, at any
// thread count: the CPU overrides change only how the work is scheduled.

/// Types of every activation format and path (plain kernels, tinyBLAS, repacked).
const FUSED_TYPES: &[GgmlType] = &[
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Q2_K,
    GgmlType::Q3_K,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
    GgmlType::IQ4_NL,
    GgmlType::IQ4_XS,
];

fn bits(values: &[f32]) -> Vec<u32> {
    values.iter().map(|v| v.to_bits()).collect()
}

#[test]
fn fused_qkv_and_gated_ffns_equal_their_primitives() {
    let mut rng = Rng::new(23);
    let k = 512;
    // Q wider than K and V (GQA); a SwiGLU width that is whole SIMD groups and one that is
    // not (which takes the unfused path).
    let (q_rows, kv_rows) = (256, 64);
    for backend in [CpuBackend::new(1).unwrap(), CpuBackend::new(2).unwrap()] {
        for &ty in FUSED_TYPES {
            let mut weight = |name: &str, rows: usize| {
                let values = rng.normal(k * rows, 0.05);
                make_weight(&backend, name, ty, &[k, rows], &values).unwrap()
            };
            let (wq, wk, wv) = (
                weight("q", q_rows),
                weight("k", kv_rows),
                weight("v", kv_rows),
            );
            let (gate, up) = (weight("gate", 384), weight("up", 384));
            let (odd_gate, odd_up) = (weight("gate", 72), weight("up", 72));
            // Down projections of the SwiGLU's output: of this type and of Q8_0 (the other
            // activation format), where the type takes rows of that width.
            let downs: Vec<Weight> = [(ty, 384), (GgmlType::Q8_0, 384), (ty, 72)]
                .into_iter()
                .filter(|&(ty, n)| n % ty.block_size() == 0)
                .map(|(ty, n)| {
                    let values = rng.normal(n * 96, 0.05);
                    make_weight(&backend, "down", ty, &[n, 96], &values).unwrap()
                })
                .collect();
            let bias = |rng: &mut Rng, name: &str, rows: usize| {
                make_weight(
                    &backend,
                    name,
                    GgmlType::F32,
                    &[rows],
                    &rng.normal(rows, 0.5),
                )
                .unwrap()
            };
            let biases = [
                bias(&mut rng, "bq", q_rows),
                bias(&mut rng, "bk", kv_rows),
                bias(&mut rng, "bv", kv_rows),
            ];
            for tokens in [1usize, 2, 5, 8, 16, 17, 40] {
                let x = buffer(&backend, &rng.normal(tokens * k, 1.0));
                for with_bias in [false, true] {
                    let bias_of = |i: usize| with_bias.then_some(&biases[i]);
                    let mut fused =
                        [q_rows, kv_rows, kv_rows].map(|n| backend.alloc(tokens * n).unwrap());
                    let [fq, fk, fv] = &mut fused;
                    let projections =
                        [(&wq, 0), (&wk, 1), (&wv, 2)].map(|(weight, i)| Projection {
                            weight,
                            bias: bias_of(i),
                        });
                    backend
                        .matmul_qkv(projections, &x, tokens, [fq, fk, fv])
                        .unwrap();
                    for (i, (w, out)) in [&wq, &wk, &wv].into_iter().zip(&fused).enumerate() {
                        let mut alone = backend.alloc(w.rows() * tokens).unwrap();
                        backend
                            .matmul_bias(projections[i], &x, tokens, &mut alone)
                            .unwrap();
                        assert_eq!(
                            bits(&read(&backend, out)),
                            bits(&read(&backend, &alone)),
                            "{ty}, {tokens} tokens, projection {i}, bias {with_bias}"
                        );
                    }
                }
                for activation in [Activation::Silu, Activation::GeluTanh] {
                    for (gate, up) in [(&gate, &up), (&odd_gate, &odd_up)] {
                        let n = gate.rows();
                        let (mut up_out, mut out) = (
                            backend.alloc(tokens * n).unwrap(),
                            backend.alloc(tokens * n).unwrap(),
                        );
                        let ffn = |down| GatedFfn {
                            gate,
                            up,
                            down,
                            activation,
                        };
                        let run = GatedFfnRun {
                            ffn: ffn(gate),
                            x: &x,
                            tokens,
                            up: &mut up_out,
                            hidden: &mut out,
                        };
                        backend.gated_ffn_hidden(run).unwrap();
                        let (mut g, mut u) = (
                            backend.alloc(tokens * n).unwrap(),
                            backend.alloc(tokens * n).unwrap(),
                        );
                        backend.matmul(gate, &x, tokens, &mut g).unwrap();
                        backend.matmul(up, &x, tokens, &mut u).unwrap();
                        backend
                            .gated_activation(activation, &mut g, &u, tokens * n)
                            .unwrap();
                        assert_eq!(
                            bits(&read(&backend, &up_out)),
                            bits(&read(&backend, &u)),
                            "{ty}, {tokens} tokens, up of {n}"
                        );
                        assert_eq!(
                            bits(&read(&backend, &out)),
                            bits(&read(&backend, &g)),
                            "{ty}, {tokens} tokens, {activation:?} gate of {n}"
                        );
                        for down in downs.iter().filter(|down| down.row_len() == n) {
                            let mut y = backend.alloc(tokens * 96).unwrap();
                            let run = GatedFfnRun {
                                ffn: ffn(down),
                                x: &x,
                                tokens,
                                up: &mut up_out,
                                hidden: &mut out,
                            };
                            backend.gated_ffn(run, &mut y).unwrap();
                            let mut alone = backend.alloc(tokens * 96).unwrap();
                            backend.matmul(down, &g, tokens, &mut alone).unwrap();
                            let what = format!(
                                "{ty}, {tokens} tokens, {activation:?}, {} down of {n}",
                                down.ty
                            );
                            assert_eq!(
                                bits(&read(&backend, &out)),
                                bits(&read(&backend, &g)),
                                "{what}: hidden"
                            );
                            assert_eq!(
                                bits(&read(&backend, &y)),
                                bits(&read(&backend, &alone)),
                                "{what}"
                            );
                        }
                    }
                }
            }
        }
    }
}

/// The CPU's fused RoPE + KV write (one angle table per token for Q and K, tokens split
/// among the threads) equals the unfused default bit for bit: the rotated Q and K, and the
/// cache the attention then reads; with and without QK norms (per head, and over the whole
/// projection) and frequency factors.
#[test]
fn fused_rope_kv_write_equals_the_unfused_ops() {
    use runit_backend::{unfused, QkNorms, RopeKvWrite};
    let mut rng = Rng::new(0x0a9e);
    let (heads, kv_heads, head_dim) = (6, 2, 16);
    for b in backends() {
        for (tokens, norms, factors, full_width) in [
            (1, false, false, false),
            (8, false, true, false),
            (5, true, false, false),
            (3, true, true, true),
        ] {
            let positions: Vec<u32> = (0..tokens as u32).map(|t| 3 + 2 * t).collect();
            let params = |heads: usize| RopeParams {
                style: RopeStyle::Neox,
                heads,
                head_dim,
                rotary_dim: head_dim,
                theta: 10_000.0,
                freq_scale: 1.0,
                yarn: None,
            };
            let (q_params, k_params) = (params(heads), params(kv_heads));
            let q = rng.values(tokens * heads * head_dim, -2.0, 2.0);
            let k = rng.values(tokens * kv_heads * head_dim, -2.0, 2.0);
            let v = rng.values(tokens * kv_heads * head_dim, -2.0, 2.0);
            let freqs = factors.then(|| {
                let values = rng.values(head_dim / 2, 1.0, 4.0);
                make_weight(&b, "freqs", GgmlType::F32, &[head_dim / 2], &values).unwrap()
            });
            let norm = |name: &str, heads: usize, rng: &mut Rng| {
                let width = if full_width {
                    heads * head_dim
                } else {
                    head_dim
                };
                let values = rng.values(width, 0.5, 1.5);
                make_weight(&b, name, GgmlType::F32, &[width], &values).unwrap()
            };
            let q_norm = norm("q_norm", heads, &mut rng);
            let k_norm = norm("k_norm", kv_heads, &mut rng);
            let qk_norms = norms.then_some(QkNorms {
                q: &q_norm,
                k: &k_norm,
                eps: 1e-6,
            });
            let spans = [span(0, tokens, 0, &[0, 1, 2, 3])];
            let run = |fused: bool| {
                let (mut qb, mut kb, mut vb) = (buffer(&b, &q), buffer(&b, &k), buffer(&b, &v));
                let mut k_cache = b
                    .alloc_kv(
                        16,
                        kv_heads * head_dim,
                        head_dim,
                        KvType::F16,
                        runit_backend::KvRole::Keys,
                    )
                    .unwrap();
                let mut v_cache = b
                    .alloc_kv(
                        16,
                        kv_heads * head_dim,
                        head_dim,
                        KvType::F16,
                        runit_backend::KvRole::Values,
                    )
                    .unwrap();
                let op = RopeKvWrite {
                    q: &mut qb,
                    k: &mut kb,
                    v: &mut vb,
                    positions: &positions,
                    q_rope: &q_params,
                    k_rope: &k_params,
                    freq_factors: freqs.as_ref(),
                    k_cache: &mut k_cache,
                    v_cache: &mut v_cache,
                    spans: &spans,
                    qk_norms,
                };
                if fused {
                    b.rope_kv_write(op)
                } else {
                    unfused::rope_kv_write(&b, op)
                }
                .unwrap();
                let mut out = b.alloc(tokens * heads * head_dim).unwrap();
                let attention = AttentionParams {
                    heads,
                    kv_heads,
                    head_dim,
                    scale: 0.25,
                    sliding_window: None,
                };
                let attend = Attention {
                    q: &qb,
                    k_cache: &k_cache,
                    v_cache: &v_cache,
                    spans: &spans,
                    params: &attention,
                };
                b.attention(&attend, &mut out).unwrap();
                [read(&b, &qb), read(&b, &kb), read(&b, &out)]
                    .map(|v| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>())
            };
            assert_eq!(
                run(true),
                run(false),
                "{} threads, {tokens} tokens, norms {norms} (full width {full_width}), factors {factors}",
                b.threads()
            );
        }
    }
}

/// The CPU's attention followed by its output projection, the threads converting each
/// attention row for the projection as they finish it, equals `attention` then `matmul` bit
/// for bit: decode batches of one row per sequence (the converted path) and a prompt's
/// rows, at SmolLM2's attention shape, for the 32-element formats of both activation
/// formats.
#[test]
fn attention_output_equals_attention_then_matmul() {
    let mut rng = Rng::new(0xa77e);
    let (heads, kv_heads, head_dim) = (9, 3, 64);
    let (width, kv_width, cells) = (heads * head_dim, kv_heads * head_dim, 64);
    let table: Vec<u32> = (0..16).collect();
    for b in [CpuBackend::new(1).unwrap(), CpuBackend::new(2).unwrap()] {
        let mut k_cache = b
            .alloc_kv(
                cells,
                kv_width,
                head_dim,
                KvType::F16,
                runit_backend::KvRole::Keys,
            )
            .unwrap();
        let mut v_cache = b
            .alloc_kv(
                cells,
                kv_width,
                head_dim,
                KvType::F16,
                runit_backend::KvRole::Values,
            )
            .unwrap();
        let (k, v) = (
            buffer(&b, &rng.values(cells * kv_width, -2.0, 2.0)),
            buffer(&b, &rng.values(cells * kv_width, -2.0, 2.0)),
        );
        b.kv_write(KvWrite {
            k: &k,
            v: &v,
            k_cache: &mut k_cache,
            v_cache: &mut v_cache,
            spans: &[span(0, cells, 0, &table)],
        })
        .unwrap();
        let params = AttentionParams {
            heads,
            kv_heads,
            head_dim,
            scale: 0.125,
            sliding_window: None,
        };
        for ty in [
            GgmlType::Q4_1,
            GgmlType::Q4_0,
            GgmlType::Q8_0,
            GgmlType::Q5_1,
        ] {
            let values = rng.normal(width * 96, 0.05);
            let wo = make_weight(&b, "wo", ty, &[width, 96], &values).unwrap();
            for (tokens, decode) in [
                (1, true),
                (2, true),
                (5, true),
                (8, true),
                (15, true),
                (6, false),
            ] {
                // One row per sequence at its own position, or one prompt's rows.
                let spans: Vec<SequenceSpan> = if decode {
                    (0..tokens)
                        .map(|row| span(row, 1, 20 + 3 * row, &table))
                        .collect()
                } else {
                    vec![span(0, tokens, 30, &table)]
                };
                let q = buffer(&b, &rng.values(tokens * width, -2.0, 2.0));
                let (mut attn, mut out) = (
                    b.alloc(tokens * width).unwrap(),
                    b.alloc(tokens * 96).unwrap(),
                );
                let attention = Attention {
                    q: &q,
                    k_cache: &k_cache,
                    v_cache: &v_cache,
                    spans: &spans,
                    params: &params,
                };
                b.attention_output(AttentionOutput {
                    attention,
                    attn: &mut attn,
                    projection: &wo,
                    tokens,
                    out: &mut out,
                })
                .unwrap();
                let (mut attn_alone, mut out_alone) = (
                    b.alloc(tokens * width).unwrap(),
                    b.alloc(tokens * 96).unwrap(),
                );
                b.attention(&attention, &mut attn_alone).unwrap();
                b.matmul(&wo, &attn_alone, tokens, &mut out_alone).unwrap();
                let what = format!(
                    "{} threads, {ty}, {tokens} rows, decode {decode}",
                    b.threads()
                );
                assert_eq!(
                    bits(&read(&b, &attn)),
                    bits(&read(&b, &attn_alone)),
                    "{what}: attention"
                );
                assert_eq!(bits(&read(&b, &out)), bits(&read(&b, &out_alone)), "{what}");
            }
        }
    }
}
