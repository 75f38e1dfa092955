//! The attention kernels on the GPU against the CPU scalar reference: flash-decoding over
//! sequences longer than several chunks (GQA, head_dim 64/128/256, head slices), tiled
//! prefill, sliding windows, and a captured decode step replayed after its sequence grew.
//!
//! Without a CUDA driver or device every test prints a notice and passes, unless
//! `RUNIT_REQUIRE_GPU=1` (set on the GPU machine), where that fails.

mod common;

use runit_backend::testing::parity::ATTENTION_BOUND;
use runit_backend::testing::{nmse, Rng};
use runit_backend::{
    Attention, AttentionParams, Backend, BackendError, Buffer, Device, KvCache, KvType, KvTypes,
    KvWrite, PrimitiveOps, SequenceSpan, StepInputs, StepKey,
};
use runit_backend_cpu::{CpuBackend, SimdLevel};
use runit_backend_cuda::CudaBackend;

const BLOCK_SIZE: usize = 16;

/// (heads, kv_heads, head_dim).
type Shape = (usize, usize, usize);
/// (cached prefix, new rows) of each sequence.
type Sequences = &'static [(usize, usize)];

fn cuda() -> Option<CudaBackend> {
    common::cuda_or_notice("GPU op tests")
}

fn reference() -> CpuBackend {
    CpuBackend::with_simd(1, SimdLevel::Scalar).expect("scalar backend")
}

fn buffer(backend: &dyn Backend, values: &[f32]) -> Result<Buffer, BackendError> {
    let mut buffer = backend.alloc(values.len())?;
    backend.upload(&mut buffer, values)?;
    Ok(buffer)
}

/// Sequences with a cached prefix and new rows, in a cache whose blocks are handed out in a
/// shuffled order; `spare_blocks` extra blocks per table leave room to grow.
struct Setup {
    params: AttentionParams,
    kv_types: KvTypes,
    kv_width: usize,
    n_cells: usize,
    prefix_spans: Vec<SequenceSpan>,
    prefix_k: Vec<Vec<f32>>,
    prefix_v: Vec<Vec<f32>>,
    spans: Vec<SequenceSpan>,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    rows: usize,
}

impl Setup {
    fn new(
        seed: u64,
        (heads, kv_heads, head_dim): (usize, usize, usize),
        kv_types: impl Into<KvTypes>,
        window: Option<usize>,
        sequences: &[(usize, usize)],
        spare_blocks: usize,
    ) -> Setup {
        let mut rng = Rng::new(seed);
        let kv_width = kv_heads * head_dim;
        let counts: Vec<usize> = sequences
            .iter()
            .map(|(prefix, rows)| (prefix + rows).div_ceil(BLOCK_SIZE) + spare_blocks)
            .collect();
        let total_blocks = counts.iter().sum::<usize>() + 1;
        let mut order: Vec<u32> = (0..total_blocks as u32).collect();
        for i in (1..order.len()).rev() {
            order.swap(i, rng.below(i + 1));
        }
        let (mut next, mut first_row) = (0, 0);
        let mut setup = Setup {
            params: AttentionParams {
                heads,
                kv_heads,
                head_dim,
                scale: 1.0 / (head_dim as f32).sqrt(),
                sliding_window: window,
            },
            kv_types: kv_types.into(),
            kv_width,
            n_cells: total_blocks * BLOCK_SIZE,
            prefix_spans: Vec::new(),
            prefix_k: Vec::new(),
            prefix_v: Vec::new(),
            spans: Vec::new(),
            q: Vec::new(),
            k: Vec::new(),
            v: Vec::new(),
            rows: 0,
        };
        for (&(prefix, rows), &count) in sequences.iter().zip(&counts) {
            let table = order[next..next + count].to_vec();
            next += count;
            setup.prefix_spans.push(SequenceSpan {
                first_row: 0,
                rows: prefix,
                start_position: 0,
                block_table: table.clone(),
                block_size: BLOCK_SIZE,
            });
            setup
                .prefix_k
                .push(rng.values(prefix * kv_width, -1.0, 1.0));
            setup
                .prefix_v
                .push(rng.values(prefix * kv_width, -1.0, 1.0));
            setup.spans.push(SequenceSpan {
                first_row,
                rows,
                start_position: prefix,
                block_table: table,
                block_size: BLOCK_SIZE,
            });
            first_row += rows;
        }
        setup.rows = first_row;
        setup.refill(&mut rng);
        setup
    }

