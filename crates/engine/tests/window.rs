//! Windowed layers that keep only their windows (rings of blocks reused as the sequence
//! advances) compute what the whole-context cache computes: Gemma 3 270M (window 512) runs a
//! prompt and a greedy continuation well past its window, in prompt chunks that wrap the
//! rings several times, and every logit equals the whole-context run's bit for bit; the
//! windowed layers' cache is smaller by the cells the rings save. The scheduler (the server's
//! engine) gives each of its sequences a ring: two greedy requests past the window decoded
//! together equal their whole-context runs.

mod common;

use std::sync::mpsc::channel;
use std::time::Duration;

use runit_engine::scheduler::{Request, Scheduler, SequenceEvent};
use runit_engine::{EngineConfig, Session};

fn config(window_rings: bool) -> EngineConfig {
    EngineConfig {
        context_size: 2048,
        batch_size: 64,
        window_rings,
        ..EngineConfig::default()
    }
}

#[test]
fn rings_equal_the_whole_context_past_the_window() {
    let Some(path) = common::find_model("gemma-3-270m-q4_k_m.gguf") else {
        eprintln!("skipping: gemma-3-270m-q4_k_m.gguf not found");
        return;
    };
    let model = common::load(&path, 2);
    let window = model
        .config
        .layers()
        .iter()
        .find_map(|layer| layer.sliding_window)
        .expect("Gemma 3 has windowed layers");
    let mut ringed = Session::new(model.clone(), &config(true)).expect("session");
    let mut whole = Session::new(model, &config(false)).expect("session");
    let ring_cells = ringed.window_ring_cells().expect("the rings are on");
    assert!(
        ring_cells < 2048 && ring_cells >= window + 63,
        "{ring_cells}"
    );
    assert_eq!(whole.window_ring_cells(), None);
    assert!(
        ringed.kv_cache_bytes() < whole.kv_cache_bytes(),
        "{} vs {}",
        ringed.kv_cache_bytes(),
        whole.kv_cache_bytes()
    );

    // 1.3 windows of prompt (rings wrap twice at 64-token chunks), then 40 greedy steps.
    let prompt: Vec<u32> = std::iter::once(2)
        .chain((1..(window as u32 * 13 / 10)).map(|i| 1000 + (i * 7919) % 20_000))
        .collect();
    let a = ringed.eval(&prompt, false, None).expect("prompt").to_vec();
    let b = whole.eval(&prompt, false, None).expect("prompt").to_vec();
    assert_eq!(a, b, "prompt logits");
    let mut token = argmax(&a);
    for step in 0..40 {
        let a = ringed.eval(&[token], false, None).expect("decode").to_vec();
        let b = whole.eval(&[token], false, None).expect("decode").to_vec();
        assert_eq!(a, b, "step {step}");
        token = argmax(&a);
    }
    // Past the window, and past the ring: its first blocks hold later positions now.
    assert!(ringed.n_past() > ring_cells, "{}", ringed.n_past());
}

#[test]
fn scheduled_sequences_with_rings_equal_the_whole_context() {
    let Some(path) = common::find_model("gemma-3-270m-q4_k_m.gguf") else {
        eprintln!("skipping: gemma-3-270m-q4_k_m.gguf not found");
        return;
    };
    let model = common::load(&path, 2);
    let prompts: Vec<Vec<u32>> = [560u32, 530]
        .iter()
        .enumerate()
        .map(|(p, &len)| {
            std::iter::once(2)
                .chain((1..len).map(|i| 1000 + (i * 7919 + p as u32 * 104_729) % 20_000))
                .collect()
        })
        .collect();
    let steps = 24;
    let expected: Vec<Vec<u32>> = prompts
        .iter()
        .map(|prompt| {
            let mut whole = Session::new(model.clone(), &config(false)).expect("session");
            let mut token = argmax(whole.eval(prompt, false, None).expect("prompt"));
            let mut tokens = vec![token];
            while tokens.len() < steps {
                token = argmax(whole.eval(&[token], false, None).expect("decode"));
                tokens.push(token);
            }
            tokens
        })
        .collect();
    let scheduler = Scheduler::start(
        model,
        &EngineConfig {
            max_sequences: 2,
            ..config(true)
        },
    )
    .expect("scheduler");
    let receivers: Vec<_> = prompts
        .iter()
        .map(|prompt| {
            let (sender, receiver) = channel();
            let request = Request::greedy(prompt.clone(), steps);
            scheduler.submit(request, Box::new(sender)).expect("submit");
            receiver
        })
        .collect();
    for (i, receiver) in receivers.iter().enumerate() {
        let mut tokens = Vec::new();
        loop {
            match receiver
                .recv_timeout(Duration::from_secs(300))
                .expect("event")
            {
                SequenceEvent::Token(token) => tokens.push(token.id),
                SequenceEvent::Finished { .. } => break,
                SequenceEvent::Failed(message) => panic!("sequence {i} failed: {message}"),
            }
        }
        assert_eq!(tokens, expected[i], "sequence {i}");
    }
}

fn argmax(logits: &[f32]) -> u32 {
    runit_engine::sampler::argmax(logits)
}
