//! TurboQuant caches (tq4, tq3) on the GPU against the CPU: the bytes the row writer stores
//! (against `runit_backend::turbo::encode_row` of the centered rows, which is what the CPU's
//! `kv_write` stores), and the attention on the codes against the CPU scalar twin (decode
//! rows of sequences of 1 to 2,101 positions in one batch, prefill spans, GQA groups of 1
//! to 6, head_dim 64 and 128, centered keys, a sliding window, prefills whose partials take
//! several launches, a captured decode step replayed as its sequences grow; decode rows take
//! each of the three decoders of [`TurboDecode`]: the tensor cores' (the default), the f32
//! decode from the codes and the tile decoder; prefill rows each kernel of [`TurboPrefill`]);
//! mixes the CUDA backend cannot do are refused
//! with an error.
//!
//! The row writer repeats the CPU scalar twins' float operations in their order, so the
//! expected difference of the bytes is none; the attention here runs the default kernels
//! (kernels/attention.cu's, which sum in another order in f32: differences of a few ulps of
//! the outputs), exact numerics' twins are `engine/tests/turbo_cuda.rs`'s. The bounds leave
//! room only for what a different rounding somewhere could do: a code flips only where a rotated coordinate lies within a few ulps
//! of a codebook threshold (thresholds are ~0.02 apart, coordinates ~0.1: about one code in
//! 10^5 for a few ulps), so at most one code in 10^4 may differ, by one level; norms may
//! differ by one f16 ulp; outliers and their indices are chosen before any rounding and
//! must be equal. An attention output may move by at most 1e-3 of the outputs' scale (the
//! largest magnitude of the CPU's), which a handful of such flips stays well below. The
//! tensor-core kernels round to f16 what the f16 cache's tensor-core kernels round (queries,
//! here rotated and sketched, the decoded keys and values, the probabilities), so they are held
//! to the parity suite's attention bound (NMSE 5e-4, llama.cpp's for `flash_attn_ext`) and to
//! 1e-2 of the scale.
//!
//! Without a CUDA driver or device every test prints a notice and passes, unless
//! `RUNIT_REQUIRE_GPU=1` (set on the GPU machine), where that fails.

mod common;

use runit_backend::testing::parity::ATTENTION_BOUND;
use runit_backend::testing::{nmse, Rng};
use runit_backend::turbo::{self, TurboLayout, BLOCK};
use runit_backend::{
    Attention, AttentionParams, Backend, BackendError, Buffer, Device, KvCache, KvRole, KvType,
    KvTypes, KvWrite, PrimitiveOps, SequenceSpan, StepInputs, StepKey,
};
use runit_backend_cpu::{CpuBackend, SimdLevel};
use runit_backend_cuda::{CudaBackend, TurboDecode, TurboPrefill};

const BLOCK_SIZE: usize = 16;
/// Codes that may differ from the CPU's, as a share of all codes (see the module's notes).
const CODE_FLIP_SHARE: f64 = 1e-4;
/// Largest attention error, relative to the largest magnitude of the CPU's outputs.
const ATTENTION_RELATIVE_ERROR: f32 = 1e-3;
/// The same for the tensor-core decode, which rounds its operands to f16 (see the module's
/// notes); its NMSE is also held to [`ATTENTION_BOUND`].
const TENSOR_CORE_RELATIVE_ERROR: f32 = 1e-2;

fn cuda() -> Option<CudaBackend> {
    common::cuda_or_notice("TurboQuant GPU tests")
}

/// The CPU's scalar twins on every core (the GPU machine has 16: the long prefill cases'
/// references dominate the suite's time).
fn reference() -> CpuBackend {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    CpuBackend::with_simd(threads, SimdLevel::Scalar).expect("scalar backend")
}

/// A CUDA backend per kernel choice of `choices` (`set` applies it), compared with one CPU
/// reference per case; `None` without a GPU (as [`cuda`]).
fn variants<T: Copy>(
    choices: &[T],
    set: impl Fn(CudaBackend, T) -> CudaBackend,
) -> Option<Vec<CudaBackend>> {
    choices
        .iter()
        .map(|&choice| cuda().map(|c| set(c, choice)))
        .collect()
}

