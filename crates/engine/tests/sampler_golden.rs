//! The sampler's draws pinned down: a fingerprint of the tokens `Sampler::sample` drew, over
//! random logits (with ties, NaNs and -inf) and many settings and seeds, recorded from the
//! sampler before its algorithm moved to `runit_backend::sample` (issue 24, part 3). The
//! engine's sampler and the backends' host default run that one function now; this test
//! says the move changed no draw.

use std::collections::VecDeque;

use runit_backend::sample::{penalty_counts, sample_row, RowSampling};
use runit_backend::testing::Rng;
use runit_backend::{Device, PrimitiveOps};
use runit_backend_cpu::CpuBackend;
use runit_engine::sampler::Rng as SamplerRng;
use runit_engine::{Sampler, SamplerParams};

/// The drawn tokens of [`cases`] under FNV-1a, as the sampler of commit 1509ada drew them.
const FINGERPRINT: u64 = 0x5a6a_5926_9daf_86a4;
/// How many draws [`cases`] makes (a check that the fingerprint covers what it should).
const DRAWS: usize = 9000;

/// One case: logits and settings, with the tokens the penalty window has seen.
pub struct Case {
    pub logits: Vec<f32>,
    pub params: SamplerParams,
    pub history: Vec<u32>,
}

fn pick<T: Copy>(rng: &mut Rng, values: &[T]) -> T {
    values[rng.below(values.len())]
}

/// Random logits of `width` values: uniform, or rounded to halves (many ties), with a few
/// NaNs (of both signs), -inf and +inf planted in some rows.
pub fn logits(rng: &mut Rng, width: usize) -> Vec<f32> {
    let mut row: Vec<f32> = (0..width).map(|_| rng.uniform(-12.0, 12.0)).collect();
    let style = rng.below(8);
    if style == 1 || style == 2 {
        row.iter_mut().for_each(|v| *v = (*v * 2.0).round() / 2.0);
    }
    if style == 3 {
        row.iter_mut().for_each(|v| *v = v.round() / 4.0);
    }
    if style == 4 && width > 3 {
        for _ in 0..width.div_ceil(10) {
            let at = rng.below(width);
            row[at] = f32::NEG_INFINITY;
        }
    }
    if style == 5 {
        let at = rng.below(width);
        row[at] = f32::NAN;
        let at = rng.below(width);
        row[at] = -f32::NAN;
    }
    if style == 6 {
        let at = rng.below(width);
        row[at] = -f32::NAN;
        let at = rng.below(width);
        row[at] = -0.0;
    }
    if style == 7 && width > 2 {
        row.iter_mut().skip(1).for_each(|v| *v = f32::NEG_INFINITY);
    }
    row
}

/// The cases: widths 1 to 4000, each setting on and off, penalties over random histories,
/// logit biases (bans, forced tokens, repeated ids).
pub fn cases(count: usize, seed: u64) -> Vec<Case> {
    let mut rng = Rng::new(seed);
    (0..count)
        .map(|_| {
            let width = pick(&mut rng, &[1usize, 2, 5, 17, 50, 333, 1000, 4000]);
            let logits = logits(&mut rng, width);
            let mut logit_bias = Vec::new();
            if rng.below(3) == 0 {
                for _ in 0..1 + rng.below(6) {
                    let value = pick(&mut rng, &[-100.0f32, -3.5, -0.25, 0.5, 2.0, 7.75, 100.0]);
                    // Forced tokens (+100) in one case in four of those with biases.
                    let value = if value == 100.0 && rng.below(4) != 0 {
                        1.5
                    } else {
                        value
                    };
                    logit_bias.push((rng.below(width) as u32, value));
                }
                if rng.below(4) == 0 {
                    let repeated = logit_bias[0];
                    logit_bias.push((repeated.0, 0.125));
                }
            }
            let params = SamplerParams {
                temperature: pick(&mut rng, &[0.0f32, 0.25, 0.8, 1.0, 1.7, 0.0]),
                top_k: pick(&mut rng, &[0usize, 1, 3, 40, 64, 1024, width + 5, width]),
                top_p: pick(&mut rng, &[1.0f32, 0.95, 0.5, 0.1, 0.999]),
                min_p: pick(&mut rng, &[0.0f32, 0.05, 0.3, 0.9, 1.0]),
                repeat_penalty: pick(&mut rng, &[1.0f32, 1.1, 0.8, 1.0]),
                frequency_penalty: pick(&mut rng, &[0.0f32, 0.5, -0.3, 0.0]),
                presence_penalty: pick(&mut rng, &[0.0f32, 0.7, -1.25, 0.0]),
                penalty_window: pick(&mut rng, &[0usize, 4, 64]),
                seed: rng.next_u64(),
                logit_bias,
                constraint: None,
            };
            let history = (0..rng.below(24))
                .map(|_| rng.below(width.min(12)) as u32)
                .collect();
            Case {
                logits,
                params,
                history,
            }
        })
        .collect()
}

