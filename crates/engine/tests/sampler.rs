//! Statistical checks of the sampler: each filter keeps exactly the tokens it should, draws
//! follow the softmax at the given temperature, and the same seed gives the same draws.

use runit_engine::{Sampler, SamplerParams};

fn params(temperature: f32) -> SamplerParams {
    SamplerParams {
        temperature,
        top_k: 0,
        top_p: 1.0,
        min_p: 0.0,
        seed: 7,
        ..SamplerParams::default()
    }
}

fn histogram(p: SamplerParams, logits: &[f32], draws: usize) -> Vec<usize> {
    let mut sampler = Sampler::new(p).expect("valid parameters");
    let mut counts = vec![0; logits.len()];
    for _ in 0..draws {
        let mut l = logits.to_vec();
        counts[sampler.sample(&mut l).expect("a token") as usize] += 1;
    }
    counts
}

#[test]
fn greedy_picks_the_argmax() {
    let mut s = Sampler::new(params(0.0)).expect("valid");
    assert_eq!(s.sample(&mut [0.1, 3.0, 2.9, -1.0]).expect("a token"), 1);
}

#[test]
fn draws_follow_the_softmax_at_the_temperature() {
    let logits = [1.0f32, 2.0, 0.0, 1.5];
    for temperature in [0.5f32, 1.0, 2.0] {
        let draws = 200_000;
        let counts = histogram(params(temperature), &logits, draws);
        let z: f64 = logits
            .iter()
            .map(|&l| ((l / temperature) as f64).exp())
            .sum();
        for (i, &c) in counts.iter().enumerate() {
            let p = ((logits[i] / temperature) as f64).exp() / z;
            let expected = p * draws as f64;
            let sd = (draws as f64 * p * (1.0 - p)).sqrt();
            assert!(
                (c as f64 - expected).abs() < 5.0 * sd,
                "T={temperature} token {i}: {c} draws, expected {expected:.0} ± {sd:.0}"
            );
        }
    }
}

#[test]
fn top_k_top_p_and_min_p_keep_the_right_tokens() {
    let logits = [3.0f32, 2.0, 1.0, 0.0, -1.0];
    let mut p = params(1.0);
    p.top_k = 2;
    let counts = histogram(p, &logits, 20_000);
    assert!(
        counts[2..].iter().all(|&c| c == 0),
        "top-k 2 drew {counts:?}"
    );
    assert!(counts[0] > counts[1] && counts[1] > 0);

    // Softmax of [3,2,1,0,-1]: 0.636, 0.234, 0.086, ... top-p 0.8 keeps the first two.
    let mut p = params(1.0);
    p.top_p = 0.8;
    let counts = histogram(p, &logits, 20_000);
    assert!(
        counts[2..].iter().all(|&c| c == 0),
        "top-p 0.8 drew {counts:?}"
    );

    // min-p 0.3 keeps tokens with p >= 0.3 * p_max: exp(-1) = 0.37 passes, exp(-2) fails.
    let mut p = params(1.0);
    p.min_p = 0.3;
    let counts = histogram(p, &logits, 20_000);
    assert!(
        counts[2..].iter().all(|&c| c == 0),
        "min-p 0.3 drew {counts:?}"
    );
    assert!(counts[1] > 0);
}

#[test]
fn penalties_lower_recent_tokens() {
    let mut p = params(0.0);
    p.repeat_penalty = 2.0;
    let mut s = Sampler::new(p).expect("valid");
    s.accept(0);
    // Token 0 (logit 2.0) is halved to 1.0, below token 1 (1.5).
    assert_eq!(s.sample(&mut [2.0, 1.5, 0.0]).expect("a token"), 1);

    let mut p = params(0.0);
    p.frequency_penalty = 0.4;
    p.presence_penalty = 0.2;
    let mut s = Sampler::new(p).expect("valid");
    s.accept(0);
    s.accept(0);
    // 2.0 - 2 * 0.4 - 0.2 = 1.0 < 1.5.
    assert_eq!(s.sample(&mut [2.0, 1.5, 0.0]).expect("a token"), 1);
}

#[test]
fn the_same_seed_gives_the_same_draws() {
    let logits: Vec<f32> = (0..100).map(|i| (i as f32 * 0.37).sin()).collect();
    let run = |seed| {
        let mut p = params(1.0);
        p.seed = seed;
        let mut s = Sampler::new(p).expect("valid");
        (0..50)
            .map(|_| s.sample(&mut logits.clone()).expect("a token"))
            .collect::<Vec<_>>()
    };
    assert_eq!(run(1), run(1));
    assert_ne!(run(1), run(2));
}

#[test]
fn invalid_parameters_are_refused() {
    for bad in [
        SamplerParams {
            temperature: -1.0,
            ..SamplerParams::default()
        },
        SamplerParams {
            temperature: f32::NAN,
            ..SamplerParams::default()
        },
        SamplerParams {
            top_p: 0.0,
            ..SamplerParams::default()
        },
        SamplerParams {
            min_p: 1.5,
            ..SamplerParams::default()
        },
        SamplerParams {
            repeat_penalty: 0.0,
            ..SamplerParams::default()
        },
    ] {
        assert!(Sampler::new(bad).is_err());
    }
}
