//! Gemma 3 270M's prompt pass, node by node, against llama.cpp's `llama-eval-callback` dump
//! of the same prompt (golden `layer_dumps/`): every layer's norms, Q/K/V after their norms and
//! after RoPE, attention, residual sums (after the post-norms), GeGLU, FFN output and layer
//! output, and the logits, at every value the dump prints (4 decimals). A divergence names
//! the first node that differs.

mod common;

use std::collections::HashMap;

use runit_engine::{EngineConfig, Session};
use runit_model::LayerObserver;

/// One dumped node: its extents (ggml order) and the values printed at its corners.
struct Node {
    extents: Vec<usize>,
    values: Vec<f32>,
}

/// The dump's input tokens and its nodes by `name|OP` (the first node of each).
fn parse(dump: &str) -> (Vec<u32>, HashMap<String, Node>) {
    let lines: Vec<&str> = dump.lines().collect();
    let count_at = lines
        .iter()
        .position(|line| line.contains("number of input tokens = "))
        .expect("the token count");
    let count: usize = lines[count_at]
        .rsplit(' ')
        .next()
        .and_then(|n| n.parse().ok())
        .expect("a count");
    let tokens = lines[count_at + 1..=count_at + count]
        .iter()
        .map(|line| {
            line.rsplit(' ')
                .next()
                .and_then(|t| t.parse().ok())
                .expect("an id")
        })
        .collect();
    let mut nodes = HashMap::new();
    for (at, line) in lines.iter().enumerate() {
        let Some(rest) = line.strip_prefix("common_debug_cb_eval:") else {
            continue;
        };
        let (name, rest) = rest.split_once(" = (").expect("name = (type)");
        let op = rest
            .split_once(')')
            .map(|(_, op)| op.trim_start().split('(').next().unwrap_or(""))
            .expect("an op");
        let extents: Vec<usize> = rest
            .rsplit_once("= {")
            .and_then(|(_, e)| e.strip_suffix('}'))
            .expect("extents")
            .split(',')
            .map(|e| e.trim().parse().expect("an extent"))
            .collect();
        let mut values = Vec::new();
        for value_line in &lines[at + 1..] {
            if value_line.trim().starts_with("sum =") {
                break;
            }
            values.extend(
                value_line
                    .split([',', '[', ']', ' '])
                    .filter_map(|word| word.parse::<f32>().ok()),
            );
        }
        nodes
            .entry(format!("{}|{op}", name.trim()))
            .or_insert(Node { extents, values });
    }
    (tokens, nodes)
}

/// Indices ggml's print shows along an extent of `n`.
fn shown(n: usize) -> Vec<usize> {
    if n > 6 {
        vec![0, 1, 2, n - 3, n - 2, n - 1]
    } else {
        (0..n).collect()
    }
}

#[derive(Default)]
struct Capture(HashMap<String, Vec<f32>>);

impl LayerObserver for Capture {
    fn observe(&mut self, name: &str, _rows: usize, _width: usize, data: &[f32]) {
        self.0.insert(name.to_string(), data.to_vec());
    }
}

#[test]
fn gemma3_prompt_pass_matches_llama_cpp_node_by_node() {
    let Some(path) = common::find_model("gemma-3-270m-q4_k_m.gguf") else {
        eprintln!("skipping: gemma-3-270m-q4_k_m.gguf not found");
        return;
    };
    let dump = std::fs::read_to_string(
        common::golden_dir().join("layer_dumps/gemma-3-270m-q4_k_m.eval-callback.txt"),
    )
    .expect("the Gemma 3 dump");
    let (tokens, golden) = parse(&dump);
    let model = common::load(&path, 2);
    let layers = model.config.block_count;
    let config = EngineConfig {
        context_size: 512,
        ..EngineConfig::default()
    };
    let mut session = Session::new(model, &config).expect("session");
    let mut capture = Capture::default();
    session
        .eval(&tokens, false, Some(&mut capture))
        .expect("prompt pass");
    // Our node, llama.cpp's node (`name|OP`).
    let mut pairs = vec![("embd".to_string(), "embd|GET_ROWS".to_string())];
    for l in 0..layers {
        for (ours, theirs) in [
            ("attn_norm", "attn_norm|MUL"),
            ("Qcur", "Qcur_normed|MUL"),
            ("Kcur", "Kcur_normed|MUL"),
            ("Vcur", "Vcur|MUL_MAT"),
            ("Qrope", "Qcur|ROPE"),
            ("Krope", "Kcur|ROPE"),
            ("kqv_out", "kqv_out|RESHAPE"),
            ("ffn_inp", "sa_out|ADD"),
            ("ffn_norm", "ffn_norm|MUL"),
            ("ffn_swiglu", "ffn_geglu|GEGLU"),
            ("ffn_out", "ffn_out|MUL_MAT"),
            ("l_out", "l_out|ADD"),
        ] {
            let (name, op) = theirs.split_once('|').expect("name|OP");
            pairs.push((format!("{ours}-{l}"), format!("{name}-{l}|{op}")));
        }
    }
    pairs.push(("result_output".into(), "result_output|MUL_MAT".into()));
    for (ours, theirs) in &pairs {
        let node = golden
            .get(theirs)
            .unwrap_or_else(|| panic!("{theirs} is not in the dump"));
        let data = capture
            .0
            .get(ours)
            .unwrap_or_else(|| panic!("{ours} was not observed"));
        let e = &node.extents;
        let mut printed = node.values.iter();
        for i2 in shown(e[2]) {
            for i1 in shown(e[1]) {
                for i0 in shown(e[0]) {
                    let want = *printed.next().expect("a printed value");
                    let got = data[i0 + e[0] * (i1 + e[1] * i2)];
                    // Printed to 4 decimals.
                    let tolerance = 5.1e-5 + 1e-7 * want.abs();
                    assert!(
                        (got - want).abs() <= tolerance,
                        "{ours} ({theirs}) at [{i0}, {i1}, {i2}]: {got} vs llama.cpp {want}"
                    );
                }
            }
        }
    }
    println!("{} nodes match llama.cpp's dump", pairs.len());
}