    /// New queries, keys and values for the current rows.
    fn refill(&mut self, rng: &mut Rng) {
        self.q = rng.values(
            self.rows * self.params.heads * self.params.head_dim,
            -2.0,
            2.0,
        );
        self.k = rng.values(self.rows * self.kv_width, -1.0, 1.0);
        self.v = rng.values(self.rows * self.kv_width, -1.0, 1.0);
    }

    fn caches(&self, b: &dyn Backend) -> Result<(KvCache, KvCache), BackendError> {
        let mut k_cache = b.alloc_kv(
            self.n_cells,
            self.kv_width,
            self.params.head_dim,
            self.kv_types.keys,
            runit_backend::KvRole::Keys,
        )?;
        let mut v_cache = b.alloc_kv(
            self.n_cells,
            self.kv_width,
            self.params.head_dim,
            self.kv_types.values,
            runit_backend::KvRole::Values,
        )?;
        for ((span, k), v) in self
            .prefix_spans
            .iter()
            .zip(&self.prefix_k)
            .zip(&self.prefix_v)
        {
            if span.rows > 0 {
                let (k, v) = (buffer(b, k)?, buffer(b, v)?);
                b.kv_write(KvWrite {
                    k: &k,
                    v: &v,
                    k_cache: &mut k_cache,
                    v_cache: &mut v_cache,
                    spans: std::slice::from_ref(span),
                })?;
            }
        }
        Ok((k_cache, v_cache))
    }

    /// Writes the new rows and attends, outside any step (host inputs uploaded per op).
    fn run(&self, b: &dyn Backend) -> Result<Vec<f32>, BackendError> {
        let (mut k_cache, mut v_cache) = self.caches(b)?;
        let (k, v) = (buffer(b, &self.k)?, buffer(b, &self.v)?);
        b.kv_write(KvWrite {
            k: &k,
            v: &v,
            k_cache: &mut k_cache,
            v_cache: &mut v_cache,
            spans: &self.spans,
        })?;
        let mut out = b.alloc(self.q.len())?;
        let attention = Attention {
            q: &buffer(b, &self.q)?,
            k_cache: &k_cache,
            v_cache: &v_cache,
            spans: &self.spans,
            params: &self.params,
        };
        b.attention(&attention, &mut out)?;
        let mut values = vec![0.0; self.q.len()];
        b.download(&out, &mut values)?;
        Ok(values)
    }
}

/// Runs `setup` on the GPU and the CPU and checks the NMSE.
fn compare(cuda: &CudaBackend, name: &str, setup: &Setup) {
    let expected = setup.run(&reference()).expect("cpu attention");
    let got = setup
        .run(cuda)
        .unwrap_or_else(|e| panic!("{name}: cuda: {e}"));
    let error = nmse(&expected, &got);
    println!("{name}: nmse {error:e}");
    assert!(
        got.iter().all(|v| v.is_finite()),
        "{name}: non-finite output"
    );
    assert!(error <= ATTENTION_BOUND, "{name}: nmse {error:e}");
}

/// ggml's Q8_0 and Q4_0 caches (llama.cpp's Hadamard rotation at head_dim 64 and 128, none
/// at 96): the write kernels' blocks and the block-reading attention against the CPU
/// (which quantizes the query to Q8_0 for the key dot, as ggml-cpu; the GPU dots in f32),
/// decode rows over long prefixes and a prefill span, with GQA and a sliding window.
#[test]
fn quantized_kv_caches_match_the_cpu() {
    let Some(cuda) = cuda() else { return };
    let pairs = [
        (KvType::Q8_0, KvType::Q8_0),
        (KvType::Q4_0, KvType::Q4_0),
        (KvType::Q8_0, KvType::Q4_0),
        (KvType::Q4_0, KvType::Q8_0),
    ];
    for (keys, values) in pairs {
        let types = KvTypes { keys, values };
        for (head_dim, window) in [(64, None), (128, None), (96, None), (128, Some(40))] {
            for sequences in [&[(600, 1), (37, 1), (1100, 1)][..], &[(20, 70)][..]] {
                let setup = Setup::new(0x9b10, (8, 2, head_dim), types, window, sequences, 0);
                let name = format!("{types} d{head_dim} window {window:?} {sequences:?}");
                compare(&cuda, &name, &setup);
            }
        }
    }
}

