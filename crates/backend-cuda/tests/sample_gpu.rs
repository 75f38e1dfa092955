//! Sampling on the GPU (`CudaBackend::sample_pick_on_device`, kernels/sample.cu) against the host's
//! `runit_backend::sample::sample_row` (the contract's default): the same token, row for
//! row, over random logits of 1,000 to 151,936 values with ties, NaNs of both signs, -inf
//! and -0, in batches of 1 to 64 rows, under every combination of the settings (greedy and
//! temperatures, top-k of 1 to the whole row, top-p, min-p, penalties, biases that add,
//! ban and force tokens).
//!
//! Without a CUDA driver or device every test prints a notice and passes, unless
//! `RUNIT_REQUIRE_GPU=1` (set on the GPU machine), where that fails.

mod common;

use runit_backend::sample::{sample_row, Filters, Penalties, RowSampling};
use runit_backend::testing::Rng;
use runit_backend::Device;
use runit_backend_cuda::CudaBackend;

fn cuda() -> Option<CudaBackend> {
    common::cuda_or_notice("GPU sampling tests")
}

/// One row's settings, with the lists `RowSampling` borrows.
#[derive(Debug, Clone)]
struct Settings {
    filters: Filters,
    penalties: Penalties,
    penalized: Vec<(u32, u32)>,
    logit_bias: Vec<(u32, f32)>,
    uniform: f64,
}

impl Settings {
    fn row(&self) -> RowSampling<'_> {
        RowSampling {
            filters: self.filters,
            penalties: self.penalties,
            penalized: &self.penalized,
            logit_bias: &self.logit_bias,
            uniform: self.uniform,
        }
    }
}

/// A row of `width` logits in style `style`: uniform, rounded (many ties), with planted
/// NaNs (both signs), -inf, -0 and +inf, or mostly -inf.
fn logits(rng: &mut Rng, width: usize, style: usize) -> Vec<f32> {
    let mut row = rng.values(width, -15.0, 15.0);
    match style % 7 {
        1 => row.iter_mut().for_each(|v| *v = v.round()),
        2 => row.iter_mut().for_each(|v| *v = (*v * 0.25).round() * 4.0),
        3 => {
            for _ in 0..width / 50 {
                let at = rng.below(width);
                row[at] = f32::NEG_INFINITY;
            }
            row[rng.below(width)] = -0.0;
            row[rng.below(width)] = 0.0;
        }
        4 => {
            row[rng.below(width)] = f32::NAN;
            row[rng.below(width)] = -f32::NAN;
            row[0] = -f32::NAN;
        }
        5 => {
            row[rng.below(width)] = -f32::NAN;
            row[rng.below(width)] = f32::INFINITY;
            row[0] = f32::NAN;
        }
        6 => {
            // Fewer finite values than top-k keeps: the k-th candidate is among the ties
            // of -inf, ordered by id.
            row.iter_mut().skip(3).for_each(|v| *v = f32::NEG_INFINITY);
        }
        _ => {}
    }
    row
}

/// Every combination of the settings, each with its own random lists and uniform.
fn every_combination(rng: &mut Rng, width: usize) -> Vec<Settings> {
    let mut all = Vec::new();
    for temperature in [0.0f32, 0.7, 1.0, 1.9] {
        for top_k in [1usize, 2, 40, 1024, 0, 1025] {
            for top_p in [1.0f32, 0.9, 0.3] {
                for min_p in [0.0f32, 0.05, 0.5] {
                    for penalties in 0..3 {
                        for bias in 0..4 {
                            all.push(settings(
                                rng,
                                width,
                                Filters {
                                    temperature,
                                    top_k,
                                    top_p,
                                    min_p,
                                },
                                penalties,
                                bias,
                            ));
                        }
                    }
                }
            }
        }
    }
    all
}

