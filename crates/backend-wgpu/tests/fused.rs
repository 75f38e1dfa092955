//! The fused ops' kernels against their primitive sequences (`runit_backend::unfused`) on the
//! same adapter: every output equal bit for bit, so fusing changes no result.

use runit_backend::testing::{make_weight, Rng};
use runit_backend::{
    unfused, Activation, AddRmsNorm, Attention, AttentionOutput, AttentionParams, Buffer, Device,
    FusedOps, GatedFfn, GatedFfnRun, KvRole, KvType, KvWrite, NormFfnResidual, NormInput,
    PrimitiveOps, Projection, RmsNorm, RopeKvWrite, RopeParams, RopeStyle, SequenceSpan, Weight,
};
use runit_backend_wgpu::{WgpuBackend, MATVEC_TYPES};
use runit_quant::GgmlType;

/// Adapter 0 with every fusion on (several weights a matrix-vector dispatch too, which is
/// off by default on a CPU adapter such as lavapipe).
fn backend() -> Option<WgpuBackend> {
    match WgpuBackend::new(0) {
        Ok(backend) => Some(backend.with_matvec_parts()),
        Err(error) => {
            let required = std::env::var("RUNIT_REQUIRE_WGPU").is_ok_and(|v| v == "1");
            assert!(!required, "RUNIT_REQUIRE_WGPU=1 but: {error}");
            println!("NOTICE: no wgpu adapter: {error}");
            None
        }
    }
}

fn upload(gpu: &WgpuBackend, values: &[f32]) -> Buffer {
    let mut buffer = gpu.alloc(values.len()).expect("alloc");
    gpu.upload(&mut buffer, values).expect("upload");
    buffer
}

fn download(gpu: &WgpuBackend, buffer: &Buffer, len: usize) -> Vec<f32> {
    let mut host = vec![0.0; len];
    gpu.download(buffer, &mut host).expect("download");
    host
}

/// Bit patterns, so that a NaN or a signed zero would count as a difference too.
fn bits(values: &[f32]) -> Vec<u32> {
    values.iter().map(|v| v.to_bits()).collect()
}

#[test]
fn add_rms_norm_equals_add_then_rms_norm() {
    let Some(gpu) = backend() else { return };
    let gpu = gpu.with_norm_threads(1024);
    let looping = WgpuBackend::new(0)
        .expect("adapter")
        .without_held_norms()
        .with_norm_threads(1024);
    let portable = WgpuBackend::new(0).expect("adapter").with_norm_threads(256);
    let mut rng = Rng::new(31);
    // Widths below, at and past the kernel's 256 invocations a row, and a non-multiple of
    // it; rows held in registers (widths of a multiple of 4 up to 8,192: with 256
    // invocations one chunk of 1,024 values, and three and a half; with 1,024 one chunk of
    // 4,096, and two) and rows looped over (a width not a multiple of 4, one past 8,192, and
    // every width on a backend that does not hold rows).
    let cases = [
        (48, 3),
        (64, 1),
        (576, 2),
        (1000, 5),
        (1002, 2),
        (3584, 2),
        (8200, 1),
    ];
    for ((width, rows), gpu) in cases
        .into_iter()
        .flat_map(|case| [(case, &gpu), (case, &looping), (case, &portable)])
    {
        let len = width * rows;
        let (x, delta) = (rng.normal(len, 3.0), rng.normal(len, 1.0));
        let weight_values = rng.values(width, 0.5, 1.5);
        let weight =
            make_weight(gpu, "norm", GgmlType::F32, &[width], &weight_values).expect("norm weight");
        let norm = RmsNorm {
            weight: &weight,
            eps: 1e-5,
        };
        let (mut results, mut used) = (Vec::new(), Vec::new());
        for fused in [false, true] {
            let (mut x_buffer, delta_buffer) = (upload(gpu, &x), upload(gpu, &delta));
            let mut out = gpu.alloc(len).expect("alloc");
            let op = AddRmsNorm {
                x: &mut x_buffer,
                delta: &delta_buffer,
                norm,
                rows,
                out: &mut out,
            };
            let before = gpu.counts().dispatches;
            match fused {
                true => gpu.add_rms_norm(op),
                false => unfused::add_rms_norm(gpu, op),
            }
            .expect("add_rms_norm");
            used.push(gpu.counts().dispatches - before);
            let sum = download(gpu, &x_buffer, len);
            results.push((bits(&sum), bits(&download(gpu, &out, len))));
        }
        assert_eq!(results[0].0, results[1].0, "x + delta, width {width}");
        assert_eq!(results[0].1, results[1].1, "norm, width {width}");
        assert_eq!(used, [2, 1], "dispatches, width {width}");
    }
}

/// Short rows take the norms at 256 invocations on a backend of 1,024 (`norm_kernel`: rows
/// of at most 1,024 values): a pipeline of their own, and every output equal bit for bit to
/// a backend of 256 for every row; longer rows equal to a backend of 1,024.
#[test]
fn short_rows_take_the_narrow_norms() {
    let Some(gpu) = backend() else { return };
    let wide = gpu.with_norm_threads(1024);
    if wide.norm_threads() != 1024 {
        println!("NOTICE: the adapter grants no norm of 1,024 invocations");
        return;
    }
    let mixed = WgpuBackend::new(0)
        .expect("adapter")
        .with_norm_threads(1024)
        .with_narrow_norm_rows(1024);
    let portable = WgpuBackend::new(0).expect("adapter").with_norm_threads(256);
    let mut rng = Rng::new(53);
    for (width, rows) in [(3584, 2), (576, 3), (896, 2), (1024, 1), (1028, 2)] {
        let len = width * rows;
        let (x, delta) = (rng.normal(len, 3.0), rng.normal(len, 1.0));
        let weight_values = rng.values(width, 0.5, 1.5);
        let mut results = Vec::new();
        for gpu in [&mixed, &portable, &wide] {
            let weight = make_weight(gpu, "norm", GgmlType::F32, &[width], &weight_values)
                .expect("norm weight");
            let norm = RmsNorm {
                weight: &weight,
                eps: 1e-6,
            };
            let (mut x_buffer, delta_buffer) = (upload(gpu, &x), upload(gpu, &delta));
            let mut out = gpu.alloc(len).expect("alloc");
            let made = gpu.counts().pipelines_made;
            gpu.add_rms_norm(AddRmsNorm {
                x: &mut x_buffer,
                delta: &delta_buffer,
                norm,
                rows,
                out: &mut out,
            })
            .expect("add_rms_norm");
            let mut plain = gpu.alloc(len).expect("alloc");
            gpu.rms_norm(&x_buffer, norm, rows, &mut plain)
                .expect("rms_norm");
            results.push((
                bits(&download(gpu, &out, len)),
                bits(&download(gpu, &plain, len)),
                gpu.counts().pipelines_made - made,
            ));
        }
        let [mixed, portable, wide] = [&results[0], &results[1], &results[2]];
        let like = if width <= 1024 { portable } else { wide };
        assert_eq!(mixed.0, like.0, "add + norm, width {width}");
        assert_eq!(mixed.1, like.1, "norm, width {width}");
        assert_eq!(mixed.0, mixed.1, "add + norm against norm, width {width}");
        // The first short width compiles the two narrow kernels beside the wide ones.
        if width == 576 {
            assert_eq!(mixed.2, 2, "narrow pipelines made at width {width}");
        }
        if width == 3584 {
            assert!(mixed.2 >= 2, "wide pipelines made at width {width}");
        }
    }
}