#[test]
fn decode_over_several_chunks_matches_the_cpu() {
    let Some(cuda) = cuda() else { return };
    // One row per sequence, lengths 601, 38 and 1101 (several 256-position chunks).
    let sequences = [(600, 1), (37, 1), (1100, 1)];
    for head_dim in [64, 128] {
        let setup = Setup::new(
            0xdec0 + head_dim as u64,
            (16, 4, head_dim),
            KvType::F16,
            None,
            &sequences,
            0,
        );
        compare(&cuda, &format!("decode h16/4 d{head_dim} f16"), &setup);
    }
    let setup = Setup::new(0xdec1, (16, 4, 128), KvType::F32, None, &sequences, 0);
    compare(&cuda, "decode h16/4 d128 f32", &setup);
}

#[test]
fn decode_over_hundreds_of_chunks_matches_the_cpu() {
    let Some(cuda) = cuda() else { return };
    // One decode row at depth 17,000 takes 266 chunks of 64 positions (more than the
    // combine's threads), a window of 9,000 its last 141; the two-row batch beside it as many.
    let q8 = KvTypes {
        keys: KvType::Q8_0,
        values: KvType::Q8_0,
    };
    for (index, (types, head_dim, window)) in [
        (q8, 128, None),
        (q8, 64, Some(9000)),
        (KvType::F32.into(), 128, None),
        (KvType::F16.into(), 96, Some(9000)),
    ]
    .into_iter()
    .enumerate()
    {
        for sequences in [&[(17_000, 1)][..], &[(17_000, 1), (300, 1)][..]] {
            let setup = Setup::new(
                0xc4a0 + index as u64,
                (8, 2, head_dim),
                types,
                window,
                sequences,
                0,
            );
            let name = format!("{types} d{head_dim} window {window:?} {sequences:?}");
            compare(&cuda, &name, &setup);
        }
    }
}

#[test]
fn decode_head_shapes_match_the_cpu() {
    let Some(cuda) = cuda() else { return };
    // (heads, kv_heads, head_dim): group of 8, group of 12 (two slices), MQA, odd head_dims.
    let shapes = [
        (8, 1, 256),
        (12, 1, 64),
        (32, 1, 128),
        (6, 3, 80),
        (4, 2, 48),
    ];
    for (index, shape) in shapes.into_iter().enumerate() {
        let setup = Setup::new(
            0xdec2 + index as u64,
            shape,
            KvType::F16,
            None,
            &[(700, 1), (5, 1)],
            0,
        );
        compare(&cuda, &format!("decode {shape:?} f16"), &setup);
    }
}

#[test]
fn prefill_matches_the_cpu() {
    let Some(cuda) = cuda() else { return };
    for (index, (head_dim, kv_type)) in [
        (128, KvType::F16),
        (128, KvType::F32),
        (64, KvType::F16),
        (256, KvType::F16),
        (80, KvType::F16),
    ]
    .into_iter()
    .enumerate()
    {
        // 100 new rows of one sequence, starting at position 37.
        let setup = Setup::new(
            0x9ef1 + index as u64,
            (8, 2, head_dim),
            kv_type,
            None,
            &[(37, 100)],
            0,
        );
        compare(
            &cuda,
            &format!("prefill h8/2 d{head_dim} {kv_type:?}"),
            &setup,
        );
    }
    // Several sequences, one of them decoding, in one batch.
    let setup = Setup::new(
        0x9ef9,
        (8, 2, 64),
        KvType::F16,
        None,
        &[(0, 70), (300, 1), (20, 33)],
        0,
    );
    compare(&cuda, "prefill mixed batch", &setup);
}

#[test]
fn sliding_window_matches_the_cpu() {
    let Some(cuda) = cuda() else { return };
    let setup = Setup::new(0x5117, (8, 2, 128), KvType::F16, Some(20), &[(37, 100)], 0);
    compare(&cuda, "prefill window 20", &setup);
    let setup = Setup::new(
        0x5118,
        (8, 2, 64),
        KvType::F16,
        Some(300),
        &[(1100, 1), (250, 1)],
        0,
    );
    compare(&cuda, "decode window 300", &setup);
    let setup = Setup::new(
        0x5119,
        (4, 4, 64),
        KvType::F32,
        Some(1),
        &[(40, 1), (9, 20)],
        0,
    );
    compare(&cuda, "window 1", &setup);
}

