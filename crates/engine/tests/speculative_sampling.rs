//! At temperature > 0 speculative sampling keeps the target's distribution: over many
//! seeded runs, the frequencies of the tokens generated after a verification (the second
//! and third tokens) with a draft model equal those without speculation, by a two-sample
//! chi-square test at the 0.1% level. The draft model is the target itself drafting
//! greedily: its drafts are the target's most likely tokens, kept often but not always, the
//! case where a wrong rule (keeping drafts too often) would show most.

mod common;

use std::collections::HashMap;
use std::sync::Arc;

use runit_engine::speculative::{DraftModel, DraftParams, Speculation};
use runit_engine::{generate_with, EngineConfig, GenerateParams, Sampler, SamplerParams, Session};
use runit_model::Model;

const RUNS: u64 = 1500;
const TOKENS: usize = 4;

fn config() -> EngineConfig {
    EngineConfig {
        context_size: 128,
        batch_size: 32,
        ..Default::default()
    }
}

fn sampling(seed: u64) -> SamplerParams {
    SamplerParams {
        temperature: 1.0,
        top_k: 6,
        top_p: 1.0,
        min_p: 0.0,
        seed,
        ..SamplerParams::DEFAULT
    }
}

/// Tokens of every run, and the drafts kept and drafted over all runs.
fn runs(
    target: &Arc<Model>,
    draft: Option<&Arc<Model>>,
    prompt: &[u32],
) -> (Vec<Vec<u32>>, usize, usize) {
    let mut session = Session::new(Arc::clone(target), &config()).expect("session");
    let params = GenerateParams {
        max_tokens: TOKENS,
        end_of_generation: Vec::new(),
        top_logprobs: 0,
    };
    let (mut kept, mut drafted) = (0, 0);
    let mut outputs = Vec::new();
    for run in 0..RUNS {
        session.reset();
        let seed = run + if draft.is_some() { 1 << 32 } else { 0 };
        let mut sampler = Sampler::new(sampling(seed)).expect("sampler");
        let mut speculation = draft.map(|draft| {
            let drafter =
                DraftModel::new(Arc::clone(draft), &config(), 0.0, target.config.vocab_size)
                    .expect("draft model");
            let params = DraftParams {
                max: 2,
                ..DraftParams::DEFAULT
            };
            Speculation::new(Box::new(drafter), params).expect("speculation")
        });
        let output = generate_with(
            &mut session,
            &mut sampler,
            prompt,
            &params,
            speculation.as_mut(),
            |_| true,
        )
        .expect("generate");
        if let Some(stats) = output.speculation {
            kept += stats.accepted;
            drafted += stats.drafted;
        }
        outputs.push(output.tokens);
    }
    (outputs, kept, drafted)
}

/// The two-sample chi-square statistic of two equal-sized samples and its degrees of
/// freedom, categories seen fewer than 10 times in both together pooled into one.
fn chi_square(a: &[u32], b: &[u32]) -> (f64, usize) {
    let mut counts: HashMap<u32, (f64, f64)> = HashMap::new();
    for &x in a {
        counts.entry(x).or_default().0 += 1.0;
    }
    for &x in b {
        counts.entry(x).or_default().1 += 1.0;
    }
    let mut cells: Vec<(f64, f64)> = Vec::new();
    let mut pooled = (0.0, 0.0);
    for (x, y) in counts.into_values() {
        if x + y < 10.0 {
            pooled = (pooled.0 + x, pooled.1 + y);
        } else {
            cells.push((x, y));
        }
    }
    if pooled.0 + pooled.1 > 0.0 {
        cells.push(pooled);
    }
    let statistic = cells.iter().map(|(x, y)| (x - y).powi(2) / (x + y)).sum();
    (statistic, cells.len().saturating_sub(1))
}

/// The chi-square distribution's 99.9th percentile (Wilson-Hilferty).
fn critical_value(df: usize) -> f64 {
    let df = df.max(1) as f64;
    let z = 3.09;
    let h = 2.0 / (9.0 * df);
    df * (1.0 - h + z * h.sqrt()).powi(3)
}

#[test]
fn speculative_sampling_keeps_the_token_frequencies() {
    let Some(target) = common::find_model("synth-qwen2-Q8_0.gguf") else {
        println!("skip: the synthetic qwen2 model is not found");
        return;
    };
    let target = common::load(&target, 1);
    let draft = Arc::clone(&target);
    let prompt = [1u32, 200, 300, 400, 500];
    let (plain, _, _) = runs(&target, None, &prompt);
    let (speculative, kept, drafted) = runs(&target, Some(&draft), &prompt);
    println!("drafts kept: {kept} of {drafted}");
    assert!(
        kept > RUNS as usize / 4,
        "too few drafts kept to test the rule"
    );
    assert!(kept < drafted, "no draft was rejected");
    for position in 1..TOKENS {
        let column = |runs: &[Vec<u32>]| {
            runs.iter()
                .map(|tokens| tokens[position])
                .collect::<Vec<_>>()
        };
        let (statistic, df) = chi_square(&column(&plain), &column(&speculative));
        let critical = critical_value(df);
        println!("token {position}: chi-square {statistic:.1}, {df} degrees of freedom, 0.1% critical {critical:.1}");
        assert!(
            df > 0,
            "token {position} takes a single value: the test would be empty"
        );
        assert!(
            statistic < critical,
            "token {position}: frequencies differ (chi-square {statistic:.1} >= {critical:.1})"
        );
    }
}

/// The test's own check: frequencies of a different distribution (plain runs at another
/// temperature) are told apart, so the comparison above can fail.
#[test]
fn the_frequency_test_tells_distributions_apart() {
    let Some(target) = common::find_model("synth-qwen2-Q8_0.gguf") else {
        return;
    };
    let target = common::load(&target, 1);
    let column = |temperature: f32| {
        let mut session = Session::new(Arc::clone(&target), &config()).expect("session");
        let params = GenerateParams {
            max_tokens: 2,
            end_of_generation: Vec::new(),
            top_logprobs: 0,
        };
        (0..RUNS)
            .map(|seed| {
                session.reset();
                let mut sampler = Sampler::new(SamplerParams {
                    temperature,
                    ..sampling(seed)
                })
                .expect("sampler");
                generate_with(
                    &mut session,
                    &mut sampler,
                    &[1, 200, 300, 400, 500],
                    &params,
                    None,
                    |_| true,
                )
                .expect("generate")
                .tokens[1]
            })
            .collect::<Vec<_>>()
    };
    let (statistic, df) = chi_square(&column(1.0), &column(1.3));
    assert!(
        statistic > critical_value(df),
        "chi-square {statistic:.1} with {df} degrees of freedom"
    );
}