/// `add_rms_norm` then a matmul of its results, three steps: the first teaches the norm the
/// matmul's rounding, the second rounds in the norm's dispatch, the third has the matmul take
/// a weight of another rounding (F16, or Q8_0 after F16), so the guess is wrong and the
/// matmul rounds again. Each step's
/// sum, norm and product equal the primitives' (add, rms_norm, matmul) bit for bit, for
/// every rounding mode, with the fast kernels and the exact ones (packed blocks), at widths
/// of one chunk of the held kernel (4 values an invocation: 4,096 values with 1,024
/// invocations, 1,024 with 256) and of two, the second part full, and looping over a row of
/// two chunks.
#[test]
fn add_rms_norm_rounds_for_the_next_matmul() {
    let Some(gpu) = backend() else { return };
    let gpu = gpu.with_norm_threads(1024);
    let exact = WgpuBackend::new(0)
        .expect("adapter")
        .with_exact_matmul()
        .with_norm_threads(1024);
    let portable = WgpuBackend::new(0).expect("adapter").with_norm_threads(256);
    let types = [
        GgmlType::Q8_0,
        GgmlType::Q4_1,
        GgmlType::Q4_K,
        GgmlType::F16,
        GgmlType::BF16,
        GgmlType::F32,
    ];
    let rows_out = 40;
    let wide = [(&gpu, "fast"), (&exact, "exact")]
        .into_iter()
        .flat_map(|gpu| [(gpu, 512), (gpu, 1280), (gpu, 5120)]);
    let narrow = [
        ((&portable, "fast, 256 invocations"), 512),
        ((&portable, "fast, 256 invocations"), 1280),
    ];
    // The loop over the row (rows not held), rounding a chunk of 4,096 values a call.
    let looping = WgpuBackend::new(0)
        .expect("adapter")
        .without_held_norms()
        .with_norm_threads(1024);
    let looped = [((&looping, "fast, looped"), 5120)];
    for ((gpu, mode), width) in wide.chain(narrow).chain(looped) {
        let mut rng = Rng::new(37);
        let others = [GgmlType::F16, GgmlType::Q8_0]
            .map(|ty| weights(gpu, ty, width, &[rows_out], 41).remove(0));
        for ty in types {
            let w = weights(gpu, ty, width, &[rows_out], 43).remove(0);
            let other = &others[usize::from(ty == GgmlType::F16)];
            for tokens in [1, 2, 5] {
                // A norm weight of its own, which no matmul has read yet.
                let norm_values = rng.values(width, 0.5, 1.5);
                let norm_weight = make_weight(gpu, "norm", GgmlType::F32, &[width], &norm_values)
                    .expect("norm weight");
                let norm = RmsNorm {
                    weight: &norm_weight,
                    eps: 1e-6,
                };
                let len = tokens * width;
                let (x, delta) = (rng.normal(len, 2.0), rng.normal(len, 1.0));
                for (step, next) in [&w, &w, other].into_iter().enumerate() {
                    let (mut results, mut used) = (Vec::new(), Vec::new());
                    for fused in [false, true] {
                        let (mut x_buffer, delta_buffer) = (upload(gpu, &x), upload(gpu, &delta));
                        let mut normed = gpu.alloc(len).expect("alloc");
                        let mut product = gpu.alloc(tokens * rows_out).expect("alloc");
                        let op = AddRmsNorm {
                            x: &mut x_buffer,
                            delta: &delta_buffer,
                            norm,
                            rows: tokens,
                            out: &mut normed,
                        };
                        let before = gpu.counts().dispatches;
                        match fused {
                            true => gpu.add_rms_norm(op),
                            false => unfused::add_rms_norm(gpu, op),
                        }
                        .and_then(|()| gpu.matmul(next, &normed, tokens, &mut product))
                        .expect("add_rms_norm and matmul");
                        used.push(gpu.counts().dispatches - before);
                        results.push([
                            bits(&download(gpu, &x_buffer, len)),
                            bits(&download(gpu, &normed, len)),
                            bits(&download(gpu, &product, tokens * rows_out)),
                        ]);
                    }
                    let detail = format!("{mode} {ty:?} {width} x {tokens}, step {step}");
                    assert_eq!(results[0], results[1], "{detail}");
                    // The add joins the norm; at the second step the rounding joins it too.
                    let rounds = step == 1 && ty != GgmlType::F32;
                    let saved = if rounds { 2 } else { 1 };
                    assert_eq!(used[1] + saved, used[0], "{detail}: dispatches {used:?}");
                }
            }
        }
    }
}

/// One decode-like step: `rows` new rows of one sequence after `prefix` cached positions.
struct RopeCase {
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    style: RopeStyle,
    keys: KvType,
    values: KvType,
    prefix: usize,
    rows: usize,
}

