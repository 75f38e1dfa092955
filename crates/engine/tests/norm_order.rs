//! The decoder's two orders of a layer's residual adds and norms give the same values: the
//! add-and-norm order (`FusedOps::add_rms_norm` between the blocks) and the order a backend
//! asks for with `FusedOps::norms_in_matmuls` (each norm inside the op that reads it, each add
//! inside the op that makes the addend). On the CPU both run the same primitive ops, so a
//! prompt in several chunks (some passes without logits) and the greedy tokens after it must
//! agree to the last bit of every log-probability; a model the second order does not fit
//! (post-norms, experts) keeps the first.

mod common;

use std::sync::Arc;

use runit_backend::FusedOps;
use runit_backend_cpu::CpuBackend;
use runit_backend_wgpu::WgpuBackend;
use runit_engine::{generate, EngineConfig, GenerateParams, Sampler, SamplerParams, Session};
use runit_model::Model;

/// A generated token, the bits of its log-probability, and its top 5 (ids and bits).
type Seen = (u32, u64, Vec<(u32, u64)>);

/// Tokens, log-probabilities and top-5 lists of a greedy run: a 41-token prompt in chunks of
/// 16, then 12 tokens.
fn run(model: Arc<Model>) -> Vec<Seen> {
    let config = EngineConfig {
        context_size: 256,
        batch_size: 16,
        ..Default::default()
    };
    let vocab = model.config.vocab_size;
    let prompt: Vec<u32> = (0..41)
        .map(|i| ((i * 7919 + 13) % (vocab - 1)) as u32 + 1)
        .collect();
    let mut session = Session::new(model, &config).expect("session");
    let mut sampler = Sampler::new(SamplerParams::greedy()).expect("sampler");
    let params = GenerateParams {
        max_tokens: 12,
        end_of_generation: Vec::new(),
        top_logprobs: 5,
    };
    let mut seen = Vec::new();
    generate(&mut session, &mut sampler, &prompt, &params, |token| {
        let top = token.top.iter().map(|&(id, p)| (id, p.to_bits())).collect();
        seen.push((token.id, token.logprob.to_bits(), top));
        true
    })
    .expect("generate");
    seen
}

fn load(path: &std::path::Path, in_matmuls: bool) -> Arc<Model> {
    let file = Arc::new(runit_gguf::GgufFile::open(path).expect("model opens"));
    let backend = CpuBackend::new(2)
        .expect("cpu backend")
        .with_norms_in_matmuls(in_matmuls);
    Arc::new(Model::load(file, Arc::new(backend)).expect("model loads"))
}

/// The model on wgpu adapter 0 with several weights a matrix-vector dispatch, the backend as
/// `configure` makes it, and the backend.
fn load_wgpu_with(
    path: &std::path::Path,
    configure: impl Fn(WgpuBackend) -> WgpuBackend,
) -> Option<(Arc<Model>, Arc<WgpuBackend>)> {
    let file = Arc::new(runit_gguf::GgufFile::open(path).expect("model opens"));
    let backend = match WgpuBackend::new(0) {
        Ok(backend) => backend.with_matvec_parts(),
        Err(error) => {
            let required = std::env::var("RUNIT_REQUIRE_WGPU").is_ok_and(|v| v == "1");
            assert!(!required, "RUNIT_REQUIRE_WGPU=1 but: {error}");
            eprintln!("NOTICE: no wgpu adapter: {error}");
            return None;
        }
    };
    let backend = Arc::new(configure(backend));
    let model = Model::load(file, Arc::clone(&backend) as _).expect("model loads");
    Some((Arc::new(model), backend))
}

#[test]
fn both_orders_of_adds_and_norms_agree_bit_for_bit() {
    let names = [
        "SmolLM2-135M-Instruct.Q4_1.gguf",
        "synth-qwen2-Q8_0.gguf",
        "synth-llama-Q4_K.gguf",
        "synth-qwen3-Q8_0.gguf",
        "synth-olmoe-Q8_0.gguf",
        "gemma-3-270m-q4_k_m.gguf",
    ];
    let mut ran = 0;
    for name in names {
        let Some(path) = common::find_model(name) else {
            eprintln!("skipping {name}: not found");
            continue;
        };
        let first = run(load(&path, false));
        let second = run(load(&path, true));
        assert_eq!(first.len(), 12, "{name}");
        assert_eq!(first, second, "{name}: the two orders differ");
        println!("{name}: 12 tokens, log-probabilities equal bit for bit");
        ran += 1;
    }
    assert!(ran > 0, "no model found (scripts/fetch_models.py)");
}

/// The two wgpu backends `plain` and `fused` make of adapter 0 give every model of the list
/// the same tokens and log-probabilities, `fused` with fewer dispatches. `None` without an
/// adapter.
fn wgpu_fusion_changes_nothing(
    plain: impl Fn(WgpuBackend) -> WgpuBackend,
    fused: impl Fn(WgpuBackend) -> WgpuBackend,
) -> Option<()> {
    for name in ["SmolLM2-135M-Instruct.Q4_1.gguf", "synth-qwen2-Q8_0.gguf"] {
        let Some(path) = common::find_model(name) else {
            eprintln!("skipping {name}: not found");
            continue;
        };
        let (first, first_gpu) = load_wgpu_with(&path, &plain)?;
        let (second, second_gpu) = load_wgpu_with(&path, &fused)?;
        let before = [
            first_gpu.counts().dispatches,
            second_gpu.counts().dispatches,
        ];
        assert_eq!(run(first), run(second), "{name}: the fused run differs");
        let used = [
            first_gpu.counts().dispatches - before[0],
            second_gpu.counts().dispatches - before[1],
        ];
        assert!(used[1] < used[0], "{name}: dispatches {used:?}");
        println!(
            "{name}: equal bit for bit, dispatches {} and {}",
            used[0], used[1]
        );
    }
    Some(())
}

/// On wgpu the second order runs other kernels (the norms inside the matrix-vector
/// dispatches, the adds in their epilogues), which must give the first order's values.
#[test]
fn wgpu_norm_prologues_change_no_token_or_logprob() {
    let prologues = |b: WgpuBackend| {
        let b = b.with_norm_prologue_max(8192).with_gated_prologue_max(8192);
        assert!(
            b.norms_in_matmuls(576),
            "wgpu takes the norms into its matmuls"
        );
        b
    };
    wgpu_fusion_changes_nothing(|b| b.with_norm_prologue_max(0), prologues);
}

/// RoPE and the cache write in the Q/K/V dispatch's epilogue (`RUNIT_WGPU_ROPE_EPILOGUE=1`,
/// the add-and-norm order) change no token or log-probability, with fewer dispatches.
#[test]
fn wgpu_rope_epilogue_changes_no_token_or_logprob() {
    wgpu_fusion_changes_nothing(|b| b, |b| b.with_rope_epilogue(true));
}