#[test]
fn tensor_core_prefill_matches_the_cpu() {
    let Some(cuda) = cuda() else { return };
    // Several 64-row query tiles and 64-position key tiles, spans ending mid-tile, a decode
    // row in a prefill batch, windows narrower and wider than a tile, MQA and no grouping.
    let cases: [(u64, Shape, Option<usize>, Sequences); 4] = [
        (0x7c01, (8, 2, 128), None, &[(0, 300), (500, 70), (10, 1)]),
        (0x7c02, (6, 1, 64), None, &[(130, 129)]),
        (0x7c03, (8, 2, 64), Some(100), &[(200, 150), (0, 65)]),
        (0x7c04, (4, 4, 128), Some(7), &[(3, 90)]),
    ];
    for (seed, shape, window, sequences) in cases {
        let setup = Setup::new(seed, shape, KvType::F16, window, sequences, 0);
        let name = format!("mma prefill {shape:?} window {window:?} {sequences:?}");
        compare(&cuda, &name, &setup);
    }
}

#[test]
fn tensor_core_decode_matches_the_cpu() {
    let Some(cuda) = cuda() else { return };
    // Rows inside one 64-position chunk (written directly) and across many; groups of 7 (the
    // 16-row mma tile half padding), chunk edges at 63/64, the first position.
    let sequences = [(1023, 1), (63, 1), (64, 1), (2500, 1), (0, 1), (200, 1)];
    for (index, shape) in [(28, 4, 128), (14, 2, 64)].into_iter().enumerate() {
        let setup = Setup::new(
            0xdc01 + index as u64,
            shape,
            KvType::F16,
            None,
            &sequences,
            2,
        );
        compare(&cuda, &format!("mma decode {shape:?}"), &setup);
    }
    let setup = Setup::new(
        0xdc05,
        (14, 2, 64),
        KvType::F16,
        Some(64),
        &[(1023, 1), (100, 1), (40, 1)],
        0,
    );
    compare(&cuda, "mma decode window 64", &setup);
    // Many rows: few long chunks fill the device (`DecodePlan::mma`), so short rows are
    // written directly and long ones (past a chunk of thousands of positions) merged.
    let sequences: Vec<(usize, usize)> = (0..80).map(|i| ((i * 797) % 3100, 1)).collect();
    let setup = Setup::new(0xdc06, (28, 4, 128), KvType::F16, None, &sequences, 0);
    compare(&cuda, "mma decode 80 rows", &setup);
}

/// One decode step of `setup` inside `begin_step` .. `end_step`, captured or replayed.
fn captured_step(
    cuda: &CudaBackend,
    setup: &Setup,
    caches: &mut (KvCache, KvCache),
    buffers: &mut (Buffer, Buffer, Buffer, Buffer),
) -> Result<Vec<f32>, BackendError> {
    let (q, k, v, out) = buffers;
    cuda.upload(q, &setup.q)?;
    cuda.upload(k, &setup.k)?;
    cuda.upload(v, &setup.v)?;
    let tokens = vec![0u32; setup.rows];
    let positions: Vec<u32> = setup
        .spans
        .iter()
        .flat_map(|s| (s.start_position..s.start_position + s.rows).map(|p| p as u32))
        .collect();
    let logit_rows: Vec<u32> = (0..setup.rows as u32).collect();
    let inputs = StepInputs {
        tokens: &tokens,
        positions: &positions,
        spans: &setup.spans,
        window_spans: None,
        logit_rows: &logit_rows,
        rows_alone: false,
    };
    let key = StepKey {
        workspace: 7,
        tokens: setup.rows,
        spans: setup.spans.len(),
        logit_rows: setup.rows,
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
            params: &setup.params,
        };
        cuda.attention(&attention, out)
    });
    cuda.end_step()?;
    result?;
    let mut values = vec![0.0; setup.q.len()];
    cuda.download(out, &mut values)?;
    Ok(values)
}

