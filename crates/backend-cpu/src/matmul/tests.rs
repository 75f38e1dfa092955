//! `matmul` (every SIMD level, one and two threads) against `matmul_scalar`, bit for bit,
//! for every weight type and several token counts; `matmul_scalar` against an f64 product
//! of the dequantized weight for the float types.

use super::*;
use runit_quant::{dequantize, quantize};

use runit_quant::dot::WEIGHT_TYPES as TYPES;

/// Deterministic pseudo-random values in about [-2, 2].
fn values(count: usize, seed: u64) -> Vec<f32> {
    let mut state = seed | 1;
    (0..count)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            ((state >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 4.0
        })
        .collect()
}

fn packed(ty: GgmlType, n_in: usize, n_out: usize) -> Vec<u8> {
    let mut bytes = vec![0u8; ty.row_bytes(n_in as u64).expect("whole blocks") as usize * n_out];
    quantize(
        ty,
        &values(n_in * n_out, 0xabcdef + ty.id() as u64),
        &mut bytes,
    )
    .expect("quantizable");
    bytes
}

#[test]
fn matmul_equals_its_scalar_twin_for_every_type_level_and_token_count() {
    let (n_in, n_out) = (512, 37);
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(2)
        .build()
        .expect("pool");
    let mut levels: Vec<SimdLevel> = SimdLevel::ALL
        .into_iter()
        .filter(|level| level.is_available())
        .collect();
    levels.sort_by_key(|level| *level == SimdLevel::Scalar);
    let mut scratch = Vec::new();
    for ty in TYPES {
        let bytes = packed(ty, n_in, n_out);
        let weight = PackedWeight::new(ty, &bytes, n_in, n_out);
        for tokens in [1, 7, 8, 64, 67] {
            let x = values(tokens * n_in, tokens as u64);
            for &level in &levels {
                let mut expected = vec![0.0f32; tokens * n_out];
                matmul_scalar(&weight, &x, tokens, &mut expected, level);
                for pool in [None, Some(&pool)] {
                    let mut y = vec![f32::NAN; tokens * n_out];
                    matmul(
                        &weight,
                        &x,
                        tokens,
                        &mut y,
                        &mut scratch,
                        &Parallelism {
                            pool,
                            level,
                            rows_alone: false,
                        },
                    );
                    let same = y
                        .iter()
                        .zip(&expected)
                        .all(|(a, b)| a.to_bits() == b.to_bits());
                    assert!(
                        same,
                        "{ty} tokens={tokens} {level:?} threads={}",
                        pool.is_some()
                    );
                }
            }
        }
    }
}

#[test]
fn scalar_matmul_is_close_to_the_exact_product() {
    let (n_in, n_out, tokens) = (256, 5, 3);
    for ty in TYPES {
        let bytes = packed(ty, n_in, n_out);
        let mut w = vec![0.0f32; n_in * n_out];
        dequantize(ty, &bytes, &mut w).expect("dequantizable");
        let x = values(tokens * n_in, 99);
        let mut y = vec![0.0f32; tokens * n_out];
        matmul_scalar(
            &PackedWeight::new(ty, &bytes, n_in, n_out),
            &x,
            tokens,
            &mut y,
            SimdLevel::Scalar,
        );
        for t in 0..tokens {
            for o in 0..n_out {
                let row = &w[o * n_in..(o + 1) * n_in];
                let input = &x[t * n_in..(t + 1) * n_in];
                let exact: f64 = row
                    .iter()
                    .zip(input)
                    .map(|(a, b)| f64::from(*a) * f64::from(*b))
                    .sum();
                let scale: f64 = row
                    .iter()
                    .zip(input)
                    .map(|(a, b)| f64::from(a.abs() * b.abs()))
                    .sum();
                // Activation quantization (8 bits, or f16/bf16 rounding) bounds the error.
                let tolerance = if ty == GgmlType::F32 { 1e-5 } else { 2e-2 };
                let got = f64::from(y[t * n_out + o]);
                assert!(
                    (got - exact).abs() <= tolerance * scale,
                    "{ty} t={t} o={o}: {got} vs {exact}"
                );
            }
        }
    }
}

#[test]
#[should_panic(expected = "x is [tokens=2")]
fn mismatched_shapes_panic_with_the_shape() {
    let bytes = packed(GgmlType::Q8_0, 32, 2);
    let weight = PackedWeight::new(GgmlType::Q8_0, &bytes, 32, 2);
    let mut y = vec![0.0; 4];
    matmul(
        &weight,
        &[0.0; 63],
        2,
        &mut y,
        &mut Vec::new(),
        &Parallelism::current_thread(),
    );
}