/// q, k (after RoPE) and attention over the caches written, by the fused op or its primitive
/// sequence, and the dispatches of the op's last call.
fn rope_kv_write_run(gpu: &WgpuBackend, case: &RopeCase, fused: bool) -> ([Vec<u32>; 3], u64) {
    let mut rng = Rng::new(7);
    let (q_width, kv_width) = (case.heads * case.head_dim, case.kv_heads * case.head_dim);
    let block_size = 16;
    let cells = (case.prefix + case.rows).div_ceil(block_size) * block_size;
    let mut k_cache = gpu
        .alloc_kv(cells, kv_width, case.head_dim, case.keys, KvRole::Keys)
        .expect("k cache");
    let mut v_cache = gpu
        .alloc_kv(cells, kv_width, case.head_dim, case.values, KvRole::Values)
        .expect("v cache");
    let rope = |heads| RopeParams {
        style: case.style,
        heads,
        head_dim: case.head_dim,
        rotary_dim: case.head_dim,
        theta: 10_000.0,
        freq_scale: 1.0,
        yarn: None,
    };
    let (q_rope, k_rope) = (rope(case.heads), rope(case.kv_heads));
    // Blocks in reverse order, so that cells are not the positions.
    let table: Vec<u32> = (0..(cells / block_size) as u32).rev().collect();
    let (mut q_all, mut used) = (None, 0);
    for (start, rows) in [(0, case.prefix), (case.prefix, case.rows)] {
        if rows == 0 {
            continue;
        }
        let mut q = upload(gpu, &rng.values(rows * q_width, -2.0, 2.0));
        let mut k = upload(gpu, &rng.values(rows * kv_width, -1.0, 1.0));
        let mut v = upload(gpu, &rng.values(rows * kv_width, -1.0, 1.0));
        let positions: Vec<u32> = (start as u32..(start + rows) as u32).collect();
        let spans = [SequenceSpan {
            first_row: 0,
            rows,
            start_position: start,
            block_table: table.clone(),
            block_size,
        }];
        let op = RopeKvWrite {
            q: &mut q,
            k: &mut k,
            v: &mut v,
            positions: &positions,
            q_rope: &q_rope,
            k_rope: &k_rope,
            freq_factors: None,
            k_cache: &mut k_cache,
            v_cache: &mut v_cache,
            spans: &spans,
            qk_norms: None,
        };
        used = rope_kv_write_counted(gpu, fused, op);
        q_all = Some((q, k, spans));
    }
    let (q, k, spans) = q_all.expect("a step with rows");
    let params = AttentionParams {
        heads: case.heads,
        kv_heads: case.kv_heads,
        head_dim: case.head_dim,
        scale: 1.0 / (case.head_dim as f32).sqrt(),
        sliding_window: None,
    };
    let attention = Attention {
        q: &q,
        k_cache: &k_cache,
        v_cache: &v_cache,
        spans: &spans,
        params: &params,
    };
    let mut out = gpu.alloc(case.rows * q_width).expect("alloc");
    gpu.attention(&attention, &mut out).expect("attention");
    let results = [
        bits(&download(gpu, &q, case.rows * q_width)),
        bits(&download(gpu, &k, case.rows * kv_width)),
        bits(&download(gpu, &out, case.rows * q_width)),
    ];
    (results, used)
}

#[test]
fn rope_kv_write_equals_its_primitives() {
    let Some(gpu) = backend() else { return };
    use KvType::{F16, F32, Q4_0, Q8_0};
    // The last field: the dispatches of the op's last call by the primitives (rope, rope, a
    // Hadamard pass over a copy of each rotated cache's rows, kv_write) and fused (one,
    // rope_kv_write.wgsl, where no cache rotates its rows; else rope_pair for the two ropes).
    let cases = [
        (8, 2, 64, RopeStyle::Normal, F16, F16, 37, 1, [3, 1]),
        (4, 4, 32, RopeStyle::Neox, F32, F32, 3, 5, [3, 1]),
        (4, 1, 128, RopeStyle::Neox, F32, F16, 70, 2, [3, 1]),
        (8, 2, 64, RopeStyle::Neox, Q8_0, F16, 20, 1, [4, 3]),
        (4, 2, 64, RopeStyle::Normal, F16, Q4_0, 0, 3, [4, 3]),
        (2, 1, 128, RopeStyle::Normal, Q8_0, Q8_0, 12, 1, [5, 4]),
        // Key rows of 512 pairs and 512 or 1,024 cache words: several steps of a workgroup.
        (16, 8, 128, RopeStyle::Normal, F16, F32, 5, 2, [3, 1]),
        (16, 8, 128, RopeStyle::Neox, F32, F16, 40, 1, [3, 1]),
    ];
    for (heads, kv_heads, head_dim, style, keys, values, prefix, rows, dispatches) in cases {
        let case = RopeCase {
            heads,
            kv_heads,
            head_dim,
            style,
            keys,
            values,
            prefix,
            rows,
        };
        let (unfused, unfused_used) = rope_kv_write_run(&gpu, &case, false);
        let (fused, used) = rope_kv_write_run(&gpu, &case, true);
        let detail = format!("h{heads}/{kv_heads} d{head_dim} {style:?} {keys:?}/{values:?}");
        for (what, (a, b)) in ["q", "k", "attention"]
            .iter()
            .zip(unfused.iter().zip(&fused))
        {
            assert_eq!(a, b, "{what}: {detail}");
        }
        assert_eq!([unfused_used, used], dispatches, "dispatches: {detail}");
    }
}