fn buffer(backend: &dyn Backend, values: &[f32]) -> Result<Buffer, BackendError> {
    let mut buffer = backend.alloc(values.len())?;
    backend.upload(&mut buffer, values)?;
    Ok(buffer)
}

fn bits(ty: KvType) -> usize {
    if ty == KvType::Tq4 {
        4
    } else {
        3
    }
}

/// Rows of `width` like a model's keys: uniform values around a per-channel offset (what
/// centering removes), with every 29th channel eight times larger (the outliers).
fn key_like(rng: &mut Rng, rows: usize, width: usize) -> Vec<f32> {
    let mut values = rng.values(rows * width, -1.0, 1.0);
    for (i, value) in values.iter_mut().enumerate() {
        let channel = i % width;
        let scale = if channel % 29 == 3 { 8.0 } else { 1.0 };
        *value = *value * scale + 0.75 * (channel as f32 * 0.37).sin();
    }
    values
}

/// Spans of sequences `(cached prefix, new rows)` over shuffled blocks, `spare` blocks a
/// table beyond them to grow into: the tables, and the number of cells they need.
fn tables(rng: &mut Rng, sequences: &[(usize, usize)], spare: usize) -> (Vec<Vec<u32>>, usize) {
    let counts: Vec<usize> = sequences
        .iter()
        .map(|(prefix, rows)| (prefix + rows).div_ceil(BLOCK_SIZE) + spare)
        .collect();
    let total = counts.iter().sum::<usize>() + 1;
    let mut order: Vec<u32> = (0..total as u32).collect();
    for i in (1..order.len()).rev() {
        order.swap(i, rng.below(i + 1));
    }
    let mut next = 0;
    let tables = counts
        .iter()
        .map(|&count| {
            next += count;
            order[next - count..next].to_vec()
        })
        .collect();
    (tables, total * BLOCK_SIZE)
}

/// What differed between two caches' rows.
#[derive(Debug, Default)]
struct Differences {
    blocks: usize,
    codes: usize,
    code_flips: usize,
    /// Codes that differ by more than one level.
    far_codes: usize,
    /// Norms (and residual norms of blocks with equal codes) more than one f16 ulp apart.
    far_norms: usize,
    norms_one_ulp: usize,
    outliers: usize,
    index_bytes: usize,
    /// Sign bits that differ in blocks whose codes are equal.
    sign_bits: usize,
}

fn f16_bits(bytes: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([bytes[at], bytes[at + 1]])
}

/// Adds the differences between `want` and `got`, rows of `blocks` blocks of `layout`.
fn compare_rows(layout: TurboLayout, blocks: usize, want: &[u8], got: &[u8], d: &mut Differences) {
    let block_bytes = layout.block_bytes();
    let indices = blocks * block_bytes;
    d.index_bytes += want[indices..]
        .iter()
        .zip(&got[indices..])
        .filter(|(a, b)| a != b)
        .count();
    for b in 0..blocks {
        let (w, g) = (
            &want[b * block_bytes..][..block_bytes],
            &got[b * block_bytes..][..block_bytes],
        );
        d.blocks += 1;
        let ulps = |at: usize| f16_bits(w, at).abs_diff(f16_bits(g, at));
        match ulps(0) {
            0 => {}
            1 => d.norms_one_ulp += 1,
            _ => d.far_norms += 1,
        }
        let outliers = layout.header_bytes()..layout.code_offset();
        d.outliers += usize::from(w[outliers.clone()] != g[outliers]);
        let (mut want_codes, mut got_codes) = ([0u8; BLOCK], [0u8; BLOCK]);
        let codes = layout.code_offset()..layout.sign_offset();
        turbo::unpack_codes(&w[codes.clone()], layout.code_bits, &mut want_codes);
        turbo::unpack_codes(&g[codes], layout.code_bits, &mut got_codes);
        d.codes += BLOCK;
        let mut flips = 0;
        for (a, b) in want_codes.iter().zip(&got_codes) {
            if a != b {
                flips += 1;
                d.far_codes += usize::from(a.abs_diff(*b) > 1);
            }
        }
        d.code_flips += flips;
        if layout.sketch && flips == 0 {
            match ulps(2) {
                0 => {}
                1 => d.norms_one_ulp += 1,
                _ => d.far_norms += 1,
            }
            let signs = layout.sign_offset()..layout.block_bytes();
            d.sign_bits += w[signs.clone()]
                .iter()
                .zip(&g[signs])
                .map(|(a, b)| (a ^ b).count_ones() as usize)
                .sum::<usize>();
        }
    }
}