#[test]
fn concurrent_callers_share_the_team_and_stay_exact() {
    let (n_in, n_out) = (256, 301);
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(3)
        .build()
        .expect("pool");
    let bytes = packed(GgmlType::Q4_1, n_in, n_out);
    let weight = PackedWeight::new(GgmlType::Q4_1, &bytes, n_in, n_out);
    std::thread::scope(|scope| {
        for caller in 0..3u64 {
            let (pool, weight) = (&pool, &weight);
            scope.spawn(move || {
                let mut scratch = Vec::new();
                for step in 0..200u64 {
                    let tokens = [1, 1, 9][(step % 3) as usize];
                    let x = values(tokens * n_in, caller * 1000 + step);
                    let mut expected = vec![0.0f32; tokens * n_out];
                    let parallelism = Parallelism::pool(pool);
                    matmul_scalar(weight, &x, tokens, &mut expected, parallelism.level);
                    let mut y = vec![f32::NAN; tokens * n_out];
                    matmul(weight, &x, tokens, &mut y, &mut scratch, &parallelism);
                    assert!(
                        y.iter()
                            .zip(&expected)
                            .all(|(a, b)| a.to_bits() == b.to_bits()),
                        "caller {caller} step {step}"
                    );
                }
            });
        }
    });
}

/// Guided task bounds cover the rows once, in order, in tasks that shrink to the minimum
/// (every task but the last a multiple of the requested rows); one thread takes one task.
#[test]
fn task_bounds_cover_the_rows_in_shrinking_tasks() {
    for rows in [1usize, 7, 8, 9, 64, 192, 576, 960, 1536, 49152] {
        for threads in [1usize, 2, 3, 8] {
            for multiple in [1usize, 8, 16] {
                if rows % multiple != 0 {
                    continue;
                }
                let bounds = super::task_bounds(rows, threads, multiple);
                let what = format!("{rows} rows, {threads} threads, multiples of {multiple}");
                assert_eq!(bounds.first(), Some(&0), "{what}");
                assert_eq!(bounds.last(), Some(&rows), "{what}");
                if threads == 1 {
                    assert_eq!(bounds, [0, rows], "{what}");
                    continue;
                }
                let sizes: Vec<usize> = bounds.windows(2).map(|w| w[1] - w[0]).collect();
                assert!(sizes.iter().all(|&size| size > 0), "{what}: {sizes:?}");
                assert!(
                    sizes.windows(2).all(|w| w[1] <= w[0]),
                    "{what}: sizes never grow: {sizes:?}"
                );
                for &size in &sizes[..sizes.len() - 1] {
                    assert!(
                        size % multiple == 0 && size >= super::MIN_ROWS_PER_TASK,
                        "{what}: {sizes:?}"
                    );
                }
                assert!(
                    sizes[0]
                        <= rows
                            .div_ceil(threads)
                            .max(super::MIN_ROWS_PER_TASK)
                            .next_multiple_of(multiple),
                    "{what}: the first task is about 1 / threads of the rows: {sizes:?}"
                );
            }
        }
    }
}

/// Speculative verification's order: with `rows_alone`, each of several rows gets the bits
/// of `matmul_scalar` over that row alone, for every type, layout and SIMD level (the
/// batched orders, tinyBLAS and the repacked gemm, would give other bits for some).
#[test]
fn rows_alone_gives_each_row_its_lone_bits() {
    let (n_in, n_out) = (512, 40);
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(2)
        .build()
        .expect("pool");
    let levels: Vec<SimdLevel> = SimdLevel::ALL
        .into_iter()
        .filter(|level| level.is_available())
        .collect();
    let mut scratch = Vec::new();
    for ty in TYPES {
        let bytes = packed(ty, n_in, n_out);
        for layout in [Layout::Plain, Layout::Repacked, Layout::RepackedExpert] {
            let weight = PackedWeight::new(ty, &bytes, n_in, n_out).with_layout(layout);
            for tokens in [2, 4, 9, 17] {
                let x = values(tokens * n_in, 7 + tokens as u64);
                for &level in &levels {
                    let mut alone = vec![0.0f32; tokens * n_out];
                    for (row, out) in x.chunks(n_in).zip(alone.chunks_mut(n_out)) {
                        matmul_scalar(&weight, row, 1, out, level);
                    }
                    for pool in [None, Some(&pool)] {
                        let mut y = vec![f32::NAN; tokens * n_out];
                        let parallelism = Parallelism {
                            pool,
                            level,
                            rows_alone: true,
                        };
                        matmul(&weight, &x, tokens, &mut y, &mut scratch, &parallelism);
                        let same = y
                            .iter()
                            .zip(&alone)
                            .all(|(a, b)| a.to_bits() == b.to_bits());
                        assert!(same, "{ty} {layout:?} tokens={tokens} {level:?}");
                    }
                }
            }
        }
    }
}