/// `attention_output` (the attention rounding its output for the projection in its
/// dispatch where it can) against `attention` then `matmul`: the attention's output and the
/// projection equal bit for bit, and the rounding's dispatch saved exactly where the kernel
/// takes it: one-chunk spans covering the rows in order, no value rotation (q8_0 and q4_0
/// value caches rotate the output afterwards), the mode's blocks within a head, or, on the
/// split path (fast kernels) when a query's keys are several chunks, blocks of whole heads
/// (Q8_K blocks of 256 values from heads of 64 or 128, as qwen2.5-7b's) where the heads
/// divide into them: the merge rounds them. Keys of one chunk (5 cached positions) take one
/// dispatch either way (attention_split_final.wgsl: the output, rounded where the blocks lie
/// within a head), several (40) the first pass and the merge.
#[test]
fn attention_output_rounds_for_the_projection() {
    let Some(gpu) = backend() else { return };
    let exact = WgpuBackend::new(0).expect("adapter").with_exact_matmul();
    // The fast kernels on the one-chunk path: its rounding in the int8 kernels' layout.
    let one_chunk = WgpuBackend::new(0)
        .expect("adapter")
        .without_split_attention();
    use GgmlType::{BF16, F16 as H, F32 as S, Q4_1, Q4_K, Q8_0};
    use KvType::{F16, F32};
    // (heads, kv_heads, head_dim, key and value caches, projection type, rows of each span,
    // whether the fused call saves the rounding's dispatch with the fast kernels at one key
    // chunk and at several, and with the exact ones, which the one-chunk path shares)
    let cases = [
        (8, 2, 64, F16, F16, Q8_0, vec![1], [true, true, true]),
        (
            8,
            2,
            64,
            KvType::Q8_0,
            F16,
            BF16,
            vec![1],
            [true, true, true],
        ),
        (4, 4, 32, F32, F32, H, vec![2, 1], [true, true, true]),
        (2, 1, 256, F16, F16, Q4_K, vec![1], [true, true, true]),
        (2, 1, 64, F16, F16, Q4_1, vec![3], [true, true, true]),
        (8, 2, 64, F16, F16, Q4_K, vec![1], [false, true, false]),
        (4, 2, 128, F16, F16, Q4_K, vec![2, 1], [false, true, false]),
        (
            8,
            2,
            64,
            F16,
            KvType::Q8_0,
            Q8_0,
            vec![1],
            [false, false, false],
        ),
        (4, 4, 32, F16, F16, Q8_0, vec![64], [false, false, false]),
        (8, 2, 64, F16, F16, S, vec![1], [false, false, false]),
    ];
    // The fast kernels with one-chunk keys as two passes (records, then the merge): the
    // one-pass kernel's output and rounding must equal theirs bit for bit.
    let two_pass = WgpuBackend::new(0).expect("adapter").without_split_final();
    let mut fast_results = std::collections::HashMap::new();
    let modes = [
        (&gpu, "fast"),
        (&two_pass, "two-pass"),
        (&exact, "exact"),
        (&one_chunk, "one-chunk"),
    ];
    for ((gpu, mode), prefix) in modes.into_iter().flat_map(|m| [(m, 5), (m, 40)]) {
        for (case, (heads, kv_heads, head_dim, keys, values, ty, span_rows, saves)) in
            cases.clone().into_iter().enumerate()
        {
            let rounds = match (mode, prefix) {
                ("fast", 5) => saves[0],
                ("fast" | "two-pass", _) => saves[1],
                _ => saves[2],
            };
            let mut rng = Rng::new(47);
            let (q_width, kv_width) = (heads * head_dim, kv_heads * head_dim);
            let block_size = 16;
            let per_sequence = (prefix + 64usize).div_ceil(block_size);
            let cells = per_sequence * block_size * span_rows.len();
            let mut k_cache = gpu
                .alloc_kv(cells, kv_width, head_dim, keys, KvRole::Keys)
                .expect("k cache");
            let mut v_cache = gpu
                .alloc_kv(cells, kv_width, head_dim, values, KvRole::Values)
                .expect("v cache");
            let mut spans = Vec::new();
            for (j, &rows) in span_rows.iter().enumerate() {
                // Each sequence's blocks in reverse order, so that cells are not positions.
                let first = (j * per_sequence) as u32;
                let table: Vec<u32> = (first..first + per_sequence as u32).rev().collect();
                let written = prefix + rows;
                let k = upload(gpu, &rng.values(written * kv_width, -1.0, 1.0));
                let v = upload(gpu, &rng.values(written * kv_width, -1.0, 1.0));
                let span = SequenceSpan {
                    first_row: 0,
                    rows: written,
                    start_position: 0,
                    block_table: table.clone(),
                    block_size,
                };
                let write = KvWrite {
                    k: &k,
                    v: &v,
                    k_cache: &mut k_cache,
                    v_cache: &mut v_cache,
                    spans: &[span],
                };
                gpu.kv_write(write).expect("kv_write");
                let first_row = spans.iter().map(|s: &SequenceSpan| s.rows).sum();
                spans.push(SequenceSpan {
                    first_row,
                    rows,
                    start_position: prefix,
                    block_table: table,
                    block_size,
                });
            }
            let tokens: usize = span_rows.iter().sum();
            let q = upload(gpu, &rng.values(tokens * q_width, -2.0, 2.0));
            let projection = weights(gpu, ty, q_width, &[32], 53).remove(0);
            let params = AttentionParams {
                heads,
                kv_heads,
                head_dim,
                scale: 1.0 / (head_dim as f32).sqrt(),
                sliding_window: None,
            };
            let attention = Attention {
                q: &q,
                k_cache: &k_cache,
                v_cache: &v_cache,
                spans: &spans,
                params: &params,
            };
            let (mut results, mut used) = (Vec::new(), Vec::new());
            for fused in [false, true] {
                let mut attn = gpu.alloc(tokens * q_width).expect("alloc");
                let mut out = gpu.alloc(tokens * 32).expect("alloc");
                let before = gpu.counts().dispatches;
                match fused {
                    true => gpu.attention_output(AttentionOutput {
                        attention,
                        attn: &mut attn,
                        projection: &projection,
                        tokens,
                        out: &mut out,
                    }),
                    false => gpu
                        .attention(&attention, &mut attn)
                        .and_then(|()| gpu.matmul(&projection, &attn, tokens, &mut out)),
                }
                .expect("attention_output");
                used.push(gpu.counts().dispatches - before);
                results.push([
                    bits(&download(gpu, &attn, tokens * q_width)),
                    bits(&download(gpu, &out, tokens * 32)),
                ]);
            }
            let detail = format!(
                "{mode} prefix {prefix} h{heads}/{kv_heads} d{head_dim} {keys:?}/{values:?} {ty:?} {span_rows:?}"
            );
            assert_eq!(results[0], results[1], "{detail}");
            match mode {
                "fast" => {
                    fast_results.insert((case, prefix), results[1].clone());
                }
                "two-pass" => assert_eq!(
                    fast_results[&(case, prefix)],
                    results[1],
                    "one pass against two: {detail}"
                ),
                _ => {}
            }
            assert_eq!(
                used[0] - used[1],
                u64::from(rounds),
                "{detail}: dispatches {used:?}"
            );
        }
    }
}