/// Writes prefill and decode rows of three sequences into a `ty` cache of `role` (centered on
/// a mean for keys when `centered`) on the GPU and compares every row's bytes with
/// `encode_row` of the same centered row; unwritten rows must stay zero.
fn compare_write(
    cuda: &CudaBackend,
    ty: KvType,
    role: KvRole,
    (kv_heads, head_dim): (usize, usize),
    centered: bool,
) -> Differences {
    let name = format!("{ty} {role:?} {kv_heads}x{head_dim} centered {centered}");
    let width = kv_heads * head_dim;
    let mut rng = Rng::new(0x7a17 + head_dim as u64 + bits(ty) as u64);
    // A prefill of 300 rows, a decode row at position 16, a prefill of 17 rows.
    let sequences = [(0, 300), (16, 1), (0, 17)];
    let (tables, n_cells) = tables(&mut rng, &sequences, 0);
    let mut first_row = 0;
    let spans: Vec<SequenceSpan> = sequences
        .iter()
        .zip(tables)
        .map(|(&(prefix, rows), block_table)| {
            first_row += rows;
            SequenceSpan {
                first_row: first_row - rows,
                rows,
                start_position: prefix,
                block_table,
                block_size: BLOCK_SIZE,
            }
        })
        .collect();
    let rows = first_row;
    let src = key_like(&mut rng, rows, width);
    let mean: Vec<f32> = (0..width)
        .map(|c| 0.75 * (c as f32 * 0.37).sin() + 0.01 * (c % 7) as f32)
        .collect();
    let other_role = match role {
        KvRole::Keys => KvRole::Values,
        KvRole::Values => KvRole::Keys,
    };
    let mut other = cuda
        .alloc_kv(n_cells, width, head_dim, ty, other_role)
        .expect("the other side's cache");
    let mut cache = cuda
        .alloc_kv(n_cells, width, head_dim, ty, role)
        .expect("cache");
    if centered {
        cuda.center_keys(&mut cache, &mean).expect("center_keys");
    }
    let src_buffer = buffer(cuda, &src).expect("upload");
    let zeros = buffer(cuda, &vec![0.0; src.len()]).expect("upload");
    let (k, v, k_cache, v_cache) = match role {
        KvRole::Keys => (&src_buffer, &zeros, &mut cache, &mut other),
        KvRole::Values => (&zeros, &src_buffer, &mut other, &mut cache),
    };
    cuda.kv_write(KvWrite {
        k,
        v,
        k_cache,
        v_cache,
        spans: &spans,
    })
    .unwrap_or_else(|e| panic!("{name}: kv_write: {e}"));
    let got = cuda.kv_bytes(&cache).expect("cache bytes");
    let layout = TurboLayout::new(bits(ty), role);
    let blocks = width / BLOCK;
    let row_bytes = layout.row_bytes(blocks);
    assert_eq!(got.len(), n_cells * row_bytes, "{name}: cache bytes");
    let mut differences = Differences::default();
    let mut written = vec![false; n_cells];
    let mut want = vec![0u8; row_bytes];
    for span in &spans {
        for r in 0..span.rows {
            let row = &src[(span.first_row + r) * width..][..width];
            let centered_row: Vec<f32> = match centered {
                true => row.iter().zip(&mean).map(|(v, m)| v - m).collect(),
                false => row.to_vec(),
            };
            turbo::encode_row(layout, &centered_row, &mut want);
            let cell = span.cell(span.start_position + r);
            written[cell] = true;
            compare_rows(
                layout,
                blocks,
                &want,
                &got[cell * row_bytes..][..row_bytes],
                &mut differences,
            );
        }
    }
    for (cell, _) in written.iter().enumerate().filter(|(_, w)| !**w) {
        assert!(
            got[cell * row_bytes..][..row_bytes].iter().all(|&b| b == 0),
            "{name}: cell {cell} was not written but is not zero"
        );
    }
    println!("{name}: {differences:?}");
    let d = &differences;
    assert_eq!(
        (d.outliers, d.index_bytes, d.far_norms, d.far_codes),
        (0, 0, 0, 0),
        "{name}: outliers, index bytes, norms over one ulp, codes over one level"
    );
    let allowed = (d.codes as f64 * CODE_FLIP_SHARE).floor() as usize;
    assert!(
        d.code_flips <= allowed,
        "{name}: {} code flips",
        d.code_flips
    );
    assert!(d.sign_bits <= allowed, "{name}: {} sign flips", d.sign_bits);
    assert!(
        d.norms_one_ulp <= allowed.max(1),
        "{name}: {} norms one ulp apart",
        d.norms_one_ulp
    );
    differences
}

