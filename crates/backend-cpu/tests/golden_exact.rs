//! Bit-level agreement with llama.cpp's CPU build: layers 0 and 1 of
//! `SmolLM2-135M-Instruct.Q4_1.gguf` run op by op on the CPU backend, and the f32 sum of every
//! node (what `llama-eval-callback` prints, 6 decimals) must equal the golden dump's
//! (`layer_dumps/SmolLM2-135M-Instruct.Q4_1.eval-callback.txt`) exactly, from the RMS norm
//! through RoPE, flash attention over the f16 cache, SwiGLU and the residual adds. The model
//! has huge activations, so a single ulp anywhere upstream flips a Q8_1 rounding and shows in
//! these sums: equality here means the kernels reproduce ggml's arithmetic.

use std::path::PathBuf;

mod common;

use runit_backend::{
    Activation, Attention, AttentionParams, Backend, Buffer, Device, KvType, KvWrite, PrimitiveOps,
    RmsNorm, RopeParams, RopeStyle, SequenceSpan, Weight,
};
use runit_backend_cpu::{CpuBackend, SimdLevel};
use runit_gguf::GgufFile;

fn workspace() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
}

/// The printed sum (as text) of the first node called `name` made by `op`.
fn golden_sum(dump: &str, name: &str, op: &str) -> String {
    let mut lines = dump.lines();
    lines
        .by_ref()
        .find(|line| {
            line.strip_prefix("common_debug_cb_eval:")
                .is_some_and(|rest| {
                    rest.split(" = ").next().map(str::trim) == Some(name)
                        && rest.contains(&format!(" {op}("))
                })
        })
        .unwrap_or_else(|| panic!("node {name} ({op}) is not in the dump"));
    lines
        .find_map(|line| line.trim().strip_prefix("sum = "))
        .unwrap_or_else(|| panic!("node {name} has no sum"))
        .to_string()
}

/// The prompt's token ids, listed in the dump after "number of input tokens".
fn prompt_ids(dump: &str) -> Vec<u32> {
    let lines: Vec<&str> = dump.lines().collect();
    let at = lines
        .iter()
        .position(|l| l.contains("number of input tokens"))
        .expect("token count line");
    let count: usize = lines[at].rsplit(' ').next().unwrap().parse().unwrap();
    lines[at + 1..=at + count]
        .iter()
        .map(|l| l.rsplit(' ').next().unwrap().parse().unwrap())
        .collect()
}

struct Run<'a> {
    file: &'a GgufFile,
    backend: &'a CpuBackend,
    dump: &'a str,
    tokens: usize,
    mismatches: Vec<String>,
}

impl Run<'_> {
    fn weight(&self, name: &str) -> Weight {
        common::load_weight(self.file, self.backend, name)
    }

    fn alloc(&self, width: usize) -> Buffer {
        self.backend.alloc(self.tokens * width).unwrap()
    }

    /// Compares the f32 sum of `buffer` (ggml order) with the dump, to the printed digits.
    fn check(&mut self, name: &str, op: &str, buffer: &Buffer, width: usize) {
        let mut values = vec![0.0f32; self.tokens * width];
        self.backend.download(buffer, &mut values).unwrap();
        let ours = format!("{:.6}", f64::from(values.iter().sum::<f32>()));
        let golden = golden_sum(self.dump, name, op);
        println!("{name:<14} {op:<9} ours {ours:>14} llama.cpp {golden:>14}");
        if ours != golden {
            self.mismatches
                .push(format!("{name} ({op}): {ours} vs {golden}"));
        }
    }

    fn matmul(&self, name: &str, x: &Buffer, width: usize) -> Buffer {
        let mut out = self.alloc(width);
        self.backend
            .matmul(&self.weight(name), x, self.tokens, &mut out)
            .unwrap();
        out
    }
}