/// Two sequences in one `rope_kv_write` (a span each, after cached positions of their own,
/// in blocks of their own): q, k and attention over both spans equal the primitives', and
/// the fused kernel writes both spans' rows in its one dispatch.
#[test]
fn rope_kv_write_of_two_sequences_equals_its_primitives() {
    let Some(gpu) = backend() else { return };
    let (heads, kv_heads, head_dim) = (4, 2, 64);
    let (q_width, kv_width) = (heads * head_dim, kv_heads * head_dim);
    let rope = |heads| RopeParams {
        style: RopeStyle::Neox,
        heads,
        head_dim,
        rotary_dim: head_dim,
        theta: 10_000.0,
        freq_scale: 1.0,
        yarn: None,
    };
    let (q_rope, k_rope) = (rope(heads), rope(kv_heads));
    let block_size = 16;
    // (cached positions, new rows) of each sequence.
    let sequences = [(21, 1), (6, 2)];
    let tables: Vec<Vec<u32>> = vec![vec![3, 0], vec![2, 1]];
    let (mut results, mut used) = (Vec::new(), Vec::new());
    for fused in [false, true] {
        let mut rng = Rng::new(59);
        let cells = 4 * block_size;
        let mut k_cache = gpu
            .alloc_kv(cells, kv_width, head_dim, KvType::F16, KvRole::Keys)
            .expect("k cache");
        let mut v_cache = gpu
            .alloc_kv(cells, kv_width, head_dim, KvType::F16, KvRole::Values)
            .expect("v cache");
        let (mut spans, mut positions) = (Vec::new(), Vec::new());
        for ((prefix, rows), table) in sequences.iter().zip(&tables) {
            let k = upload(&gpu, &rng.values(prefix * kv_width, -1.0, 1.0));
            let v = upload(&gpu, &rng.values(prefix * kv_width, -1.0, 1.0));
            let cached = SequenceSpan {
                first_row: 0,
                rows: *prefix,
                start_position: 0,
                block_table: table.clone(),
                block_size,
            };
            let write = KvWrite {
                k: &k,
                v: &v,
                k_cache: &mut k_cache,
                v_cache: &mut v_cache,
                spans: &[cached],
            };
            gpu.kv_write(write).expect("kv_write");
            spans.push(SequenceSpan {
                first_row: positions.len(),
                rows: *rows,
                start_position: *prefix,
                block_table: table.clone(),
                block_size,
            });
            positions.extend((*prefix..prefix + rows).map(|p| p as u32));
        }
        let tokens = positions.len();
        let mut q = upload(&gpu, &rng.values(tokens * q_width, -2.0, 2.0));
        let mut k = upload(&gpu, &rng.values(tokens * kv_width, -1.0, 1.0));
        let mut v = upload(&gpu, &rng.values(tokens * kv_width, -1.0, 1.0));
        let op = RopeKvWrite {
            q: &mut q,
            k: &mut k,
            v: &mut v,
            positions: &positions,
            q_rope: &q_rope,
            k_rope: &k_rope,
            freq_factors: None,
            k_cache: &mut k_cache,
            v_cache: &mut v_cache,
            spans: &spans,
            qk_norms: None,
        };
        used.push(rope_kv_write_counted(&gpu, fused, op));
        let params = AttentionParams {
            heads,
            kv_heads,
            head_dim,
            scale: 0.125,
            sliding_window: None,
        };
        let attention = Attention {
            q: &q,
            k_cache: &k_cache,
            v_cache: &v_cache,
            spans: &spans,
            params: &params,
        };
        let mut out = gpu.alloc(tokens * q_width).expect("alloc");
        gpu.attention(&attention, &mut out).expect("attention");
        results.push([
            bits(&download(&gpu, &q, tokens * q_width)),
            bits(&download(&gpu, &k, tokens * kv_width)),
            bits(&download(&gpu, &out, tokens * q_width)),
        ]);
    }
    for (what, (a, b)) in ["q", "k", "attention"]
        .iter()
        .zip(results[0].iter().zip(&results[1]))
    {
        assert_eq!(a, b, "{what}");
    }
    assert_eq!(used, [3, 1], "dispatches");
}

/// Weights of `rows` rows of `n` values of `ty`, with seeded values.
fn weights(gpu: &WgpuBackend, ty: GgmlType, n: usize, rows: &[usize], seed: u64) -> Vec<Weight> {
    let mut rng = Rng::new(seed);
    rows.iter()
        .map(|rows| {
            let values = rng.values(n * rows, -1.0, 1.0);
            make_weight(gpu, "w", ty, &[n, *rows], &values).expect("weight")
        })
        .collect()
}

/// An F32 bias for each of the Q, K and V row counts.
fn qkv_biases(gpu: &WgpuBackend, rows: [usize; 3]) -> Vec<Weight> {
    rows.iter()
        .map(|&r| {
            let values = Rng::new(r as u64).values(r, -1.0, 1.0);
            make_weight(gpu, "bias", GgmlType::F32, &[r], &values).expect("bias")
        })
        .collect()
}

/// `matmul_qkv` of `ws` (K's bias always, Q's and V's with `all_biases`) over `tokens` rows of
/// `x`, first as the primitives (`unfused`), then fused: each run's outputs as bits and its
/// dispatch count.
fn qkv_both_ways(
    gpu: &WgpuBackend,
    ws: &[Weight],
    biases: &[Weight],
    rows: [usize; 3],
    x: &Buffer,
    tokens: usize,
    all_biases: bool,
) -> (Vec<Vec<Vec<u32>>>, Vec<u64>) {
    let (mut results, mut used) = (Vec::new(), Vec::new());
    for fused in [false, true] {
        let mut outs: Vec<Buffer> = rows
            .iter()
            .map(|r| gpu.alloc(tokens * r).expect("alloc"))
            .collect();
        let projections = [0, 1, 2].map(|i| Projection {
            weight: &ws[i],
            bias: (all_biases || i == 1).then_some(&biases[i]),
        });
        let [q, k, v] = &mut outs[..] else {
            unreachable!()
        };
        let before = gpu.counts().dispatches;
        match fused {
            true => gpu.matmul_qkv(projections, x, tokens, [q, k, v]),
            false => unfused::matmul_qkv(gpu, projections, x, tokens, [q, k, v]),
        }
        .expect("matmul_qkv");
        used.push(gpu.counts().dispatches - before);
        let hosts: Vec<Vec<u32>> = outs
            .iter()
            .zip(rows)
            .map(|(out, r)| bits(&download(gpu, out, tokens * r)))
            .collect();
        results.push(hosts);
    }
    (results, used)
}