#[test]
fn kv_writes_store_the_cpus_bytes() {
    let Some(cuda) = cuda() else { return };
    for ty in [KvType::Tq4, KvType::Tq3] {
        for role in [KvRole::Keys, KvRole::Values] {
            for shape in [(3, 64), (2, 128)] {
                compare_write(&cuda, ty, role, shape, false);
                if role == KvRole::Keys {
                    compare_write(&cuda, ty, role, shape, true);
                }
            }
        }
    }
}

/// Sequences `(cached prefix, new rows)` attended by `(heads, kv_heads, head_dim)` heads
/// over caches of `types`.
struct Case {
    shape: (usize, usize, usize),
    types: KvTypes,
    window: Option<usize>,
    sequences: &'static [(usize, usize)],
    centered: bool,
}

/// The inputs of a case (the same on both backends).
struct Inputs {
    params: AttentionParams,
    width: usize,
    n_cells: usize,
    prefix_spans: Vec<SequenceSpan>,
    spans: Vec<SequenceSpan>,
    prefix_k: Vec<f32>,
    prefix_v: Vec<f32>,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    mean: Option<Vec<f32>>,
}

impl Inputs {
    fn new(seed: u64, case: &Case) -> Inputs {
        let (heads, kv_heads, head_dim) = case.shape;
        let width = kv_heads * head_dim;
        let mut rng = Rng::new(seed);
        let (tables, n_cells) = tables(&mut rng, case.sequences, 1);
        let (mut prefix_spans, mut spans) = (Vec::new(), Vec::new());
        let (mut prefix_rows, mut rows) = (0, 0);
        for (&(prefix, new), table) in case.sequences.iter().zip(tables) {
            prefix_spans.push(SequenceSpan {
                first_row: prefix_rows,
                rows: prefix,
                start_position: 0,
                block_table: table.clone(),
                block_size: BLOCK_SIZE,
            });
            spans.push(SequenceSpan {
                first_row: rows,
                rows: new,
                start_position: prefix,
                block_table: table,
                block_size: BLOCK_SIZE,
            });
            prefix_rows += prefix;
            rows += new;
        }
        Inputs {
            params: AttentionParams {
                heads,
                kv_heads,
                head_dim,
                scale: 1.0 / (head_dim as f32).sqrt(),
                sliding_window: case.window,
            },
            width,
            n_cells,
            prefix_spans,
            spans,
            prefix_k: key_like(&mut rng, prefix_rows, width),
            prefix_v: rng.values(prefix_rows * width, -1.0, 1.0),
            q: rng.values(rows * heads * head_dim, -2.0, 2.0),
            k: key_like(&mut rng, rows, width),
            v: rng.values(rows * width, -1.0, 1.0),
            mean: case
                .centered
                .then(|| (0..width).map(|c| 0.75 * (c as f32 * 0.37).sin()).collect()),
        }
    }

    fn caches(&self, b: &dyn Backend, types: KvTypes) -> Result<(KvCache, KvCache), BackendError> {
        let head_dim = self.params.head_dim;
        let mut k_cache =
            b.alloc_kv(self.n_cells, self.width, head_dim, types.keys, KvRole::Keys)?;
        let mut v_cache = b.alloc_kv(
            self.n_cells,
            self.width,
            head_dim,
            types.values,
            KvRole::Values,
        )?;
        if let Some(mean) = &self.mean {
            b.center_keys(&mut k_cache, mean)?;
        }
        if !self.prefix_k.is_empty() {
            // Prefixes written as one prefill per sequence, in one call.
            let (k, v) = (buffer(b, &self.prefix_k)?, buffer(b, &self.prefix_v)?);
            b.kv_write(KvWrite {
                k: &k,
                v: &v,
                k_cache: &mut k_cache,
                v_cache: &mut v_cache,
                spans: &self.prefix_spans,
            })?;
        }
        Ok((k_cache, v_cache))
    }