#[test]
fn a_captured_decode_step_stays_valid_as_sequences_grow() {
    let Some(cuda) = cuda() else { return };
    let cpu = reference();
    let mut rng = Rng::new(0xca97);
    let mut setup = Setup::new(
        0xca98,
        (16, 4, 128),
        KvType::F16,
        None,
        &[(252, 1), (700, 1)],
        3,
    );
    let mut gpu_caches = setup.caches(&cuda).expect("gpu caches");
    let mut cpu_caches = setup.caches(&cpu).expect("cpu caches");
    let q_len = setup.q.len();
    let kv_len = setup.k.len();
    let mut buffers = (
        cuda.alloc(q_len).expect("q"),
        cuda.alloc(kv_len).expect("k"),
        cuda.alloc(kv_len).expect("v"),
        cuda.alloc(q_len).expect("out"),
    );
    // Step 0 captures the graph; the later steps replay it one position further each time
    // (the first sequence crosses the chunk boundary at position 256).
    for step in 0..6 {
        if step > 0 {
            for span in &mut setup.spans {
                span.start_position += 1;
            }
            setup.refill(&mut rng);
        }
        let got = captured_step(&cuda, &setup, &mut gpu_caches, &mut buffers)
            .unwrap_or_else(|e| panic!("step {step}: cuda: {e}"));
        let (k_cache, v_cache) = &mut cpu_caches;
        let (k, v) = (
            buffer(&cpu, &setup.k).unwrap(),
            buffer(&cpu, &setup.v).unwrap(),
        );
        cpu.kv_write(KvWrite {
            k: &k,
            v: &v,
            k_cache,
            v_cache,
            spans: &setup.spans,
        })
        .unwrap();
        let mut out = cpu.alloc(q_len).unwrap();
        let attention = Attention {
            q: &buffer(&cpu, &setup.q).unwrap(),
            k_cache,
            v_cache,
            spans: &setup.spans,
            params: &setup.params,
        };
        cpu.attention(&attention, &mut out).unwrap();
        let mut expected = vec![0.0; q_len];
        cpu.download(&out, &mut expected).unwrap();
        let error = nmse(&expected, &got);
        println!("captured step {step}: nmse {error:e}");
        assert!(error <= ATTENTION_BOUND, "step {step}: nmse {error:e}");
    }
}

/// Microseconds per attention call of `setup`: `(stream, graph)`, the first launched op by op
/// (the step inputs uploaded by each call), the second replaying a captured graph of ten calls
/// inside a step.
fn time_attention(cuda: &CudaBackend, setup: &Setup, workspace: u64) -> (f64, f64) {
    let (k_cache, v_cache) = setup.caches(cuda).expect("caches");
    let q = buffer(cuda, &setup.q).expect("q");
    let mut out = cuda.alloc(setup.q.len()).expect("out");
    let attention = Attention {
        q: &q,
        k_cache: &k_cache,
        v_cache: &v_cache,
        spans: &setup.spans,
        params: &setup.params,
    };
    let call = |out: &mut Buffer| cuda.attention(&attention, out);
    call(&mut out).expect("attention");
    cuda.synchronize().expect("sync");
    let runs = 20;
    let start = std::time::Instant::now();
    for _ in 0..runs {
        call(&mut out).expect("attention");
    }
    cuda.synchronize().expect("sync");
    let stream = start.elapsed().as_secs_f64() * 1e6 / runs as f64;

    let tokens = vec![0u32; setup.rows];
    let positions: Vec<u32> = setup
        .spans
        .iter()
        .flat_map(|s| (s.start_position..s.start_position + s.rows).map(|p| p as u32))
        .collect();
    let logit_rows: Vec<u32> = (0..setup.rows as u32).collect();
    let inputs = StepInputs {
        tokens: &tokens,
        positions: &positions,
        spans: &setup.spans,
        window_spans: None,
        logit_rows: &logit_rows,
        rows_alone: false,
    };
    let key = StepKey {
        workspace,
        tokens: setup.rows,
        spans: setup.spans.len(),
        logit_rows: setup.rows,
    };
    let calls = 10;
    cuda.begin_step(&inputs).expect("begin_step");
    let mut replay = || {
        cuda.run_captured(key, &mut || {
            let attention = Attention {
                spans: inputs.spans,
                ..attention
            };
            for _ in 0..calls {
                cuda.attention(&attention, &mut out)?;
            }
            Ok(())
        })
        .expect("captured attention")
    };
    replay(); // op by op
    replay(); // captured
    cuda.synchronize().expect("sync");
    let start = std::time::Instant::now();
    for _ in 0..runs {
        replay();
    }
    cuda.synchronize().expect("sync");
    let graph = start.elapsed().as_secs_f64() * 1e6 / (runs * calls) as f64;
    cuda.end_step().expect("end_step");
    (stream, graph)
}