/// The Q, K and V projections (the V rows not a multiple of the kernel's 4 rows a workgroup,
/// with a bias on K, then on all three as Qwen2's) by `matmul_qkv` and by its primitives, for
/// every type with a matrix-vector kernel, at 1 to 3 tokens, with subgroup sums and without,
/// the three biases added in the Q/K/V dispatch and in one of their own.
#[test]
fn matmul_qkv_equals_three_matmuls() {
    let Some(gpu) = backend() else { return };
    let subgroups = gpu.uses_subgroups();
    let n = 256;
    let rows = [64, 32, 36];
    let mut gpus = vec![WgpuBackend::new(0)
        .expect("adapter")
        .with_matvec_parts()
        .without_bias_epilogue()];
    if subgroups {
        let shared = WgpuBackend::new(0).expect("adapter").without_subgroups();
        gpus.push(shared.with_matvec_parts());
    }
    gpus.push(gpu);
    for (index, gpu) in gpus.iter().enumerate() {
        let epilogue = index > 0;
        for ty in MATVEC_TYPES {
            let ws = weights(gpu, ty, n, &rows, 5);
            let biases = qkv_biases(gpu, rows);
            for (tokens, all_biases) in (1..=3).flat_map(|t| [(t, false), (t, true)]) {
                let x = upload(gpu, &Rng::new(9).values(tokens * n, -2.0, 2.0));
                let (results, used) =
                    qkv_both_ways(gpu, &ws, &biases, rows, &x, tokens, all_biases);
                let detail = format!(
                    "{ty:?} x {tokens}, subgroups {}, all biases {all_biases}, epilogue \
                     {epilogue}",
                    gpu.uses_subgroups()
                );
                assert_eq!(results[0], results[1], "{detail}");
                // Three matrix-vector dispatches became one (and the bias between two
                // matmuls no longer makes the last round its activations again); three
                // biases take one dispatch, or none in the epilogue.
                let saved = match (all_biases, epilogue) {
                    (true, true) => 5,
                    (true, false) => 4,
                    (false, _) => 2,
                };
                assert!(used[1] + saved <= used[0], "{detail}: dispatches {used:?}");
            }
        }
    }
}

/// The Q, K and V projections of different types (Q4_K_M's Q4_K Q and K beside a Q6_K V, and
/// Q8_0 beside F16), which no one dispatch takes: `matmul_qkv` runs Q and K in one dispatch
/// (at decode) and V in another, then the biases, equal bit for bit to the primitives (a
/// matmul and its bias each); where the types round their activations alike it rounds them
/// once, and three biases take one dispatch.
#[test]
fn matmul_qkv_of_mixed_types_equals_three_matmuls() {
    let Some(gpu) = backend() else { return };
    let n = 256;
    let rows = [64, 32, 36];
    // The types, and the roundings of the activations the fused op saves with all three
    // biases and with K's alone (the primitives round again after each bias; Q4_K and Q6_K
    // round alike, F16 and Q8_0 do not).
    let mixes = [
        ([GgmlType::Q4_K, GgmlType::Q4_K, GgmlType::Q6_K], [2, 1]),
        ([GgmlType::Q8_0, GgmlType::Q8_0, GgmlType::F16], [1, 0]),
    ];
    for (types, rounds_saved) in mixes {
        let ws: Vec<Weight> = types
            .iter()
            .zip(rows)
            .map(|(&ty, r)| weights(&gpu, ty, n, &[r], 17).remove(0))
            .collect();
        let biases = qkv_biases(&gpu, rows);
        for (tokens, all_biases) in [1, 2, 5].into_iter().flat_map(|t| [(t, false), (t, true)]) {
            let x = upload(&gpu, &Rng::new(11).values(tokens * n, -2.0, 2.0));
            let (results, used) = qkv_both_ways(&gpu, &ws, &biases, rows, &x, tokens, all_biases);
            let detail = format!("{types:?} x {tokens}, all biases {all_biases}");
            assert_eq!(results[0], results[1], "{detail}");
            // With all three biases, one dispatch of them instead of three; at decode (fewer
            // than 4 tokens), Q and K in one.
            let decode = u64::from(tokens < 4);
            let saved = match all_biases {
                true => rounds_saved[0] + 2 + decode,
                false => rounds_saved[1] + decode,
            };
            assert_eq!(used[1] + saved, used[0], "{detail}: dispatches {used:?}");
        }
    }
}

/// The gated FFN's hidden layer by `gated_ffn_hidden` (gate and up in one dispatch) and by
/// its primitives, for both activations, the hidden and up buffers compared.
#[test]
fn gated_ffn_hidden_equals_its_primitives() {
    let Some(gpu) = backend() else { return };
    let (n, ff) = (128, 88);
    for ty in [GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::F16] {
        let n = if ty == GgmlType::Q4_K { 256 } else { n };
        let ws = weights(&gpu, ty, n, &[ff, ff, n], 11);
        for activation in [Activation::Silu, Activation::GeluTanh] {
            for tokens in 1..=3 {
                let x = upload(&gpu, &Rng::new(13).values(tokens * n, -2.0, 2.0));
                let (mut results, mut used) = (Vec::new(), Vec::new());
                for fused in [false, true] {
                    let mut up = gpu.alloc(tokens * ff).expect("alloc");
                    let mut hidden = gpu.alloc(tokens * ff).expect("alloc");
                    let ffn = GatedFfn {
                        gate: &ws[0],
                        up: &ws[1],
                        down: &ws[2],
                        activation,
                    };
                    let run = GatedFfnRun {
                        ffn,
                        x: &x,
                        tokens,
                        up: &mut up,
                        hidden: &mut hidden,
                    };
                    let before = gpu.counts().dispatches;
                    match fused {
                        true => gpu.gated_ffn_hidden(run),
                        false => unfused::gated_ffn_hidden(&gpu, run),
                    }
                    .expect("gated_ffn_hidden");
                    used.push(gpu.counts().dispatches - before);
                    results.push([
                        bits(&download(&gpu, &hidden, tokens * ff)),
                        bits(&download(&gpu, &up, tokens * ff)),
                    ]);
                }
                assert_eq!(results[0], results[1], "{ty:?} {activation:?} x {tokens}");
                // Gate and up in one dispatch.
                assert_eq!(used[0], used[1] + 1, "{ty:?} {activation:?} x {tokens}");
            }
        }
    }
}