    /// The next decode step: every sequence one position further, new rows.
    fn advance(&mut self, rng: &mut Rng) {
        for span in &mut self.spans {
            span.start_position += span.rows;
        }
        self.q = rng.values(self.q.len(), -2.0, 2.0);
        self.k = key_like(rng, self.k.len() / self.width, self.width);
        self.v = rng.values(self.v.len(), -1.0, 1.0);
    }

    /// Writes the new rows into `caches` and attends.
    fn step(
        &self,
        b: &dyn Backend,
        caches: &mut (KvCache, KvCache),
    ) -> Result<Vec<f32>, BackendError> {
        let (k_cache, v_cache) = caches;
        let (k, v) = (buffer(b, &self.k)?, buffer(b, &self.v)?);
        b.kv_write(KvWrite {
            k: &k,
            v: &v,
            k_cache,
            v_cache,
            spans: &self.spans,
        })?;
        let mut out = b.alloc(self.q.len())?;
        b.attention(
            &Attention {
                q: &buffer(b, &self.q)?,
                k_cache,
                v_cache,
                spans: &self.spans,
                params: &self.params,
            },
            &mut out,
        )?;
        let mut values = vec![0.0; self.q.len()];
        b.download(&out, &mut values)?;
        Ok(values)
    }

    /// [`Inputs::step`] on the GPU inside `begin_step` .. `end_step`, through `run_captured`
    /// (a key's first pass runs op by op, its second is captured, later ones replay the
    /// graph); `buffers` are q, k, v and out, at fixed addresses. `workspace` keys the
    /// graph: a run over other buffers must take another.
    fn captured_step(
        &self,
        cuda: &CudaBackend,
        caches: &mut (KvCache, KvCache),
        buffers: &mut (Buffer, Buffer, Buffer, Buffer),
        workspace: u64,
    ) -> Result<Vec<f32>, BackendError> {
        let (q, k, v, out) = buffers;
        cuda.upload(q, &self.q)?;
        cuda.upload(k, &self.k)?;
        cuda.upload(v, &self.v)?;
        let rows = self.spans.iter().map(|s| s.rows).sum::<usize>();
        let tokens = vec![0u32; rows];
        let positions: Vec<u32> = self
            .spans
            .iter()
            .flat_map(|s| (s.start_position..s.start_position + s.rows).map(|p| p as u32))
            .collect();
        let logit_rows: Vec<u32> = (0..rows as u32).collect();
        let inputs = StepInputs {
            tokens: &tokens,
            positions: &positions,
            spans: &self.spans,
            window_spans: None,
            logit_rows: &logit_rows,
            rows_alone: false,
        };
        let key = StepKey {
            workspace,
            tokens: rows,
            spans: self.spans.len(),
            logit_rows: rows,
        };
        cuda.begin_step(&inputs)?;
        let (k_cache, v_cache) = caches;
        let result = cuda.run_captured(key, &mut || {
            cuda.kv_write(KvWrite {
                k,
                v,
                k_cache,
                v_cache,
                spans: inputs.spans,
            })?;
            let attention = Attention {
                q,
                k_cache,
                v_cache,
                spans: inputs.spans,
                params: &self.params,
            };
            cuda.attention(&attention, out)
        });
        cuda.end_step()?;
        result?;
        let mut values = vec![0.0; self.q.len()];
        cuda.download(out, &mut values)?;
        Ok(values)
    }

    /// Writes the new rows and attends (outside any step: inputs uploaded per op).
    fn run(&self, b: &dyn Backend, types: KvTypes) -> Result<Vec<f32>, BackendError> {
        self.step(b, &mut self.caches(b, types)?)
    }
}

