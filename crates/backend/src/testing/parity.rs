//! The parity suite: every op run with seeded random inputs on a reference backend (the CPU
//! scalar twin) and a candidate, compared by NMSE against per-op bounds — RunIT's version of
//! llama.cpp's `test-backend-ops`.
//!
//! ```
//! # fn check(reference: &dyn runit_backend::Backend, candidate: &dyn runit_backend::Backend) {
//! let report = runit_backend::testing::run_parity(reference, candidate);
//! println!("{report}");
//! assert!(report.all_passed());
//! # }
//! ```

use runit_quant::GgmlType;

mod elementwise;

use super::attention_setup::AttentionSetup;
use super::moe_setup::MoeCase;
use super::random::{make_weight, make_weight_as, Rng};
use super::report::{nmse, ParityCase, ParityOutcome, ParityReport};
use crate::{
    Attention, AttentionParams, Backend, BackendError, Buffer, BufferCopy, KvType, KvWrite, Op,
    RmsNorm, RopeParams, RopeStyle, ScatterAddRows, SequenceSpan, WeightRole, Yarn,
};

/// The weight types matmul and embedding are checked with (those the candidate supports).
pub use runit_quant::dot::WEIGHT_TYPES;

/// NMSE bound of matmul (llama.cpp's `test-backend-ops` uses 5e-4 for `mul_mat`).
pub const MATMUL_BOUND: f64 = 5e-4;
/// NMSE bound of attention (`test-backend-ops` uses 5e-4 for `flash_attn_ext`).
pub const ATTENTION_BOUND: f64 = 5e-4;
/// NMSE bound of RoPE (device sin/cos may differ from libm by an ulp or two).
pub const ROPE_BOUND: f64 = 1e-6;
/// NMSE bound of ops that are exact or nearly so (`test-backend-ops`' default 1e-7).
pub const ELEMENTWISE_BOUND: f64 = 1e-7;

/// One attention case: heads, kv_heads, head_dim, cache type, sliding window, and per
/// sequence (cached prefix, new rows).
type AttentionCase = (
    usize,
    usize,
    usize,
    KvType,
    Option<usize>,
    &'static [(usize, usize)],
);

/// A check that a backend rejects a bad input: op, what is wrong, the call.
type RejectCheck<'a> = (
    &'static str,
    &'static str,
    &'a dyn Fn(&dyn Backend) -> Result<(), BackendError>,
);

/// Runs every case on both backends and collects the comparisons.
pub fn run_parity(reference: &dyn Backend, candidate: &dyn Backend) -> ParityReport {
    let mut suite = Suite {
        reference,
        candidate,
        report: ParityReport {
            reference: reference.name(),
            candidate: candidate.name(),
            cases: Vec::new(),
        },
    };
    suite.matmul();
    suite.embedding();
    suite.elementwise();
    suite.norms();
    suite.rope();
    suite.attention();
    suite.rows();
    suite.moe();
    suite.errors();
    suite.report
}

type Output = Result<Vec<f32>, BackendError>;

struct Suite<'a> {
    reference: &'a dyn Backend,
    candidate: &'a dyn Backend,
    report: ParityReport,
}

/// A buffer holding `values`.
fn buffer(backend: &dyn Backend, values: &[f32]) -> Result<Buffer, BackendError> {
    let mut buffer = backend.alloc(values.len())?;
    backend.upload(&mut buffer, values)?;
    Ok(buffer)
}

/// The first `len` elements of `buffer`.
fn read(backend: &dyn Backend, buffer: &Buffer, len: usize) -> Output {
    let mut out = vec![0.0; len];
    backend.download(buffer, &mut out)?;
    Ok(out)
}

