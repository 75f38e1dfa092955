//! Prefix caching changes no number: greedy tokens and log-probabilities of prompts that
//! reuse cached blocks equal those of the same prompts without the cache (bit for bit on the
//! CPU) and evaluated alone, whichever attention path their chunks take, while blocks are shared,
//! evicted and returned; and the hits are counted.

mod common;

use std::sync::mpsc::{channel, Receiver};
use std::sync::Arc;
use std::time::Duration;

use runit_backend::{KvType, KvTypes};
use runit_engine::scheduler::{Request, Scheduler, SequenceEvent};
use runit_engine::{generate, EngineConfig, GenerateParams, Sampler, Session};
use runit_model::Model;

/// Prompt tokens per prefill chunk: small, so that prompts of a few hundred tokens have
/// full chunks, tiled last chunks (64 rows or more) and one-chunk last chunks.
const CHUNK: usize = 128;
const MAX_TOKENS: usize = 6;

fn model(name: &str) -> Option<Arc<Model>> {
    match common::find_model(name) {
        Some(path) => Some(common::load(&path, 2)),
        None => {
            eprintln!("skipping: {name} not found");
            None
        }
    }
}

/// `len` token ids from `seed`, below `vocab`.
fn tokens(vocab: usize, seed: usize, len: usize) -> Vec<u32> {
    (0..len)
        .map(|i| ((i * 7919 + seed * 104_729 + 13) % (vocab - 1)) as u32 + 1)
        .collect()
}

/// Greedy (token, log-probability) pairs of `prompt` evaluated alone (`generate` reports
/// f32 log-probabilities, the scheduler exact ones: compare the tokens).
fn alone(model: &Arc<Model>, prompt: &[u32], kv_types: KvTypes) -> Vec<(u32, f64)> {
    let config = EngineConfig {
        context_size: 1024,
        batch_size: CHUNK,
        kv_types,
        ..Default::default()
    };
    let mut session = Session::new(Arc::clone(model), &config).expect("session");
    let mut sampler = Sampler::new(Request::greedy(Vec::new(), 1).sampling).expect("sampler");
    let params = GenerateParams {
        max_tokens: MAX_TOKENS,
        end_of_generation: Vec::new(),
        top_logprobs: 0,
    };
    let mut out = Vec::new();
    generate(&mut session, &mut sampler, prompt, &params, |token| {
        out.push((token.id, token.logprob));
        true
    })
    .expect("generate");
    out
}

fn submit(scheduler: &Scheduler, prompt: &[u32]) -> Receiver<SequenceEvent> {
    let (sender, receiver) = channel();
    scheduler
        .submit(
            Request::greedy(prompt.to_vec(), MAX_TOKENS),
            Box::new(sender),
        )
        .expect("submit");
    receiver
}

fn collect(receiver: &Receiver<SequenceEvent>) -> Vec<(u32, f64)> {
    let mut out = Vec::new();
    loop {
        match receiver
            .recv_timeout(Duration::from_secs(120))
            .expect("event")
        {
            SequenceEvent::Token(token) => out.push((token.id, token.logprob)),
            SequenceEvent::Finished { .. } => return out,
            SequenceEvent::Failed(message) => panic!("sequence failed: {message}"),
        }
    }
}

fn scheduler(
    model: &Arc<Model>,
    context_size: usize,
    prefix_cache: bool,
    kv_types: KvTypes,
) -> Scheduler {
    Scheduler::start(
        Arc::clone(model),
        &EngineConfig {
            context_size,
            batch_size: CHUNK,
            max_sequences: 4,
            prefix_cache,
            kv_types,
            ..Default::default()
        },
    )
    .expect("scheduler")
}

/// Prompts that share a 200-token beginning, cut so that reuse meets every case: a tiled
/// last chunk (B: 109 rows, reuse shortened to leave a 64-row-or-more span), a one-chunk last
/// chunk whose class differs from the cached blocks (C), the same prompt again (A twice), a
/// prefix ending on a block boundary (D) and one ending inside a full chunk (E).
fn shared_prefix_prompts(vocab: usize) -> Vec<Vec<u32>> {
    let prefix = tokens(vocab, 1, 200);
    let with = |len: usize, seed: usize, tail: usize| {
        let mut prompt = prefix[..len].to_vec();
        prompt.extend(tokens(vocab, seed, tail));
        prompt
    };
    vec![
        with(200, 2, 20),
        with(200, 3, 37),
        with(150, 4, 3),
        with(200, 2, 20),
        prefix[..192].to_vec(),
        with(200, 5, 230),
    ]
}

