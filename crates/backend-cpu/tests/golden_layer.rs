//! Layer 0 of `synth-qwen2-F32.gguf` run op by op on the CPU backend and compared with
//! llama.cpp's `llama-eval-callback` dump of the same prompt (golden `layer_dumps/`): the
//! printed corner values (4 decimals) and the sum of every node, from the embedding lookup
//! through flash attention (f16 KV cache) to the layer output.

use std::path::PathBuf;

mod common;

use runit_backend::{
    Activation, Attention, AttentionParams, Backend, Buffer, KvType, KvWrite, RmsNorm, RopeParams,
    RopeStyle, SequenceSpan, Weight,
};
use runit_backend_cpu::{CpuBackend, SimdLevel};
use runit_gguf::GgufFile;

fn golden() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/golden"))
}

/// One dumped node: the printed values (corners of each dimension) and the sum.
struct Node {
    values: Vec<f32>,
    sum: f64,
}

/// The dump of node `name` made by op `op`.
fn node(dump: &str, name: &str, op: &str) -> Node {
    let header = format!(" {name} = (f32) ");
    let lines: Vec<&str> = dump.lines().collect();
    let start = lines
        .iter()
        .position(|line| {
            line.starts_with("common_debug_cb_eval:")
                && line.contains(&header.replace("(f32) ", ""))
                && line.contains(&format!(" {op}("))
                && line
                    .split(" = ")
                    .next()
                    .is_some_and(|l| l.trim_end().ends_with(name))
        })
        .unwrap_or_else(|| panic!("node {name} ({op}) not in the dump"));
    let mut values = Vec::new();
    for line in &lines[start + 1..] {
        if let Some(sum) = line.trim().strip_prefix("sum = ") {
            return Node {
                values,
                sum: sum.parse().expect("sum"),
            };
        }
        for word in line.split_whitespace() {
            if let Ok(value) = word.trim_end_matches(',').parse::<f32>() {
                values.push(value);
            }
        }
    }
    panic!("node {name} has no sum line");
}

/// Indices ggml's debug print shows along a dimension of `n`.
fn shown(n: usize) -> Vec<usize> {
    if n > 6 {
        vec![0, 1, 2, n - 3, n - 2, n - 1]
    } else {
        (0..n).collect()
    }
}

/// Tolerances of one comparison: on the printed values (4 decimals, so at least 5e-5) and on
/// the f32 sum relative to the sum of magnitudes.
#[derive(Clone, Copy)]
struct Tolerance {
    value: f32,
    sum: f64,
}

/// Before attention the only differences are matmul summation orders (~1e-8 relative).
const BEFORE_ATTENTION: Tolerance = Tolerance {
    value: 6e-5,
    sum: 1e-7,
};
/// Attention rounds Q to f16 (as llama.cpp does), so an ulp of difference in Q can flip a
/// rounding and move a score by an f16 ulp; later nodes inherit that noise.
const AFTER_ATTENTION: Tolerance = Tolerance {
    value: 4e-4,
    sum: 3e-6,
};

/// Compares `ours` (ggml shape `ne`, `ne[0]` fastest) with a dumped node.
fn check(dump: &str, name: &str, op: &str, ne: [usize; 3], ours: &[f32], tolerance: Tolerance) {
    let node = node(dump, name, op);
    let mut picked = Vec::new();
    for i2 in shown(ne[2]) {
        for i1 in shown(ne[1]) {
            for i0 in shown(ne[0]) {
                picked.push(ours[(i2 * ne[1] + i1) * ne[0] + i0]);
            }
        }
    }
    assert_eq!(picked.len(), node.values.len(), "{name}: printed values");
    let worst = picked
        .iter()
        .zip(&node.values)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);
    // The callback sums in f32, element by element in ggml order.
    let sum = f64::from(ours.iter().sum::<f32>());
    let abs_sum: f64 = ours.iter().map(|v| f64::from(v.abs())).sum();
    let relative = (sum - node.sum).abs() / abs_sum;
    println!(
        "{name:<14} {op:<15} max |diff| {worst:.2e}  sum {sum:.6} vs {:.6} (|diff| / sum|x| {relative:.1e})",
        node.sum
    );
    assert!(worst <= tolerance.value, "{name} ({op}): max diff {worst}");
    assert!(
        relative <= tolerance.sum,
        "{name} ({op}): sum {sum} vs {}",
        node.sum
    );
}