/// The whole gated FFN by `gated_ffn` (the activation rounding its results for down in the
/// same dispatch) and by its primitives, the output, hidden and up buffers compared; with the
/// fast kernels and with the exact ones (whose roundings keep ggml's packed blocks).
#[test]
fn gated_ffn_equals_its_primitives() {
    let Some(gpu) = backend() else { return };
    let exact = WgpuBackend::new(0)
        .expect("adapter")
        .with_matvec_parts()
        .with_exact_matmul();
    let types = [
        GgmlType::Q8_0,
        GgmlType::Q4_1,
        GgmlType::Q4_K,
        GgmlType::F16,
        GgmlType::BF16,
        GgmlType::F32,
    ];
    for (gpu, mode) in [(&gpu, "fast"), (&exact, "exact")] {
        for ty in types {
            let (n, ff) = (256, 512);
            let ws = weights(gpu, ty, n, &[ff, ff], 17);
            let down = weights(gpu, ty, ff, &[n], 19).remove(0);
            for activation in [Activation::Silu, Activation::GeluTanh] {
                for tokens in [1, 2, 5] {
                    let x = upload(gpu, &Rng::new(23).values(tokens * n, -2.0, 2.0));
                    let (mut results, mut used) = (Vec::new(), Vec::new());
                    for fused in [false, true] {
                        let mut up = gpu.alloc(tokens * ff).expect("alloc");
                        let mut hidden = gpu.alloc(tokens * ff).expect("alloc");
                        let mut out = gpu.alloc(tokens * n).expect("alloc");
                        let ffn = GatedFfn {
                            gate: &ws[0],
                            up: &ws[1],
                            down: &down,
                            activation,
                        };
                        let mut run = GatedFfnRun {
                            ffn,
                            x: &x,
                            tokens,
                            up: &mut up,
                            hidden: &mut hidden,
                        };
                        let before = gpu.counts().dispatches;
                        match fused {
                            true => gpu.gated_ffn(run, &mut out),
                            false => unfused::gated_ffn_hidden(gpu, run.reborrow())
                                .and_then(|()| gpu.matmul(&down, run.hidden, tokens, &mut out)),
                        }
                        .expect("gated_ffn");
                        used.push(gpu.counts().dispatches - before);
                        results.push([
                            bits(&download(gpu, &out, tokens * n)),
                            bits(&download(gpu, &hidden, tokens * ff)),
                            bits(&download(gpu, &up, tokens * ff)),
                        ]);
                    }
                    let detail = format!("{mode} {ty:?} {activation:?} x {tokens}");
                    assert_eq!(results[0], results[1], "{detail}");
                    // F32 activations are not rounded; the others' rounding joins the
                    // activation.
                    if ty != GgmlType::F32 {
                        assert!(used[1] < used[0], "{detail}: dispatches {used:?}");
                    }
                }
            }
        }
    }
}

/// Runs `op` fused or through its primitives; returns the dispatches it recorded.
fn rope_kv_write_counted(gpu: &WgpuBackend, fused: bool, op: RopeKvWrite<'_>) -> u64 {
    let before = gpu.counts().dispatches;
    match fused {
        true => gpu.rope_kv_write(op),
        false => unfused::rope_kv_write(gpu, op),
    }
    .expect("rope_kv_write");
    gpu.counts().dispatches - before
}

/// The decoder's second order (`FusedOps::norms_in_matmuls`) on one token: the norm in the
/// Q/K/V dispatch's prologue (with and without Qwen2's biases), the FFN with the norm in gate
/// and up's prologue and the residual add in down's epilogue, and the attention's output
/// projection with the add in its epilogue, each against its primitive sequence
/// (`runit_backend::unfused`) bit for bit; for the int8 types of both roundings (blocks of
/// 32 at a width of 896, of 256 at 768), rows held by the norm and looped over, the narrow
/// and the wide norm workgroup, and one dispatch where the primitives take several.
#[test]
fn norms_in_matmuls_equal_their_primitives() {
    let Some(gpu) = backend() else { return };
    // The prologues are off by default (slower on the GPU measured): on for these.
    let on = |gpu: WgpuBackend| {
        gpu.with_norm_prologue_max(8192)
            .with_gated_prologue_max(8192)
    };
    let mut gpus = vec![("default", on(gpu))];
    gpus.push((
        "loop",
        on(WgpuBackend::new(0)
            .expect("adapter")
            .with_matvec_parts()
            .without_held_norms()),
    ));
    gpus.push((
        "wide",
        on(WgpuBackend::new(0)
            .expect("adapter")
            .with_matvec_parts()
            .with_norm_threads(1024)),
    ));
    let cases = [
        (GgmlType::Q8_0, 896),
        (GgmlType::Q4_0, 896),
        (GgmlType::Q4_K, 768),
        (GgmlType::Q6_K, 768),
    ];
    for (label, gpu) in &gpus {
        for (ty, n) in cases {
            assert!(
                gpu.norms_in_matmuls(n),
                "{label} {ty:?}: the backend takes {n}"
            );
            let detail = format!("{label} {ty:?} n={n}");
            let norm_w = weights(gpu, GgmlType::F32, n, &[1], 3).remove(0);
            let norm = RmsNorm {
                weight: &norm_w,
                eps: 1e-6,
            };
            let x = upload(gpu, &Rng::new(41).values(n, -3.0, 3.0));
            // Q/K/V, without biases and with.
            let rows = [n, 128, 128];
            let ws = weights(gpu, ty, n, &rows, 5);
            let biases = qkv_biases(gpu, rows);
            for biased in [false, true] {
                let (mut results, mut used) = (Vec::new(), Vec::new());
                for fused in [false, true] {
                    let mut normed = gpu.alloc(n).expect("alloc");
                    let mut outs: Vec<Buffer> =
                        rows.iter().map(|r| gpu.alloc(*r).expect("alloc")).collect();
                    let projections = [0, 1, 2].map(|i| Projection {
                        weight: &ws[i],
                        bias: biased.then_some(&biases[i]),
                    });
                    let [q, k, v] = &mut outs[..] else {
                        unreachable!()
                    };
                    let input = NormInput {
                        x: &x,
                        norm,
                        rows: 1,
                        normed: &mut normed,
                    };
                    let before = gpu.counts().dispatches;
                    match fused {
                        true => gpu.norm_matmul_qkv(input, projections, [q, k, v]),
                        false => unfused::norm_matmul_qkv(gpu, input, projections, [q, k, v]),
                    }
                    .expect("norm_matmul_qkv");
                    used.push(gpu.counts().dispatches - before);
                    let mut got = vec![bits(&download(gpu, &normed, n))];
                    got.extend(
                        outs.iter()
                            .zip(rows)
                            .map(|(o, r)| bits(&download(gpu, o, r))),
                    );
                    results.push(got);
                }
                assert_eq!(results[0], results[1], "{detail} qkv biased {biased}");
                assert_eq!(used[1], 1, "{detail} qkv biased {biased}: {used:?}");
            }
            // The FFN half, both activations.
            let ff = 512;
            let gate_up = weights(gpu, ty, n, &[ff, ff], 17);
            let down = weights(gpu, ty, ff, &[n], 19).remove(0);
            for activation in [Activation::Silu, Activation::GeluTanh] {
                let (mut results, mut used) = (Vec::new(), Vec::new());
                for fused in [false, true] {
                    let mut x = upload(gpu, &Rng::new(43).values(n, -3.0, 3.0));
                    let mut normed = gpu.alloc(n).expect("alloc");
                    let mut up = gpu.alloc(ff).expect("alloc");
                    let mut hidden = gpu.alloc(ff).expect("alloc");
                    let mut delta = gpu.alloc(n).expect("alloc");
                    let op = NormFfnResidual {
                        x: &mut x,
                        norm,
                        normed: &mut normed,
                        ffn: GatedFfn {
                            gate: &gate_up[0],
                            up: &gate_up[1],
                            down: &down,
                            activation,
                        },
                        tokens: 1,
                        up: &mut up,
                        hidden: &mut hidden,
                        delta: &mut delta,
                    };
                    let before = gpu.counts().dispatches;
                    match fused {
                        true => gpu.norm_gated_ffn_residual(op),
                        false => unfused::norm_gated_ffn_residual(gpu, op),
                    }
                    .expect("norm_gated_ffn_residual");
                    used.push(gpu.counts().dispatches - before);
                    // `hidden` and `up` are scratch (the activation inside down's dispatch
                    // is written nowhere).
                    results.push([
                        bits(&download(gpu, &x, n)),
                        bits(&download(gpu, &normed, n)),
                        bits(&download(gpu, &delta, n)),
                    ]);
                }
                assert_eq!(results[0], results[1], "{detail} {activation:?} ffn");
                // Gate and up with the norm, then down with the activation and its rounding in
                // its prologue (blocks of 32) and the add; blocks of 256 keep the activation's
                // dispatch.
                let want = if ty.block_size() == 32 { 2 } else { 3 };
                assert_eq!(used[1], want, "{detail} {activation:?} ffn: {used:?}");
            }
        }
    }
}