impl Suite<'_> {
    /// Runs `run` on both backends and records the comparison. `support` names the op and
    /// type that both must support, when the case depends on one.
    fn case(
        &mut self,
        op: &'static str,
        detail: String,
        support: Option<(Op, GgmlType)>,
        bound: f64,
        run: impl Fn(&dyn Backend) -> Output,
    ) {
        let ty = support.map(|(_, ty)| ty);
        let mut record = |nmse: f64, outcome: ParityOutcome| {
            self.report.cases.push(ParityCase {
                op,
                detail: detail.clone(),
                ty,
                nmse,
                bound,
                outcome,
            })
        };
        if let Some((kind, ty)) = support {
            for (backend, role) in [(self.candidate, "candidate"), (self.reference, "reference")] {
                if !backend.supports(kind, ty) {
                    record(0.0, ParityOutcome::Skipped(format!("{role} lacks {ty}")));
                    return;
                }
            }
        }
        let expected = match run(self.reference) {
            Ok(values) => values,
            Err(error) => {
                return record(
                    f64::NAN,
                    ParityOutcome::Error(format!("reference: {error}")),
                )
            }
        };
        match run(self.candidate) {
            Ok(values) => {
                let error = nmse(&expected, &values);
                let outcome = if error <= bound {
                    ParityOutcome::Passed
                } else {
                    ParityOutcome::Failed
                };
                record(error, outcome);
            }
            // A cache type the candidate refuses by type is a gap it declares, as a weight
            // type it does not support is (listed by `ParityReport::skipped`).
            Err(error @ BackendError::UnsupportedKv { .. }) => record(
                f64::NAN,
                ParityOutcome::Skipped(format!("candidate refuses: {error}")),
            ),
            Err(error) => record(
                f64::NAN,
                ParityOutcome::Error(format!("candidate: {error}")),
            ),
        }
    }

    fn matmul(&mut self) {
        let (n_in, n_out) = (512, 36);
        for ty in WEIGHT_TYPES {
            for tokens in [1, 7, 33, 256] {
                let mut rng = Rng::new(0x5eed_0001 + ty.id() as u64 * 31 + tokens as u64);
                let w = rng.normal(n_in * n_out, 0.06);
                let x = rng.values(tokens * n_in, -1.0, 1.0);
                let detail = format!("[{n_out}x{n_in}] x {tokens} tokens");
                self.case(
                    "matmul",
                    detail,
                    Some((Op::MatMul, ty)),
                    MATMUL_BOUND,
                    |b| {
                        let weight = make_weight(b, "parity.matmul", ty, &[n_in, n_out], &w)?;
                        let input = buffer(b, &x)?;
                        let mut out = b.alloc(tokens * n_out)?;
                        b.matmul(&weight, &input, tokens, &mut out)?;
                        read(b, &out, tokens * n_out)
                    },
                );
            }
        }
    }

    fn embedding(&mut self) {
        let (width, rows) = (256, 12);
        let ids = [5u32, 0, 11, 5];
        for ty in WEIGHT_TYPES {
            let mut rng = Rng::new(0x5eed_0002 + ty.id() as u64);
            let table = rng.normal(width * rows, 0.5);
            let detail = format!("[{rows}x{width}] ids {ids:?}");
            self.case(
                "embedding",
                detail,
                Some((Op::Embedding, ty)),
                ELEMENTWISE_BOUND,
                |b| {
                    let role = WeightRole::TokenEmbedding;
                    let shape = [width, rows];
                    let weight = make_weight_as(b, role, "parity.token_embd", ty, &shape, &table)?;
                    let mut out = b.alloc(ids.len() * width)?;
                    b.embedding(&weight, &ids, &mut out)?;
                    read(b, &out, ids.len() * width)
                },
            );
        }
    }

    fn norms(&mut self) {
        let mut rng = Rng::new(0x5eed_0004);
        for (rows, width, eps) in [(5usize, 576usize, 1e-5f32), (24, 64, 1e-6), (1, 2048, 1e-6)] {
            let x = rng.values(rows * width, -3.0, 3.0);
            let w = rng.values(width, 0.5, 1.5);
            let detail = format!("{rows} x {width}, eps {eps:e}");
            self.case("rms_norm", detail.clone(), None, ELEMENTWISE_BOUND, |b| {
                let weight = make_weight(b, "parity.norm", GgmlType::F32, &[width], &w)?;
                let norm = RmsNorm {
                    weight: &weight,
                    eps,
                };
                let mut out = b.alloc(rows * width)?;
                b.rms_norm(&buffer(b, &x)?, norm, rows, &mut out)?;
                read(b, &out, rows * width)
            });
            self.case("rms_norm_in_place", detail, None, ELEMENTWISE_BOUND, |b| {
                let weight = make_weight(b, "parity.norm", GgmlType::F32, &[width], &w)?;
                let norm = RmsNorm {
                    weight: &weight,
                    eps,
                };
                let mut input = buffer(b, &x)?;
                b.rms_norm_in_place(&mut input, norm, rows)?;
                read(b, &input, rows * width)
            });
        }
    }

    fn rope(&mut self) {
        let positions = [0u32, 1, 17, 300, 4095];
        // YaRN of a 4x extension of 4096 tokens (Qwen2.5's published settings), and a
        // magnitude factor alone.
        let yarn = Yarn {
            ext_factor: 1.0,
            attn_factor: 1.0,
            beta_fast: 32.0,
            beta_slow: 1.0,
            original_context: 4096,
        };
        let magnitude = Yarn {
            ext_factor: 0.0,
            attn_factor: 0.75,
            ..yarn
        };
        let settings = [
            (RopeStyle::Normal, 64, 64, 10_000.0, 1.0, false, None),
            (RopeStyle::Neox, 64, 64, 1_000_000.0, 1.0, false, None),
            (RopeStyle::Neox, 128, 64, 10_000.0, 0.25, false, None),
            (RopeStyle::Normal, 64, 64, 500_000.0, 1.0, true, None),
            (RopeStyle::Neox, 32, 32, 10_000.0, 1.0, true, None),
            (
                RopeStyle::Neox,
                128,
                128,
                1_000_000.0,
                0.25,
                false,
                Some(yarn),
            ),
            (
                RopeStyle::Normal,
                64,
                64,
                10_000.0,
                1.0,
                false,
                Some(magnitude),
            ),
        ];
        let mut rng = Rng::new(0x5eed_0005);
        for (style, head_dim, rotary_dim, theta, freq_scale, factors, yarn) in settings {
            let heads = 3;
            let x = rng.values(positions.len() * heads * head_dim, -1.0, 1.0);
            let freq = rng.values(rotary_dim / 2, 1.0, 8.0);
            let params = RopeParams {
                style,
                heads,
                head_dim,
                rotary_dim,
                theta,
                freq_scale,
                yarn,
            };
            let detail = format!(
                "{style:?} d{head_dim} rot{rotary_dim} base {theta:e} scale {freq_scale}{}{}",
                if factors { " +freqs" } else { "" },
                yarn.map_or(String::new(), |y| format!(
                    " yarn ext {} attn {}",
                    y.ext_factor, y.attn_factor
                ))
            );
            self.case("rope", detail, None, ROPE_BOUND, |b| {
                let weight = match factors {
                    true => Some(make_weight(
                        b,
                        "parity.rope_freqs",
                        GgmlType::F32,
                        &[rotary_dim / 2],
                        &freq,
                    )?),
                    false => None,
                };
                let mut input = buffer(b, &x)?;
                b.rope(&mut input, &positions, &params, weight.as_ref())?;
                read(b, &input, x.len())
            });
        }
    }

    fn attention(&mut self) {
        use KvType::{F16, F32, Q4_0, Q8_0};
        // (heads, kv_heads, head_dim, kv type, window, [(cached prefix, new rows)] per sequence)
        let cases: [AttentionCase; 12] = [
            (8, 2, 64, F16, None, &[(37, 1)]),
            (8, 2, 64, F32, None, &[(37, 1)]),
            (4, 4, 32, F16, None, &[(3, 5), (0, 7)]),
            (4, 4, 32, F32, None, &[(3, 5), (0, 7)]),
            (4, 2, 64, F16, None, &[(10, 70)]),
            (4, 2, 64, F32, None, &[(0, 40), (5, 30)]),
            (2, 1, 128, F16, Some(8), &[(12, 20)]),
            (6, 3, 80, F16, Some(16), &[(90, 1), (4, 1), (0, 66)]),
            (2, 2, 48, F16, None, &[(0, 1), (300, 2)]),
            // ggml's blocks: rotated heads of 64 and 128 (`crate::hadamard`), GQA, a window.
            (8, 2, 64, Q8_0, None, &[(37, 1), (0, 70)]),
            (4, 2, 64, Q4_0, None, &[(10, 70), (90, 1)]),
            (2, 1, 128, Q8_0, Some(8), &[(12, 20)]),
        ];
        for (index, (heads, kv_heads, head_dim, kv_type, window, sequences)) in
            cases.iter().enumerate()
        {
            let (heads, kv_heads, head_dim) = (*heads, *kv_heads, *head_dim);
            let detail = format!(
                "h{heads}/{kv_heads} d{head_dim} {kv_type:?}{} seqs {sequences:?}",
                window.map_or(String::new(), |w| format!(" win{w}"))
            );
            let mut rng = Rng::new(0x5eed_0100 + index as u64);
            let setup = AttentionSetup::new(&mut rng, heads, kv_heads, head_dim, sequences);
            let params = AttentionParams {
                heads,
                kv_heads,
                head_dim,
                scale: 1.0 / (head_dim as f32).sqrt(),
                sliding_window: *window,
            };
            self.case("attention", detail, None, ATTENTION_BOUND, |b| {
                setup.run(b, *kv_type, &params)
            });
        }
    }

    fn rows(&mut self) {
        let mut rng = Rng::new(0x5eed_0006);
        let width = 40;
        let src = rng.values(6 * width, -1.0, 1.0);
        let dst = rng.values(5 * width, -1.0, 1.0);
        let rows = [4u32, 0, 4, 2];
        let scales = [0.5f32, -1.25, 0.75, 2.0];
        self.case(
            "gather_rows",
            format!("{rows:?} of width {width}"),
            None,
            ELEMENTWISE_BOUND,
            |b| {
                let mut out = b.alloc(rows.len() * width)?;
                b.gather_rows(&buffer(b, &src)?, &rows, width, &mut out)?;
                read(b, &out, rows.len() * width)
            },
        );
        self.case(
            "scatter_add_rows",
            format!("{rows:?} of width {width}"),
            None,
            ELEMENTWISE_BOUND,
            |b| {
                let mut out = buffer(b, &dst)?;
                b.scatter_add_rows(ScatterAddRows {
                    src: &buffer(b, &src)?,
                    rows: &rows,
                    scales: &scales,
                    width,
                    dst: &mut out,
                })?;
                read(b, &out, dst.len())
            },
        );
        self.case(
            "copy",
            "37 elements, offsets 5 -> 11".to_string(),
            None,
            ELEMENTWISE_BOUND,
            |b| {
                let mut out = buffer(b, &dst)?;
                b.copy(BufferCopy {
                    src: &buffer(b, &src)?,
                    src_offset: 5,
                    dst: &mut out,
                    dst_offset: 11,
                    len: 37,
                })?;
                read(b, &out, dst.len())
            },
        );
    }

    /// The mixture-of-experts FFN: a decode row and a prompt-sized batch (a device backend
    /// may route the two differently), with the exact router of [`MoeCase`].
    fn moe(&mut self) {
        for ty in WEIGHT_TYPES {
            for (tokens, experts, used, renormalise) in [(1, 4, 2, true), (11, 8, 2, false)] {
                let seed = 0x5eed_0007 + ty.id() as u64 * 5 + tokens as u64;
                let case = MoeCase::new(seed, ty, (256, 256), (experts, used), renormalise);
                let x = case.inputs(&mut Rng::new(seed + 1), tokens);
                self.case(
                    "moe_ffn",
                    case.describe(tokens),
                    Some((Op::MatMul, ty)),
                    MATMUL_BOUND,
                    |b| case.run(b, &x, tokens, false),
                );
            }
        }
    }

    /// Bad shapes must come back as errors, not panics or silent success.
    fn errors(&mut self) {
        let checks: [RejectCheck; 4] = [
            ("matmul", "x shorter than tokens x row length", &|b| {
                let w = make_weight(b, "parity.bad", GgmlType::F32, &[64, 4], &[0.5; 256])?;
                let mut out = b.alloc(8)?;
                b.matmul(&w, &b.alloc(64)?, 2, &mut out)
            }),
            ("embedding", "token id past the table", &|b| {
                let w = make_weight(b, "parity.bad", GgmlType::F32, &[32, 3], &[0.5; 96])?;
                b.embedding(&w, &[3], &mut b.alloc(32)?)
            }),
            ("attention", "kv_heads not dividing heads", &|b| {
                let params = AttentionParams {
                    heads: 3,
                    kv_heads: 2,
                    head_dim: 8,
                    scale: 1.0,
                    sliding_window: None,
                };
                let k = b.alloc_kv(16, 16, 16, KvType::F16, crate::KvRole::Keys)?;
                let v = b.alloc_kv(16, 16, 16, KvType::F16, crate::KvRole::Values)?;
                let span = SequenceSpan {
                    first_row: 0,
                    rows: 1,
                    start_position: 0,
                    block_table: vec![0],
                    block_size: 16,
                };
                let attention = Attention {
                    q: &b.alloc(24)?,
                    k_cache: &k,
                    v_cache: &v,
                    spans: &[span],
                    params: &params,
                };
                b.attention(&attention, &mut b.alloc(24)?)
            }),
            ("kv_write", "block table shorter than the positions", &|b| {
                let mut k = b.alloc_kv(16, 8, 8, KvType::F16, crate::KvRole::Keys)?;
                let mut v = b.alloc_kv(16, 8, 8, KvType::F16, crate::KvRole::Values)?;
                let span = SequenceSpan {
                    first_row: 0,
                    rows: 6,
                    start_position: 0,
                    block_table: vec![0],
                    block_size: 4,
                };
                b.kv_write(KvWrite {
                    k: &b.alloc(48)?,
                    v: &b.alloc(48)?,
                    k_cache: &mut k,
                    v_cache: &mut v,
                    spans: &[span],
                })
            }),
        ];
        for (op, detail, check) in checks {
            let outcome = match check(self.candidate) {
                Err(BackendError::Shape { .. }) => ParityOutcome::Passed,
                Err(other) => ParityOutcome::Error(format!("expected a shape error, got: {other}")),
                Ok(()) => ParityOutcome::Error("accepted a bad shape".to_string()),
            };
            self.report.cases.push(ParityCase {
                op,
                detail: format!("rejects: {detail}"),
                ty: None,
                nmse: 0.0,
                bound: 0.0,
                outcome,
            });
        }
    }
}