struct Layer<'a> {
    file: &'a GgufFile,
    backend: &'a dyn Backend,
}

impl Layer<'_> {
    fn weight(&self, name: &str) -> Weight {
        common::load_weight(self.file, self.backend, name)
    }

    fn read(&self, buffer: &Buffer, len: usize) -> Vec<f32> {
        let mut out = vec![0.0; len];
        self.backend.download(buffer, &mut out).unwrap();
        out
    }
}

#[test]
fn layer_zero_matches_llama_cpp() {
    let model = golden().join("../../models/synth-qwen2-F32.gguf");
    let dump_path = golden().join("layer_dumps/synth-qwen2-F32.eval-callback.txt");
    if !model.exists() || !dump_path.exists() {
        println!("skipped: {} or its dump is absent", model.display());
        return;
    }
    let file = GgufFile::open(&model).unwrap();
    let dump = std::fs::read_to_string(&dump_path).unwrap();
    // The prompt's token ids, as the dump lists them after "number of input tokens".
    let lines: Vec<&str> = dump.lines().collect();
    let at = lines
        .iter()
        .position(|l| l.contains("number of input tokens"))
        .unwrap();
    let count: usize = lines[at].rsplit(' ').next().unwrap().parse().unwrap();
    let ids: Vec<u32> = lines[at + 1..=at + count]
        .iter()
        .map(|l| l.rsplit(' ').next().unwrap().parse().unwrap())
        .collect();
    let eps = file
        .get_f32("qwen2.attention.layer_norm_rms_epsilon")
        .unwrap();
    let theta = file.get_f32("qwen2.rope.freq_base").unwrap();
    let heads = file.get_u32("qwen2.attention.head_count").unwrap() as usize;
    let kv_heads = file.get_u32("qwen2.attention.head_count_kv").unwrap() as usize;
    let n_embd = file.get_u32("qwen2.embedding_length").unwrap() as usize;
    let n_ff = file.get_u32("qwen2.feed_forward_length").unwrap() as usize;
    let head_dim = n_embd / heads;
    let tokens = ids.len();

    for backend in [
        CpuBackend::with_simd(1, SimdLevel::Scalar).unwrap(),
        CpuBackend::new(2).unwrap(),
    ] {
        println!("simd {:?}", backend.simd());
        let b: &dyn Backend = &backend;
        let layer = Layer {
            file: &file,
            backend: b,
        };
        let kv_width = kv_heads * head_dim;
        let check2 = |name: &str, op: &str, width: usize, buffer: &Buffer, tolerance: Tolerance| {
            let values = layer.read(buffer, tokens * width);
            check(&dump, name, op, [width, tokens, 1], &values, tolerance);
        };

        let mut embd = b.alloc(tokens * n_embd).unwrap();
        b.embedding(&layer.weight("token_embd.weight"), &ids, &mut embd)
            .unwrap();
        check2("embd", "GET_ROWS", n_embd, &embd, BEFORE_ATTENTION);

        let mut norm = b.alloc(tokens * n_embd).unwrap();
        let attn_norm = layer.weight("blk.0.attn_norm.weight");
        let attn_norm = RmsNorm {
            weight: &attn_norm,
            eps,
        };
        b.rms_norm(&embd, attn_norm, tokens, &mut norm).unwrap();
        check2("attn_norm-0", "MUL", n_embd, &norm, BEFORE_ATTENTION);

        let project = |name: &str, input: &Buffer, width: usize| {
            let mut out = b.alloc(tokens * width).unwrap();
            b.matmul(
                &layer.weight(&format!("{name}.weight")),
                input,
                tokens,
                &mut out,
            )
            .unwrap();
            if file.tensor(&format!("{name}.bias")).is_some() {
                b.add_bias(&mut out, &layer.weight(&format!("{name}.bias")), tokens)
                    .unwrap();
            }
            out
        };
        let mut q = project("blk.0.attn_q", &norm, n_embd);
        check2("Qcur-0", "ADD", n_embd, &q, BEFORE_ATTENTION);
        let mut k = project("blk.0.attn_k", &norm, kv_width);
        let v = project("blk.0.attn_v", &norm, kv_width);
        let positions: Vec<u32> = (0..tokens as u32).collect();
        let rope = |heads| RopeParams {
            style: RopeStyle::Neox,
            heads,
            head_dim,
            rotary_dim: head_dim,
            theta,
            freq_scale: 1.0,
            yarn: None,
        };
        b.rope(&mut q, &positions, &rope(heads), None).unwrap();
        b.rope(&mut k, &positions, &rope(kv_heads), None).unwrap();
        let rows = layer.read(&q, tokens * n_embd);
        check(
            &dump,
            "Qcur-0",
            "ROPE",
            [head_dim, heads, tokens],
            &rows,
            BEFORE_ATTENTION,
        );
        let rows = layer.read(&k, tokens * kv_width);
        check(
            &dump,
            "Kcur-0",
            "ROPE",
            [head_dim, kv_heads, tokens],
            &rows,
            BEFORE_ATTENTION,
        );

        let mut k_cache = b
            .alloc_kv(
                64,
                kv_width,
                head_dim,
                KvType::F16,
                runit_backend::KvRole::Keys,
            )
            .unwrap();
        let mut v_cache = b
            .alloc_kv(
                64,
                kv_width,
                head_dim,
                KvType::F16,
                runit_backend::KvRole::Values,
            )
            .unwrap();
        let spans = [SequenceSpan {
            first_row: 0,
            rows: tokens,
            start_position: 0,
            block_table: vec![2, 0],
            block_size: 16,
        }];
        b.kv_write(KvWrite {
            k: &k,
            v: &v,
            k_cache: &mut k_cache,
            v_cache: &mut v_cache,
            spans: &spans,
        })
        .unwrap();
        let params = AttentionParams {
            heads,
            kv_heads,
            head_dim,
            scale: 1.0 / (head_dim as f32).sqrt(),
            sliding_window: None,
        };
        let mut attention = b.alloc(tokens * n_embd).unwrap();
        let attend = Attention {
            q: &q,
            k_cache: &k_cache,
            v_cache: &v_cache,
            spans: &spans,
            params: &params,
        };
        b.attention(&attend, &mut attention).unwrap();
        let rows = layer.read(&attention, tokens * n_embd);
        check(
            &dump,
            "node_24",
            "FLASH_ATTN_EXT",
            [head_dim, heads, tokens],
            &rows,
            AFTER_ATTENTION,
        );

        let mut residual = project("blk.0.attn_output", &attention, n_embd);
        check2("node_26", "MUL_MAT", n_embd, &residual, AFTER_ATTENTION);
        b.add(&mut residual, &embd, tokens * n_embd).unwrap();
        check2("ffn_inp-0", "ADD", n_embd, &residual, AFTER_ATTENTION);
        let ffn_norm = layer.weight("blk.0.ffn_norm.weight");
        let ffn_norm = RmsNorm {
            weight: &ffn_norm,
            eps,
        };
        b.rms_norm(&residual, ffn_norm, tokens, &mut norm).unwrap();
        let mut gate = project("blk.0.ffn_gate", &norm, n_ff);
        let up = project("blk.0.ffn_up", &norm, n_ff);
        check2("ffn_norm-0", "MUL", n_embd, &norm, AFTER_ATTENTION);
        check2("ffn_gate-0", "MUL_MAT", n_ff, &gate, AFTER_ATTENTION);
        check2("ffn_up-0", "MUL_MAT", n_ff, &up, AFTER_ATTENTION);
        b.gated_activation(Activation::Silu, &mut gate, &up, tokens * n_ff)
            .unwrap();
        check2("ffn_swiglu-0", "SWIGLU", n_ff, &gate, AFTER_ATTENTION);
        let mut out = project("blk.0.ffn_down", &gate, n_embd);
        check2("ffn_out-0", "MUL_MAT", n_embd, &out, AFTER_ATTENTION);
        b.add(&mut out, &residual, tokens * n_embd).unwrap();
        check2("l_out-0", "ADD", n_embd, &out, AFTER_ATTENTION);
    }
}