/// Runs `case` on the CPU scalar twin once and on each of `cudas` (their kernel choices in
/// the name); returns the largest relative error.
fn compare_attention(cudas: &[CudaBackend], seed: u64, case: &Case) -> f32 {
    let name = format!(
        "{} {:?} window {:?} centered {} {:?}",
        case.types, case.shape, case.window, case.centered, case.sequences
    );
    let inputs = Inputs::new(seed, case);
    let expected = inputs
        .run(&reference(), case.types)
        .unwrap_or_else(|e| panic!("{name}: cpu: {e}"));
    let mut worst = 0.0f32;
    for cuda in cudas {
        let name = format!(
            "{name} [{:?} decode, {:?} prefill]",
            cuda.turbo_decode(),
            cuda.turbo_prefill()
        );
        let got = inputs
            .run(cuda, case.types)
            .unwrap_or_else(|e| panic!("{name}: cuda: {e}"));
        worst = worst.max(check_close(cuda, &name, &expected, &got));
    }
    worst
}

/// Fails unless `got` is within [`ATTENTION_RELATIVE_ERROR`] of `expected`'s scale (with
/// `cuda`'s tensor-core kernels: [`TENSOR_CORE_RELATIVE_ERROR`], and an NMSE within
/// [`ATTENTION_BOUND`]); returns the relative error.
fn check_close(cuda: &CudaBackend, name: &str, expected: &[f32], got: &[f32]) -> f32 {
    let tensor_cores = cuda.turbo_decode() == TurboDecode::TensorCores
        || cuda.turbo_prefill() == TurboPrefill::TensorCores;
    let bound = if tensor_cores {
        TENSOR_CORE_RELATIVE_ERROR
    } else {
        ATTENTION_RELATIVE_ERROR
    };
    assert!(
        got.iter().all(|v| v.is_finite()),
        "{name}: non-finite output"
    );
    let scale = expected.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let (at, error) = expected
        .iter()
        .zip(got)
        .map(|(a, b)| (a - b).abs())
        .enumerate()
        .fold(
            (0, 0.0f32),
            |best, (i, e)| if e > best.1 { (i, e) } else { best },
        );
    let relative = error / scale;
    println!(
        "{name}: max |error| {error:e} at {at} (scale {scale:.4}, relative {relative:e}), nmse {:e}",
        nmse(expected, got)
    );
    assert!(scale > 0.01, "{name}: outputs all near zero ({scale})");
    assert!(
        relative <= bound,
        "{name}: max |error| {error:e} at {at} is {relative:e} of the scale {scale}"
    );
    if tensor_cores {
        let error = nmse(expected, got);
        assert!(error <= ATTENTION_BOUND, "{name}: nmse {error:e}");
    }
    relative
}

const TQ4: KvTypes = KvTypes {
    keys: KvType::Tq4,
    values: KvType::Tq4,
};
const TQ: KvTypes = KvTypes {
    keys: KvType::Tq4,
    values: KvType::Tq3,
};
const TQ3: KvTypes = KvTypes {
    keys: KvType::Tq3,
    values: KvType::Tq3,
};

/// Decode rows (one query row per sequence) of sequences of 1, 17, 300 and 2,101
/// positions in one batch (the last over five chunks of 512 keys, merged).
const DECODE: &[(usize, usize)] = &[(0, 1), (16, 1), (299, 1), (2100, 1)];

/// The decode from the codes in f32 (`TurboDecode::Codes`) and on the tensor cores (the
/// default; head_dim 64 and 128 both take it).
#[test]
fn decode_attention_matches_the_cpu() {
    let decoders = [TurboDecode::Codes, TurboDecode::TensorCores];
    let Some(cudas) = variants(&decoders, CudaBackend::with_turbo_decode) else {
        return;
    };
    decode_rows_match_the_cpu(&cudas);
}

fn decode_rows_match_the_cpu(cudas: &[CudaBackend]) {
    let mut seed = 0xdec0;
    for types in [TQ4, TQ, TQ3] {
        // GQA 4, MHA, GQA 6 (two slices of heads: 4 and 2), MQA over 8 heads.
        for shape in [(8, 2, 64), (4, 4, 128), (12, 2, 128), (8, 1, 64)] {
            for centered in [false, true] {
                seed += 1;
                let case = Case {
                    shape,
                    types,
                    window: None,
                    sequences: DECODE,
                    centered,
                };
                compare_attention(cudas, seed, &case);
            }
        }
    }
}