/// Settings with `filters`, penalties of kind `penalties` (0 off, 1 repeat only, 2 all three
/// over a window of repeated tokens) and biases of kind `bias` (0 none, 1 adding and
/// banning with a repeated id, 2 banning the largest logits' neighbourhood, 3 forcing).
fn settings(
    rng: &mut Rng,
    width: usize,
    filters: Filters,
    penalties: usize,
    bias: usize,
) -> Settings {
    let penalized: Vec<(u32, u32)> = match penalties {
        0 => Vec::new(),
        _ => (0..1 + rng.below(40))
            .map(|_| (rng.below(width) as u32, 1 + rng.below(5) as u32))
            .collect(),
    };
    let penalties = match penalties {
        0 => Penalties {
            repeat: 1.0,
            frequency: 0.0,
            presence: 0.0,
        },
        1 => Penalties {
            repeat: 1.3,
            frequency: 0.0,
            presence: 0.0,
        },
        _ => Penalties {
            repeat: 0.9,
            frequency: 0.35,
            presence: -0.6,
        },
    };
    let mut logit_bias = Vec::new();
    if bias > 0 {
        for _ in 0..1 + rng.below(8) {
            let value = [-100.0f32, -2.5, 0.75, 5.0, 13.0][rng.below(5)];
            logit_bias.push((rng.below(width) as u32, value));
        }
        let first = logit_bias[0].0;
        logit_bias.push((first, 0.375));
    }
    if bias == 2 {
        logit_bias.extend((0..64).map(|i| (i as u32 % width as u32, -100.0)));
    }
    if bias == 3 {
        logit_bias.push((rng.below(width) as u32, 100.0));
        logit_bias.push((rng.below(width) as u32, 100.0));
    }
    Settings {
        filters,
        penalties,
        penalized,
        logit_bias,
        uniform: rng.next_u64() as f64 / u64::MAX as f64 * 0.999_999,
    }
}

/// Samples `settings` rows (logits of `width` in various styles) on the device in calls of
/// `batch` rows and checks each token and its logit against the host's `sample_row`.
fn check(cuda: &CudaBackend, rng: &mut Rng, width: usize, batch: usize, settings: &[Settings]) {
    for (call, group) in settings.chunks(batch).enumerate() {
        let values: Vec<f32> = (0..group.len())
            .flat_map(|r| logits(rng, width, call + r))
            .collect();
        let mut buffer = cuda.alloc(values.len()).expect("alloc");
        cuda.upload(&mut buffer, &values).expect("upload");
        let rows: Vec<RowSampling<'_>> = group.iter().map(Settings::row).collect();
        let sampled = cuda
            .sample_pick_on_device(&mut buffer, group.len(), width, &rows)
            .expect("sample_pick_on_device");
        assert_eq!(sampled.len(), group.len());
        for (r, (got, row)) in sampled.iter().zip(&rows).enumerate() {
            let mut host = values[r * width..(r + 1) * width].to_vec();
            let expected = sample_row(&mut host, row).expect("biases inside the row");
            assert_eq!(
                got.id,
                expected.id,
                "width {width}, call {call}, row {r} (style {}): {:?}",
                (call + r) % 7,
                group[r]
            );
            assert!(
                got.logit.to_bits() == expected.logit.to_bits()
                    || (got.logit.is_nan() && expected.logit.is_nan()),
                "width {width}, call {call}, row {r}: logit {} vs {}",
                got.logit,
                expected.logit
            );
        }
    }
}

#[test]
fn every_setting_combination_samples_as_the_host() {
    let Some(cuda) = cuda() else { return };
    let mut rng = Rng::new(0x005a_3e91);
    for (width, batch) in [
        (1000usize, 64usize),
        (4096, 17),
        (32_000, 64),
        (151_936, 64),
    ] {
        let all = every_combination(&mut rng, width);
        check(&cuda, &mut rng, width, batch, &all);
    }
}