/// Runs `prompts` one after another (so each finds what the earlier ones cached) and checks
/// each against its lone run (tokens) and a scheduler without the cache (tokens and
/// log-probabilities, bit for bit); returns the prompt tokens the cache supplied and the
/// blocks it evicted.
fn check_sequential(
    name: &str,
    context_size: usize,
    prompts: &[Vec<u32>],
    kv_types: KvTypes,
) -> Option<(u64, u64)> {
    let model = model(name)?;
    let scheduler = scheduler(&model, context_size, true, kv_types);
    let uncached = self::scheduler(&model, context_size, false, kv_types);
    let total = scheduler.stats().total_blocks;
    for (i, prompt) in prompts.iter().enumerate() {
        let lone: Vec<u32> = alone(&model, prompt, kv_types)
            .iter()
            .map(|&(id, _)| id)
            .collect();
        let expected = collect(&submit(&uncached, prompt));
        let got = collect(&submit(&scheduler, prompt));
        assert_eq!(got.len(), MAX_TOKENS);
        let ids: Vec<u32> = got.iter().map(|&(id, _)| id).collect();
        assert_eq!(ids, lone, "{name}: prompt {i} against its lone run");
        for (step, (got, expected)) in got.iter().zip(&expected).enumerate() {
            assert_eq!(got.0, expected.0, "{name}: prompt {i}, token {step}");
            assert_eq!(
                got.1.to_bits(),
                expected.1.to_bits(),
                "{name}: prompt {i}, token {step}: log-probability {} against {}",
                got.1,
                expected.1
            );
        }
        assert!(scheduler.wait_idle(Duration::from_secs(30)));
        assert_eq!(scheduler.stats().free_blocks, total, "no block leaks");
    }
    let metrics = scheduler.metrics();
    let prompt_tokens: usize = prompts.iter().map(Vec::len).sum();
    assert_eq!(metrics.prompt_tokens, prompt_tokens as u64);
    assert_eq!(
        metrics.prefix_hit_tokens + metrics.prefix_miss_tokens,
        metrics.prompt_tokens
    );
    assert_eq!(
        metrics.generated_tokens,
        (prompts.len() * MAX_TOKENS) as u64
    );
    Some((metrics.prefix_hit_tokens, metrics.evicted_blocks))
}

#[test]
fn reused_prefixes_give_the_lone_numbers_smollm2() {
    let name = "SmolLM2-135M-Instruct.Q4_1.gguf";
    let Some(vocab) = model(name).map(|m| m.config.vocab_size) else {
        return;
    };
    let prompts = shared_prefix_prompts(vocab);
    let (hits, evicted) =
        check_sequential(name, 1024, &prompts, KvTypes::default()).expect("model found");
    assert_eq!(evicted, 0);
    // A: none. B: 12 blocks match, 10 kept (a 77-row span of its 109-row last chunk). C: 8
    // (its block of 128..144 is one-chunk, A's tiled). A again: 13 match, 9 kept (a 76-row
    // span of its 92-row last chunk). D: 11 match, 8 kept (its last chunk 128..192 whole).
    // E: 12 match and kept (a 64-row span of the full chunk 128..256).
    assert_eq!(hits, 16 * (10 + 8 + 9 + 8 + 12));
}