/// The tile decoder (`TurboDecode::Tiles`: each tile decoded once in shared memory) and the
/// tensor cores' over the same decode rows, windows and head shapes (heads of 64 and 128,
/// groups of 1 to 8).
#[test]
fn the_tile_decoder_matches_the_cpu() {
    let decoders = [TurboDecode::Tiles, TurboDecode::TensorCores];
    let Some(cudas) = variants(&decoders, CudaBackend::with_turbo_decode) else {
        return;
    };
    windows_and_groups_match_the_cpu(&cudas);
}

fn windows_and_groups_match_the_cpu(cudas: &[CudaBackend]) {
    let mut seed = 0xc0de5;
    for types in [TQ4, TQ, TQ3] {
        for shape in [
            (8, 2, 64),
            (4, 4, 128),
            (12, 2, 128),
            (8, 1, 64),
            (14, 2, 64),
        ] {
            for (window, centered) in [(None, false), (None, true), (Some(700), true)] {
                seed += 1;
                let case = Case {
                    shape,
                    types,
                    window,
                    sequences: DECODE,
                    centered,
                };
                compare_attention(cudas, seed, &case);
            }
        }
    }
}

/// The two prefill kernels ([`TurboPrefill`]), each beside the decoder of its arithmetic.
const PREFILLS: [(TurboDecode, TurboPrefill); 2] = [
    (TurboDecode::Tiles, TurboPrefill::Tiles),
    (TurboDecode::TensorCores, TurboPrefill::TensorCores),
];

/// Prefill rows on the tile prefill (`attention_prefill_tq`) and on the tensor cores
/// (`attention_prefill_tq_mma_*`).
#[test]
fn prefill_attention_matches_the_cpu() {
    let Some(cudas) = variants(&PREFILLS, prefill_variant) else {
        return;
    };
    prefill_rows_match_the_cpu(&cudas);
}

fn prefill_variant(
    cuda: CudaBackend,
    (decode, prefill): (TurboDecode, TurboPrefill),
) -> CudaBackend {
    cuda.with_turbo_decode(decode).with_turbo_prefill(prefill)
}

fn prefill_rows_match_the_cpu(cudas: &[CudaBackend]) {
    // A prompt of 17 rows, one of 300, a chunk of 600 rows after 1,500 cached positions
    // beside a short one (rows over five chunks of keys), and a decode row batched with a
    // prefill.
    let batches: [&'static [(usize, usize)]; 4] = [
        &[(0, 17)],
        &[(0, 300)],
        &[(1500, 600), (3, 40)],
        &[(700, 1), (0, 64)],
    ];
    let mut seed = 0x9f11;
    for types in [TQ4, TQ, TQ3] {
        for shape in [(8, 2, 64), (12, 2, 128)] {
            for sequences in batches {
                seed += 1;
                let case = Case {
                    shape,
                    types,
                    window: None,
                    sequences,
                    centered: true,
                };
                compare_attention(cudas, seed, &case);
            }
        }
    }
}

#[test]
fn sliding_windows_and_long_prefills_match_the_cpu() {
    let Some(cudas) = variants(&PREFILLS, prefill_variant) else {
        return;
    };
    windows_and_long_prefills_match_the_cpu(&cudas);
}

fn windows_and_long_prefills_match_the_cpu(cudas: &[CudaBackend]) {
    // A window of 40 and one of 700 (two chunks of a window), decode and prefill rows.
    for (index, window) in [40, 700].into_iter().enumerate() {
        let case = Case {
            shape: (8, 2, 128),
            types: TQ,
            window: Some(window),
            sequences: &[(1000, 1), (20, 70), (1200, 300)],
            centered: true,
        };
        compare_attention(cudas, 0x5117 + index as u64, &case);
    }
    // 900 rows of 16 heads over 2,100 positions: 16 × 5 chunks × 258 partial values a row,
    // so the rows' partials take two launches (64 MiB of scratch at most).
    let case = Case {
        shape: (16, 4, 128),
        types: TQ4,
        window: None,
        sequences: &[(1200, 900)],
        centered: true,
    };
    compare_attention(cudas, 0x1009, &case);
}