#[test]
fn nans_from_biases_and_penalties_rank_as_the_hosts() {
    // Top-1 rows where the adjusted logits hold NaNs: a NaN's sign decides whether it ranks
    // first or last, so the device must produce the host's NaN, not its own positive one.
    let Some(cuda) = cuda() else { return };
    let width = 1000;
    let mut rng = Rng::new(0x6e61);
    let base = |rng: &mut Rng, first: f32, at_five: f32| {
        let mut row = rng.values(width, -15.0, 15.0);
        row[0] = first;
        row[5] = at_five;
        row
    };
    let penalties = |repeat: f32, presence: f32| Penalties {
        repeat,
        frequency: 0.0,
        presence,
    };
    let off = penalties(1.0, 0.0);
    // (logits, penalties, penalized, biases): a penalized -NaN (the failing case of session
    // 32), a biased -NaN, -inf × 0 and inf - inf (the host's NaN of an invalid operation).
    let cases = [
        (
            base(&mut rng, f32::NAN, -f32::NAN),
            penalties(1.3, 0.0),
            vec![(5, 2)],
            vec![],
        ),
        (
            base(&mut rng, f32::NAN, -f32::NAN),
            off,
            vec![],
            vec![(5, 0.75)],
        ),
        (
            base(&mut rng, 1.0, f32::NEG_INFINITY),
            penalties(0.0, 0.0),
            vec![(5, 1)],
            vec![],
        ),
        (
            base(&mut rng, 1.0, f32::INFINITY),
            penalties(1.0, f32::INFINITY),
            vec![(5, 1)],
            vec![],
        ),
    ];
    let settings: Vec<Settings> = cases
        .iter()
        .map(|(_, penalties, penalized, logit_bias)| Settings {
            filters: Filters {
                temperature: 0.7,
                top_k: 1,
                top_p: 1.0,
                min_p: 0.5,
            },
            penalties: *penalties,
            penalized: penalized.clone(),
            logit_bias: logit_bias.clone(),
            uniform: 0.25,
        })
        .collect();
    let values: Vec<f32> = cases.iter().flat_map(|case| case.0.clone()).collect();
    let mut buffer = cuda.alloc(values.len()).expect("alloc");
    cuda.upload(&mut buffer, &values).expect("upload");
    let rows: Vec<RowSampling<'_>> = settings.iter().map(Settings::row).collect();
    let sampled = cuda
        .sample_pick_on_device(&mut buffer, rows.len(), width, &rows)
        .expect("sample_pick_on_device");
    for (r, (got, row)) in sampled.iter().zip(&rows).enumerate() {
        let expected = sample_row(&mut cases[r].0.clone(), row).expect("biases inside the row");
        assert_eq!(got.id, expected.id, "case {r}: {:?}", settings[r]);
    }
}

#[test]
fn batches_of_one_to_sixty_four_rows_sample_as_the_host() {
    let Some(cuda) = cuda() else { return };
    let mut rng = Rng::new(0x77);
    let temperatures = [0.0f32, 0.8, 1.0, 0.3];
    for (width, batch) in [
        (151_936usize, 1usize),
        (151_936, 3),
        (49_152, 64),
        (1000, 1),
        (2048, 33),
    ] {
        let rows: Vec<Settings> = (0..batch.max(8))
            .map(|i| {
                let filters = Filters {
                    temperature: temperatures[i % 4],
                    top_k: [40, 1, 1024, 7, 0][i % 5],
                    top_p: [0.95, 1.0, 0.5][i % 3],
                    min_p: [0.05, 0.0][i % 2],
                };
                settings(&mut rng, width, filters, i % 3, i % 4)
            })
            .collect();
        check(&cuda, &mut rng, width, batch, &rows);
    }
}

#[test]
fn a_batch_of_default_settings_picks_a_spread_of_tokens() {
    // The same row under many uniforms: the draws cover several candidates, each equal to
    // the host's (a selection that lost candidates would disagree somewhere here).
    let Some(cuda) = cuda() else { return };
    let mut rng = Rng::new(0x4242);
    let width = 151_936;
    let row = logits(&mut rng, width, 1);
    let values: Vec<f32> = (0..64).flat_map(|_| row.clone()).collect();
    let settings: Vec<Settings> = (0..64)
        .map(|i| Settings {
            filters: Filters {
                temperature: 1.5,
                top_k: 1024,
                top_p: 1.0,
                min_p: 0.0,
            },
            penalties: Penalties {
                repeat: 1.0,
                frequency: 0.0,
                presence: 0.0,
            },
            penalized: Vec::new(),
            logit_bias: Vec::new(),
            uniform: i as f64 / 64.0,
        })
        .collect();
    let mut buffer = cuda.alloc(values.len()).expect("alloc");
    cuda.upload(&mut buffer, &values).expect("upload");
    let rows: Vec<RowSampling<'_>> = settings.iter().map(Settings::row).collect();
    let sampled = cuda
        .sample_pick_on_device(&mut buffer, 64, width, &rows)
        .expect("sample_pick_on_device");
    let mut distinct: Vec<u32> = sampled.iter().map(|s| s.id).collect();
    for (r, got) in sampled.iter().enumerate() {
        let expected = sample_row(&mut row.clone(), &rows[r]).expect("a token");
        assert_eq!(got.id, expected.id, "uniform {}", rows[r].uniform);
    }
    distinct.sort_unstable();
    distinct.dedup();
    assert!(
        distinct.len() > 8,
        "only {} distinct tokens",
        distinct.len()
    );
}