/// One token's Q/K/V projections with RoPE and the cache write in their dispatch's epilogue
/// (`FusedOps::qkv_rope_kv_write` with `RUNIT_WGPU_ROPE_EPILOGUE=1`) against `matmul_qkv`
/// then `rope_kv_write`: q, k, v and the attention over the caches written after a prefix of
/// five rows, bit for bit, with one dispatch fewer; NEOX and normal pairs, f16 and f32 caches, int8
/// and f32 activations, with Qwen2's biases and without.
#[test]
fn qkv_rope_kv_write_equals_its_ops() {
    let Some(gpu) = backend() else { return };
    let gpu = gpu.with_rope_epilogue(true);
    let (n, block_size, prefix) = (256, 16, 5);
    let cases = [
        (4, 2, 64, RopeStyle::Neox, KvType::F16, GgmlType::Q8_0),
        (4, 2, 32, RopeStyle::Normal, KvType::F32, GgmlType::Q4_K),
        (2, 1, 128, RopeStyle::Neox, KvType::F32, GgmlType::F16),
    ];
    for (heads, kv_heads, head_dim, style, cache_ty, ty) in cases {
        let (q_width, kv_width) = (heads * head_dim, kv_heads * head_dim);
        let rows = [q_width, kv_width, kv_width];
        let ws = weights(&gpu, ty, n, &rows, 5);
        let biases = qkv_biases(&gpu, rows);
        let rope = |heads| RopeParams {
            style,
            heads,
            head_dim,
            rotary_dim: head_dim,
            theta: 10_000.0,
            freq_scale: 1.0,
            yarn: None,
        };
        let (q_rope, k_rope) = (rope(heads), rope(kv_heads));
        for biased in [false, true] {
            let detail = format!("{ty:?} {style:?} d{head_dim} {cache_ty:?} biased {biased}");
            let (mut results, mut used) = (Vec::new(), Vec::new());
            for fused in [false, true] {
                let cells = 2 * block_size;
                let mut k_cache = gpu
                    .alloc_kv(cells, kv_width, head_dim, cache_ty, KvRole::Keys)
                    .expect("k cache");
                let mut v_cache = gpu
                    .alloc_kv(cells, kv_width, head_dim, cache_ty, KvRole::Values)
                    .expect("v cache");
                let table: Vec<u32> = vec![1, 0];
                let mut rng = Rng::new(11);
                let mut last = None;
                for (start, tokens) in [(0, prefix), (prefix, 1)] {
                    let x = upload(&gpu, &rng.values(tokens * n, -2.0, 2.0));
                    let mut outs: Vec<Buffer> = rows
                        .iter()
                        .map(|r| gpu.alloc(tokens * r).expect("alloc"))
                        .collect();
                    let positions: Vec<u32> = (start as u32..(start + tokens) as u32).collect();
                    let spans = [SequenceSpan {
                        first_row: 0,
                        rows: tokens,
                        start_position: start,
                        block_table: table.clone(),
                        block_size,
                    }];
                    let projections = [0, 1, 2].map(|i| Projection {
                        weight: &ws[i],
                        bias: biased.then_some(&biases[i]),
                    });
                    let [q, k, v] = &mut outs[..] else {
                        unreachable!()
                    };
                    let before = gpu.counts().dispatches;
                    let op = RopeKvWrite {
                        q,
                        k,
                        v,
                        positions: &positions,
                        q_rope: &q_rope,
                        k_rope: &k_rope,
                        freq_factors: None,
                        k_cache: &mut k_cache,
                        v_cache: &mut v_cache,
                        spans: &spans,
                        qk_norms: None,
                    };
                    if fused && tokens == 1 {
                        gpu.qkv_rope_kv_write(projections, &x, op).expect("fused");
                    } else {
                        let qkv = [&mut *op.q, &mut *op.k, &mut *op.v];
                        gpu.matmul_qkv(projections, &x, tokens, qkv)
                            .expect("matmul_qkv");
                        gpu.rope_kv_write(op).expect("rope_kv_write");
                    }
                    used.push(gpu.counts().dispatches - before);
                    last = Some((outs, spans));
                }
                let (outs, spans) = last.expect("the token's step");
                let params = AttentionParams {
                    heads,
                    kv_heads,
                    head_dim,
                    scale: 1.0 / (head_dim as f32).sqrt(),
                    sliding_window: None,
                };
                let attention = Attention {
                    q: &outs[0],
                    k_cache: &k_cache,
                    v_cache: &v_cache,
                    spans: &spans,
                    params: &params,
                };
                let mut out = gpu.alloc(q_width).expect("alloc");
                gpu.attention(&attention, &mut out).expect("attention");
                let mut got: Vec<Vec<u32>> = outs
                    .iter()
                    .zip(rows)
                    .map(|(o, r)| bits(&download(&gpu, o, r)))
                    .collect();
                got.push(bits(&download(&gpu, &out, q_width)));
                results.push(got);
            }
            assert_eq!(results[0], results[1], "{detail}");
            // The token's step: RoPE and the cache write took no dispatch of their own.
            assert_eq!(used[3] + 1, used[1], "{detail}: dispatches {used:?}");
        }
    }
}