/// Every weight type's kernels (plain, tinyBLAS, repacked), a mixture of experts and
/// QK-norm: a shorter first span after a prefix changes none of their rows.
#[test]
fn reused_prefixes_give_the_lone_numbers_synthetic() {
    for name in [
        "synth-qwen2-Q8_0.gguf",
        "synth-llama-F32.gguf",
        "synth-qwen2-F16.gguf",
        "synth-qwen2-BF16.gguf",
        "synth-qwen2-Q4_0.gguf",
        "synth-qwen2-Q4_K.gguf",
        "synth-qwen2-Q6_K.gguf",
        "synth-qwen2-IQ4_NL.gguf",
        "synth-qwen3-Q8_0.gguf",
        "synth-olmoe-Q8_0.gguf",
    ] {
        let Some(vocab) = model(name).map(|m| m.config.vocab_size) else {
            continue;
        };
        let prompts = shared_prefix_prompts(vocab);
        check_sequential(name, 1024, &prompts, KvTypes::default());
    }
}

/// Every compressed KV cache type (q8_0, q4_0, TurboQuant's `--tq` pair) under the prefix
/// cache: reused quantized blocks give the numbers of the same prompts without the cache.
#[test]
fn reused_prefixes_give_the_lone_numbers_with_compressed_caches() {
    let name = "synth-qwen3-Q8_0.gguf";
    let Some(vocab) = model(name).map(|m| m.config.vocab_size) else {
        return;
    };
    let prompts = shared_prefix_prompts(vocab);
    let both = |t: KvType| KvTypes { keys: t, values: t };
    for kv_types in [
        both(KvType::Q8_0),
        both(KvType::Q4_0),
        KvTypes {
            keys: KvType::Tq4,
            values: KvType::Tq3,
        },
    ] {
        let (hits, _) = check_sequential(name, 1024, &prompts, kv_types).expect("model found");
        assert!(hits > 0, "{kv_types}: no prefix was reused");
    }
}

/// A pool of 40 blocks that the prompts overflow: cached blocks are evicted (least recently
/// used first) to make room, and what is still found is still exact.
#[test]
fn eviction_keeps_outputs_exact() {
    let name = "synth-qwen2-Q8_0.gguf";
    let Some(vocab) = model(name).map(|m| m.config.vocab_size) else {
        return;
    };
    let mut prompts = Vec::new();
    for seed in 0..3 {
        let prefix = tokens(vocab, 10 + seed, 300);
        for tail in 0..2 {
            let mut prompt = prefix.clone();
            prompt.extend(tokens(vocab, 20 + seed * 2 + tail, 40));
            prompts.push(prompt);
        }
    }
    // Back to the first prefix, likely evicted by now.
    prompts.push(prompts[0].clone());
    let (hits, evicted) =
        check_sequential(name, 640, &prompts, KvTypes::default()).expect("model found");
    assert!(hits > 0, "the second prompt of each pair reuses its prefix");
    assert!(evicted > 0, "the pool overflowed");
}

/// Requests running together share the blocks cached by the ones before, and the outputs
/// equal those of a scheduler without the cache.
#[test]
fn concurrent_requests_equal_those_without_the_cache() {
    let name = "SmolLM2-135M-Instruct.Q4_1.gguf";
    let Some(model) = model(name) else { return };
    let prompts = shared_prefix_prompts(model.config.vocab_size);
    let run = |prefix_cache: bool| {
        let scheduler = scheduler(&model, 2048, prefix_cache, KvTypes::default());
        let total = scheduler.stats().total_blocks;
        // The first prompt alone fills the cache; the rest run together.
        let first = collect(&submit(&scheduler, &prompts[0]));
        let receivers: Vec<_> = prompts[1..]
            .iter()
            .map(|prompt| submit(&scheduler, prompt))
            .collect();
        let mut outputs = vec![first];
        outputs.extend(receivers.iter().map(collect));
        assert!(scheduler.wait_idle(Duration::from_secs(30)));
        assert_eq!(scheduler.stats().free_blocks, total, "no block leaks");
        (outputs, scheduler.metrics().prefix_hit_tokens)
    };
    let (cached, hits) = run(true);
    let (uncached, no_hits) = run(false);
    assert!(hits > 0);
    assert_eq!(no_hits, 0);
    for (i, (a, b)) in cached.iter().zip(&uncached).enumerate() {
        let bits = |run: &Vec<(u32, f64)>| -> Vec<(u32, u64)> {
            run.iter().map(|&(id, lp)| (id, lp.to_bits())).collect()
        };
        assert_eq!(bits(a), bits(b), "prompt {i}");
    }
}
