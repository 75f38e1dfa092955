//! End to end on the GPU: a tiny synthetic model (`synth-qwen2-Q8_0.gguf`: 2 layers, 4
//! query heads of 64 over 2 KV heads, so every TurboQuant path runs with GQA) generates the
//! same greedy tokens with TurboQuant caches (tq4, the `--tq` pair, tq3) on CUDA as on the
//! CPU, for a short prompt and one longer than a chunk of 512 keys.
//!
//! The CUDA side runs with exact numerics (`CudaBackend::with_exact_numerics`): its matmuls,
//! norms, RoPE and the f16-cache pass that measures the model's mean key
//! (`Device::center_keys`) then compute the CPU's float operations, and the TurboQuant
//! kernels repeat the CPU's scalar twins in either mode, so the comparison is like for like.
//! With the fast kernels a last-bit difference upstream can move a key across a code
//! boundary, and one such code moved step 0's log-probability at tq4/tq4 by 0.059 on the
//! H200 (session 32). The checks stay those of `fidelity.rs`: the tokens must be equal up to
//! a step where the CPU's top-2 log-probability gap is below 0.01 (that prompt's comparison
//! stops there), and at every matched step the chosen token's log-probability must be within
//! 0.02 of the CPU's.
//!
//! Without a CUDA device the test prints a notice and passes, unless `RUNIT_REQUIRE_GPU=1`;
//! the model is looked for in `RUNIT_MODEL_DIR`, then `models/`.

mod common;

use std::sync::Arc;

use runit_backend::{KvType, KvTypes};
use runit_engine::sampler::{argmax, log_softmax};
use runit_engine::{EngineConfig, Session};
use runit_model::Model;

const MODEL: &str = "synth-qwen2-Q8_0.gguf";
const NEAR_TIE: f64 = 0.01;
const LOGPROB_TOLERANCE: f64 = 0.02;
/// Greedy steps generated after each prompt.
const STEPS: usize = 24;

fn require_gpu() -> bool {
    std::env::var("RUNIT_REQUIRE_GPU").is_ok_and(|v| v == "1")
}

fn load(path: &std::path::Path, backend: Arc<dyn runit_backend::Backend>) -> Arc<Model> {
    let file = Arc::new(runit_gguf::GgufFile::open(path).expect("model opens"));
    Arc::new(Model::load(file, backend).expect("model loads"))
}

/// A prompt of `len` token ids spread over the vocabulary.
fn prompt(len: usize, vocab: usize) -> Vec<u32> {
    (0..len)
        .map(|i| ((i * 7919 + 13) % (vocab - 3) + 3) as u32)
        .collect()
}

/// How one prompt's comparison ended.
#[derive(Debug, PartialEq)]
enum Outcome {
    Matched,
    NearTie { step: usize },
}

/// Greedy decoding of `prompt` on both models in lockstep; returns how it ended, the steps
/// compared and the largest log-probability difference.
fn compare(
    cpu: &Arc<Model>,
    cuda: &Arc<Model>,
    types: KvTypes,
    prompt: &[u32],
) -> (Outcome, usize, f64) {
    let config = EngineConfig {
        context_size: 2048,
        kv_types: types,
        ..Default::default()
    };
    let mut sessions = [
        Session::new(cpu.clone(), &config).expect("cpu session"),
        Session::new(cuda.clone(), &config).expect("cuda session"),
    ];
    let mut logits: Vec<Vec<f32>> = sessions
        .iter_mut()
        .map(|s| s.eval(prompt, false, None).expect("prompt").to_vec())
        .collect();
    let mut max_error = 0.0f64;
    for step in 0..STEPS {
        let (want, got) = (argmax(&logits[0]), argmax(&logits[1]));
        let expected = log_softmax(&logits[0]);
        if want != got {
            let mut sorted = expected.clone();
            sorted.sort_by(|a, b| b.total_cmp(a));
            let gap = sorted[0] - sorted[1];
            assert!(
                gap < NEAR_TIE,
                "{types} step {step}: cuda picked {got}, the cpu {want} (top-2 gap {gap:.4})"
            );
            return (Outcome::NearTie { step }, step, max_error);
        }
        let error = (log_softmax(&logits[1])[got as usize] - expected[want as usize]).abs();
        max_error = max_error.max(error);
        assert!(
            error <= LOGPROB_TOLERANCE,
            "{types} step {step}: log-probability of {want} differs by {error:.4}"
        );
        if step + 1 < STEPS {
            for (session, logits) in sessions.iter_mut().zip(logits.iter_mut()) {
                *logits = session.eval(&[want], false, None).expect("decode").to_vec();
            }
        }
    }
    (Outcome::Matched, STEPS, max_error)
}

#[test]
fn turbo_quant_caches_generate_the_cpus_greedy_tokens_on_cuda() {
    let cuda = match runit_backend_cuda::CudaBackend::new(0) {
        Ok(cuda) => cuda.with_exact_numerics(true),
        Err(error) => {
            assert!(!require_gpu(), "RUNIT_REQUIRE_GPU=1 but: {error}");
            println!("NOTICE: no CUDA device, TurboQuant end-to-end test not run: {error}");
            return;
        }
    };
    let Some(path) = common::find_model(MODEL) else {
        assert!(
            !require_gpu(),
            "RUNIT_REQUIRE_GPU=1 but {MODEL} is not in RUNIT_MODEL_DIR or models/"
        );
        println!("NOTICE: {MODEL} not found, TurboQuant end-to-end test not run");
        return;
    };
    let cpu = load(
        &path,
        Arc::new(runit_backend_cpu::CpuBackend::new(2).expect("cpu backend")),
    );
    let cuda = load(&path, Arc::new(cuda));
    let vocab = cpu.config.vocab_size;
    let both = |ty| KvTypes {
        keys: ty,
        values: ty,
    };
    let mut compared = 0;
    for types in [
        both(KvType::Tq4),
        KvTypes {
            keys: KvType::Tq4,
            values: KvType::Tq3,
        },
        both(KvType::Tq3),
    ] {
        for len in [12, 700] {
            let (outcome, steps, error) = compare(&cpu, &cuda, types, &prompt(len, vocab));
            println!(
                "{types}, prompt of {len}: {outcome:?}, {steps} steps, max |dlogprob| {error:.5}"
            );
            compared += steps;
        }
    }
    assert!(compared > 0, "every prompt stopped at a near-tie at once");
}