/// Prints the time of one attention call for decode and prefill shapes, with the tensor-core
/// kernels and without (`RUNIT_CUDA_ATTENTION_MMA=0`). A measurement, not a check:
/// `cargo test --test ops_gpu -- --ignored --nocapture attention_timings` (alone: it sets an
/// environment variable that the other tests read).
#[test]
#[ignore = "timing printout, run by hand on a GPU"]
fn attention_timings() {
    let Some(cuda) = cuda() else { return };
    let shapes: [(&str, Shape, Sequences); 10] = [
        ("prefill 512", (32, 8, 128), &[(0, 512)]),
        ("prefill 2048", (32, 8, 128), &[(0, 2048)]),
        ("prefill 512 7b", (28, 4, 128), &[(0, 512)]),
        ("prefill 512 0.5b", (14, 2, 64), &[(0, 512)]),
        ("decode 128 7b", (28, 4, 128), &[(127, 1)]),
        ("decode 1024 7b", (28, 4, 128), &[(1023, 1)]),
        ("decode 4096 7b", (28, 4, 128), &[(4095, 1)]),
        ("decode 128 0.5b", (14, 2, 64), &[(127, 1)]),
        ("decode 1024 0.5b", (14, 2, 64), &[(1023, 1)]),
        ("decode 32 x 2048", (32, 8, 128), &[(2048, 1); 32]),
    ];
    for (index, (name, shape, sequences)) in shapes.into_iter().enumerate() {
        let setup = Setup::new(0x7133, shape, KvType::F16, None, sequences, 0);
        for mma in [true, false] {
            std::env::set_var("RUNIT_CUDA_ATTENTION_MMA", if mma { "1" } else { "0" });
            let (stream, graph) =
                time_attention(&cuda, &setup, 1000 + 2 * index as u64 + u64::from(mma));
            let kernels = if mma { "mma   " } else { "scalar" };
            println!(
                "{name:>18} {shape:?} f16 {kernels}: {stream:8.1} us per call (stream), {graph:8.1} us (graph)"
            );
        }
    }
    std::env::remove_var("RUNIT_CUDA_ATTENTION_MMA");
    // The floor: a captured graph of one-element adds (one kernel node each).
    let mut dst = buffer(&cuda, &[1.0]).expect("dst");
    let src = buffer(&cuda, &[1.0]).expect("src");
    let inputs = StepInputs {
        tokens: &[0],
        positions: &[0],
        spans: &[],
        window_spans: None,
        logit_rows: &[0],
        rows_alone: false,
    };
    let key = StepKey {
        workspace: 999,
        tokens: 1,
        spans: 0,
        logit_rows: 1,
    };
    cuda.begin_step(&inputs).expect("begin_step");
    let mut replay = || {
        cuda.run_captured(key, &mut || {
            for _ in 0..10 {
                cuda.add(&mut dst, &src, 1)?;
            }
            Ok(())
        })
        .expect("captured adds")
    };
    replay();
    replay();
    cuda.synchronize().expect("sync");
    let start = std::time::Instant::now();
    for _ in 0..20 {
        replay();
    }
    cuda.synchronize().expect("sync");
    let micros = start.elapsed().as_secs_f64() * 1e6 / 200.0;
    cuda.end_step().expect("end_step");
    println!("one-element add in a graph: {micros:.1} us per kernel node");
}

#[test]
fn greedy_picks_match_the_host() {
    // The device's argmax (first of equal maxima, NaNs never win) and log-probability
    // against `runit_backend::pick::pick_row`, over vocabulary-sized rows with planted ties.
    let Some(cuda) = cuda() else { return };
    let mut rng = Rng::new(0x91c);
    for (rows, width) in [(1usize, 151_936usize), (3, 49_152), (2, 7), (5, 1000)] {
        let mut values = rng.values(rows * width, -20.0, 20.0);
        for r in 0..rows {
            let row = &mut values[r * width..(r + 1) * width];
            if width > 10 {
                // Two equal maxima: the first must win; a NaN (row 0) must not.
                row[width / 3] = 30.0;
                row[width / 2] = 30.0;
                if r == 0 {
                    row[width / 4] = f32::NAN;
                }
            }
        }
        let logits = buffer(&cuda, &values).expect("logits");
        let picks = cuda
            .greedy_pick(&logits, rows, width, true)
            .expect("greedy_pick");
        assert_eq!(picks.len(), rows);
        for (r, pick) in picks.iter().enumerate() {
            let expected = runit_backend::pick::pick_row(&values[r * width..(r + 1) * width], true);
            assert_eq!(pick.id, expected.id, "{rows} x {width}, row {r}");
            // A NaN logit makes the softmax (so the log-probability) NaN on both sides.
            let both_nan = pick.logprob.is_nan() && expected.logprob.is_nan();
            assert!(
                both_nan
                    || (pick.logprob - expected.logprob).abs()
                        <= 1e-4 * expected.logprob.abs().max(1.0),
                "{rows} x {width}, row {r}: log-probability {} vs {}",
                pick.logprob,
                expected.logprob
            );
        }
    }
}