#[test]
fn mixes_the_kernels_cannot_do_are_refused() {
    let Some(cuda) = cuda() else { return };
    // TurboQuant keys with f16 values (and the reverse): refused by both backends.
    for types in [
        KvTypes {
            keys: KvType::Tq4,
            values: KvType::F16,
        },
        KvTypes {
            keys: KvType::Q8_0,
            values: KvType::Tq3,
        },
    ] {
        let case = Case {
            shape: (4, 2, 64),
            types,
            window: None,
            sequences: &[(5, 1)],
            centered: false,
        };
        let inputs = Inputs::new(1, &case);
        for (name, backend) in [("cpu", &reference() as &dyn Backend), ("cuda", &cuda)] {
            match inputs.run(backend, types) {
                Err(BackendError::Device { message, .. }) => {
                    assert!(message.contains("go together"), "{name} {types}: {message}")
                }
                other => panic!("{name} {types}: expected a refusal, got {other:?}"),
            }
        }
    }
    // Heads that are not whole blocks of 64, heads longer than the kernels hold, centered
    // values: refused when the cache is made.
    let refused = |result: Result<KvCache, BackendError>, what: &str| match result {
        Err(BackendError::UnsupportedKv { .. }) => {}
        Err(other) => panic!("{what}: expected UnsupportedKv, got {other}"),
        Ok(_) => panic!("{what}: expected a refusal"),
    };
    refused(
        cuda.alloc_kv(64, 2 * 96, 96, KvType::Tq4, KvRole::Keys),
        "96",
    );
    refused(
        cuda.alloc_kv(64, 512, 512, KvType::Tq3, KvRole::Keys),
        "512",
    );
    let mut values = cuda
        .alloc_kv(64, 128, 64, KvType::Tq4, KvRole::Values)
        .expect("values cache");
    assert!(matches!(
        cuda.center_keys(&mut values, &[0.0; 128]),
        Err(BackendError::UnsupportedKv { .. })
    ));
    // Exact numerics has twins of the CPU's f16/f32 and TurboQuant code, not of ggml's
    // blocks.
    let exact = CudaBackend::new(0)
        .expect("the device opened above")
        .with_exact_numerics(true);
    refused(
        exact.alloc_kv(64, 128, 64, KvType::Q8_0, KvRole::Keys),
        "exact",
    );
    exact
        .alloc_kv(64, 128, 64, KvType::Tq4, KvRole::Keys)
        .expect("exact numerics takes TurboQuant caches");
}

#[test]
fn a_captured_decode_step_stays_valid_as_sequences_grow() {
    let Some(cuda) = cuda() else { return };
    captured_steps(&cuda, 11);
    // And the tile decoder, over new buffers: a graph of its own (the first run's graph,
    // replayed, writes the first run's buffers).
    captured_steps(&cuda.with_turbo_decode(TurboDecode::Tiles), 12);
}

fn captured_steps(cuda: &CudaBackend, workspace: u64) {
    let cpu = reference();
    let mut rng = Rng::new(0xca9e);
    // Two sequences crossing a chunk boundary (position 512) and block boundaries while the
    // step's graph replays: step 0 runs op by op, step 1 is captured, steps 2-6 replay it.
    let case = Case {
        shape: (8, 2, 128),
        types: TQ,
        window: None,
        sequences: &[(509, 1), (1020, 1)],
        centered: true,
    };
    let mut inputs = Inputs::new(0xca9f, &case);
    let mut gpu_caches = inputs.caches(cuda, case.types).expect("gpu caches");
    let mut cpu_caches = inputs.caches(&cpu, case.types).expect("cpu caches");
    let (q_len, kv_len) = (inputs.q.len(), inputs.k.len());
    let mut buffers = (
        cuda.alloc(q_len).expect("q"),
        cuda.alloc(kv_len).expect("k"),
        cuda.alloc(kv_len).expect("v"),
        cuda.alloc(q_len).expect("out"),
    );
    for step in 0..7 {
        if step > 0 {
            inputs.advance(&mut rng);
        }
        let got = inputs
            .captured_step(cuda, &mut gpu_caches, &mut buffers, workspace)
            .unwrap_or_else(|e| panic!("step {step}: cuda: {e}"));
        let expected = inputs.step(&cpu, &mut cpu_caches).expect("cpu step");
        check_close(cuda, &format!("captured step {step}"), &expected, &got);
    }
}