fn check_smollm2(backend: &CpuBackend) -> Vec<String> {
    let model = workspace().join("models/SmolLM2-135M-Instruct.Q4_1.gguf");
    let dump_path =
        workspace().join("tests/golden/layer_dumps/SmolLM2-135M-Instruct.Q4_1.eval-callback.txt");
    if !model.exists() || !dump_path.exists() {
        println!("skipped: {} or its dump is absent", model.display());
        return Vec::new();
    }
    let file = GgufFile::open(&model).unwrap();
    let dump = std::fs::read_to_string(&dump_path).unwrap();
    let ids = prompt_ids(&dump);
    let eps = file
        .get_f32("llama.attention.layer_norm_rms_epsilon")
        .unwrap();
    let theta = file.get_f32("llama.rope.freq_base").unwrap();
    let heads = file.get_u32("llama.attention.head_count").unwrap() as usize;
    let kv_heads = file.get_u32("llama.attention.head_count_kv").unwrap() as usize;
    let n_embd = file.get_u32("llama.embedding_length").unwrap() as usize;
    let n_ff = file.get_u32("llama.feed_forward_length").unwrap() as usize;
    let head_dim = n_embd / heads;
    let kv_width = kv_heads * head_dim;
    let tokens = ids.len();
    let mut run = Run {
        file: &file,
        backend,
        dump: &dump,
        tokens,
        mismatches: Vec::new(),
    };
    let b: &dyn Backend = backend;
    let mut x = run.alloc(n_embd);
    b.embedding(&run.weight("token_embd.weight"), &ids, &mut x)
        .unwrap();
    run.check("embd", "GET_ROWS", &x, n_embd);
    let positions: Vec<u32> = (0..tokens as u32).collect();
    let rope = |heads| RopeParams {
        style: RopeStyle::Normal,
        heads,
        head_dim,
        rotary_dim: head_dim,
        theta,
        freq_scale: 1.0,
        yarn: None,
    };
    let spans = [SequenceSpan {
        first_row: 0,
        rows: tokens,
        start_position: 0,
        block_table: vec![1, 0],
        block_size: 16,
    }];
    let attention = AttentionParams {
        heads,
        kv_heads,
        head_dim,
        scale: 1.0 / (head_dim as f32).sqrt(),
        sliding_window: None,
    };
    let mut normed = run.alloc(n_embd);
    for layer in 0..2 {
        let w = |name: &str| format!("blk.{layer}.{name}.weight");
        let node = |name: &str| format!("{name}-{layer}");
        let attn_norm = run.weight(&w("attn_norm"));
        let attn_norm = RmsNorm {
            weight: &attn_norm,
            eps,
        };
        b.rms_norm(&x, attn_norm, tokens, &mut normed).unwrap();
        run.check(&node("attn_norm"), "MUL", &normed, n_embd);
        let mut q = run.matmul(&w("attn_q"), &normed, n_embd);
        let mut k = run.matmul(&w("attn_k"), &normed, kv_width);
        let v = run.matmul(&w("attn_v"), &normed, kv_width);
        run.check(&node("Qcur"), "MUL_MAT", &q, n_embd);
        run.check(&node("Kcur"), "MUL_MAT", &k, kv_width);
        run.check(&node("Vcur"), "MUL_MAT", &v, kv_width);
        b.rope(&mut q, &positions, &rope(heads), None).unwrap();
        b.rope(&mut k, &positions, &rope(kv_heads), None).unwrap();
        run.check(&node("Qcur"), "ROPE", &q, n_embd);
        run.check(&node("Kcur"), "ROPE", &k, kv_width);
        let mut k_cache = b
            .alloc_kv(
                32,
                kv_width,
                head_dim,
                KvType::F16,
                runit_backend::KvRole::Keys,
            )
            .unwrap();
        let mut v_cache = b
            .alloc_kv(
                32,
                kv_width,
                head_dim,
                KvType::F16,
                runit_backend::KvRole::Values,
            )
            .unwrap();
        b.kv_write(KvWrite {
            k: &k,
            v: &v,
            k_cache: &mut k_cache,
            v_cache: &mut v_cache,
            spans: &spans,
        })
        .unwrap();
        let mut attended = run.alloc(n_embd);
        let attend = Attention {
            q: &q,
            k_cache: &k_cache,
            v_cache: &v_cache,
            spans: &spans,
            params: &attention,
        };
        b.attention(&attend, &mut attended).unwrap();
        run.check(&node("kqv_out"), "RESHAPE", &attended, n_embd);
        let projected = run.matmul(&w("attn_output"), &attended, n_embd);
        run.check(&node("attn_out"), "MUL_MAT", &projected, n_embd);
        b.add(&mut x, &projected, tokens * n_embd).unwrap();
        run.check(&node("ffn_inp"), "ADD", &x, n_embd);
        let ffn_norm = run.weight(&w("ffn_norm"));
        let ffn_norm = RmsNorm {
            weight: &ffn_norm,
            eps,
        };
        b.rms_norm(&x, ffn_norm, tokens, &mut normed).unwrap();
        run.check(&node("ffn_norm"), "MUL", &normed, n_embd);
        let mut gate = run.matmul(&w("ffn_gate"), &normed, n_ff);
        let up = run.matmul(&w("ffn_up"), &normed, n_ff);
        run.check(&node("ffn_gate"), "MUL_MAT", &gate, n_ff);
        run.check(&node("ffn_up"), "MUL_MAT", &up, n_ff);
        b.gated_activation(Activation::Silu, &mut gate, &up, tokens * n_ff)
            .unwrap();
        run.check(&node("ffn_swiglu"), "SWIGLU", &gate, n_ff);
        let down = run.matmul(&w("ffn_down"), &gate, n_embd);
        run.check(&node("ffn_out"), "MUL_MAT", &down, n_embd);
        b.add(&mut x, &down, tokens * n_embd).unwrap();
        run.check(&node("l_out"), "ADD", &x, n_embd);
    }
    run.mismatches
}

#[test]
fn smollm2_layers_0_and_1_are_bit_exact() {
    for backend in [
        CpuBackend::new(2).unwrap(),
        CpuBackend::with_simd(1, SimdLevel::Scalar).unwrap(),
    ] {
        println!("simd {:?}", backend.simd());
        let mismatches = check_smollm2(&backend);
        assert!(
            mismatches.is_empty(),
            "{} node sums differ from llama.cpp's:\n{}",
            mismatches.len(),
            mismatches.join("\n")
        );
    }
}