/// The tokens the sampler draws for `case`: three draws, each accepted into the window
/// (`u32::MAX` where sampling fails, as when every token is banned).
pub fn draws(case: &Case) -> Vec<u32> {
    let mut sampler = Sampler::new(case.params.clone()).expect("valid settings");
    for &token in &case.history {
        sampler.accept(token);
    }
    (0..3)
        .map(|_| {
            let mut logits = case.logits.clone();
            match sampler.sample(&mut logits) {
                Ok(id) => {
                    sampler.accept(id);
                    id
                }
                Err(_) => u32::MAX,
            }
        })
        .collect()
}

#[test]
fn the_sampler_draws_what_it_drew_before_the_move() {
    let mut hash = 0xcbf2_9ce4_8422_2325u64;
    let mut count = 0;
    for case in cases(3000, 0x5a3e) {
        for id in draws(&case) {
            for byte in id.to_le_bytes() {
                hash = (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3);
            }
            count += 1;
        }
    }
    assert_eq!(count, DRAWS, "fingerprint {hash:#018x}");
    assert_eq!(hash, FINGERPRINT, "fingerprint {hash:#018x}");
}

/// [`draws`] by `runit_backend::sample::sample_row` alone, with the window and the uniform
/// draws kept here as the sampler keeps them.
fn row_draws(case: &Case) -> Vec<u32> {
    let p = &case.params;
    let mut rng = SamplerRng::new(p.seed);
    let mut window: VecDeque<u32> = VecDeque::new();
    let accept = |window: &mut VecDeque<u32>, token: u32| {
        if p.penalty_window > 0 {
            if window.len() == p.penalty_window {
                window.pop_front();
            }
            window.push_back(token);
        }
    };
    for &token in &case.history {
        accept(&mut window, token);
    }
    (0..3)
        .map(|_| {
            let uniform = if p.is_greedy() { 0.0 } else { rng.next_f64() };
            let counts = penalty_counts(window.iter().copied());
            let row = RowSampling {
                filters: p.filters(),
                penalties: p.penalties(),
                penalized: &counts,
                logit_bias: &p.logit_bias,
                uniform,
            };
            let mut logits = case.logits.clone();
            let sampled = sample_row(&mut logits, &row).expect("biases inside the row");
            if sampled.logit == f32::NEG_INFINITY {
                return u32::MAX;
            }
            accept(&mut window, sampled.id);
            sampled.id
        })
        .collect()
}

#[test]
fn the_shared_row_sampler_draws_what_the_sampler_draws() {
    for (n, case) in cases(3000, 0x5a3e).iter().enumerate() {
        assert_eq!(row_draws(case), draws(case), "case {n}: {:?}", case.params);
    }
}

#[test]
fn the_default_sample_pick_draws_the_sampler_s_first_tokens() {
    // Rows of one width in one call, as the scheduler batches them.
    let cpu = CpuBackend::new(1).expect("cpu backend");
    let cases = cases(600, 0x77);
    for width in [1usize, 2, 5, 17, 50, 333, 1000, 4000] {
        let same: Vec<&Case> = cases.iter().filter(|c| c.logits.len() == width).collect();
        let values: Vec<f32> = same.iter().flat_map(|c| c.logits.clone()).collect();
        let mut logits = cpu.alloc(values.len()).expect("alloc");
        cpu.upload(&mut logits, &values).expect("upload");
        let counts: Vec<Vec<(u32, u32)>> = same
            .iter()
            .map(|c| {
                penalty_counts(
                    c.history
                        .iter()
                        .rev()
                        .take(c.params.penalty_window)
                        .copied(),
                )
            })
            .collect();
        let sampling: Vec<RowSampling<'_>> = same
            .iter()
            .zip(&counts)
            .map(|(c, counts)| RowSampling {
                filters: c.params.filters(),
                penalties: c.params.penalties(),
                penalized: counts,
                logit_bias: &c.params.logit_bias,
                uniform: if c.params.is_greedy() {
                    0.0
                } else {
                    SamplerRng::new(c.params.seed).next_f64()
                },
            })
            .collect();
        let picked = cpu
            .sample_pick(&mut logits, same.len(), width, &sampling)
            .expect("sample_pick");
        for (n, (c, sampled)) in same.iter().zip(picked).enumerate() {
            let id = if sampled.logit == f32::NEG_INFINITY {
                u32::MAX
            } else {
                sampled.id
            };
            assert_eq!(id, draws(c)[0], "width {width}, row {n}: {:?}", c.params);
        }
    }
}
