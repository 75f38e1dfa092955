//! Random tensor data, made fast: a weight matrix is filled by copying rows from a small pool
//! of rows quantized once per (row length, type), picked by a cheap per-row hash, so a 7B model
//! costs a few memcpy passes rather than billions of quantized floats.
//!
//! Values are normal with standard deviation [`WEIGHT_STD`] (GPT-2's initialisation), norm
//! weights are near 1 and biases near 0, which keeps activations finite through every layer.

use std::collections::HashMap;

use anyhow::{Context, Result};
use rayon::prelude::*;
use runit_quant::GgmlType;

use super::shapes::TensorSpec;

/// Distinct rows quantized per (row length, type).
pub const POOL_ROWS: usize = 64;

/// Standard deviation of weight matrices and biases.
pub const WEIGHT_STD: f32 = 0.02;

/// Bytes a worker fills at a time.
const BYTES_PER_TASK: usize = 1 << 20;

/// SplitMix64: a tiny, fast generator whose every output is a good hash of its state.
#[derive(Debug, Clone)]
pub struct Random(u64);

impl Random {
    /// A generator for `stream` of `seed`: different streams give independent sequences.
    pub fn new(seed: u64, stream: u64) -> Random {
        Random(mix(seed ^ mix(stream)))
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        mix(self.0)
    }

    /// Uniform in (0, 1].
    fn next_unit(&mut self) -> f64 {
        ((self.next_u64() >> 11) + 1) as f64 / (1u64 << 53) as f64
    }

    /// Fills `values` with normal samples of mean `mean` and deviation `std` (Box-Muller).
    pub fn fill_normal(&mut self, values: &mut [f32], mean: f32, std: f32) {
        for pair in values.chunks_mut(2) {
            let radius = (-2.0 * self.next_unit().ln()).sqrt();
            let angle = std::f64::consts::TAU * self.next_unit();
            pair[0] = mean + std * (radius * angle.cos()) as f32;
            if let Some(second) = pair.get_mut(1) {
                *second = mean + std * (radius * angle.sin()) as f32;
            }
        }
    }
}

/// SplitMix64's finaliser: a bijective hash of 64 bits.
fn mix(value: u64) -> u64 {
    let mut z = value;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// [`POOL_ROWS`] rows of one length, already in one type.
#[derive(Debug)]
pub struct RowPool {
    row_bytes: usize,
    bytes: Vec<u8>,
}

impl RowPool {
    /// Quantizes [`POOL_ROWS`] random rows of `row_length` elements to `ty`.
    fn new(row_length: u64, ty: GgmlType, seed: u64) -> Result<RowPool> {
        let length = usize::try_from(row_length)?;
        let row_bytes = ty
            .row_bytes(row_length)
            .and_then(|bytes| usize::try_from(bytes).ok())
            .with_context(|| format!("{ty} cannot hold rows of {row_length} elements"))?;
        let mut values = vec![0.0f32; POOL_ROWS * length];
        Random::new(seed, row_length ^ (u64::from(ty.id()) << 48)).fill_normal(
            &mut values,
            0.0,
            WEIGHT_STD,
        );
        let mut bytes = vec![0u8; POOL_ROWS * row_bytes];
        runit_quant::quantize(ty, &values, &mut bytes)
            .with_context(|| format!("quantizing a pool of rows to {ty}"))?;
        Ok(RowPool { row_bytes, bytes })
    }

    fn row(&self, index: usize) -> &[u8] {
        &self.bytes[index * self.row_bytes..(index + 1) * self.row_bytes]
    }

    /// `num_rows` rows picked from the pool by a hash of (`salt`, row), filled in parallel.
    pub fn matrix(&self, num_rows: u64, salt: u64) -> Result<Vec<u8>> {
        let num_rows = usize::try_from(num_rows)?;
        let total = num_rows
            .checked_mul(self.row_bytes)
            .context("tensor larger than memory")?;
        let mut bytes = vec![0u8; total];
        let rows_per_task = (BYTES_PER_TASK / self.row_bytes.max(1)).max(1);
        bytes
            .par_chunks_mut(rows_per_task * self.row_bytes)
            .enumerate()
            .for_each(|(task, chunk)| {
                let first_row = task * rows_per_task;
                for (offset, row) in chunk.chunks_exact_mut(self.row_bytes).enumerate() {
                    let pick = mix(salt ^ (first_row + offset) as u64) as usize % POOL_ROWS;
                    row.copy_from_slice(self.row(pick));
                }
            });
        Ok(bytes)
    }
}

/// The pools every matrix of `plan` needs, built in parallel. `plan` pairs each tensor with
/// its type; vectors (one row) are not pooled.
pub fn build_pools(
    plan: &[(&TensorSpec, GgmlType)],
    seed: u64,
) -> Result<HashMap<(u64, GgmlType), RowPool>> {
    let mut keys: Vec<(u64, GgmlType)> = plan
        .iter()
        .filter(|(tensor, _)| tensor.shape.len() > 1)
        .map(|(tensor, ty)| (tensor.row_length(), *ty))
        .collect();
    keys.sort();
    keys.dedup();
    keys.into_par_iter()
        .map(|key| Ok((key, RowPool::new(key.0, key.1, seed)?)))
        .collect()
}

/// The bytes of a vector (norm weight or bias) in F32: near 1 for norms, near 0 otherwise.
pub fn vector(tensor: &TensorSpec, seed: u64, salt: u64) -> Result<Vec<u8>> {
    let mut values = vec![0.0f32; usize::try_from(tensor.num_elements())?];
    let mean = if tensor.norm { 1.0 } else { 0.0 };
    Random::new(seed, salt).fill_normal(&mut values, mean, WEIGHT_STD);
    Ok(values
        .iter()
        .flat_map(|value| value.to_le_bytes())
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normal_samples_have_the_asked_moments() {
        let mut values = vec![0.0f32; 100_001];
        Random::new(7, 1).fill_normal(&mut values, 1.0, 0.02);
        let n = values.len() as f64;
        let mean = values.iter().map(|&v| f64::from(v)).sum::<f64>() / n;
        let variance = values
            .iter()
            .map(|&v| (f64::from(v) - mean).powi(2))
            .sum::<f64>()
            / n;
        assert!((mean - 1.0).abs() < 1e-3, "mean {mean}");
        assert!(
            (variance.sqrt() - 0.02).abs() < 1e-3,
            "std {}",
            variance.sqrt()
        );
    }

    #[test]
    fn matrices_are_pool_rows_and_deterministic() {
        let pool = RowPool::new(256, GgmlType::Q4_K, 3).expect("pool");
        let first = pool.matrix(1000, 42).expect("matrix");
        assert_eq!(first.len(), 1000 * 144);
        assert_eq!(first, pool.matrix(1000, 42).expect("matrix"));
        assert_ne!(first, pool.matrix(1000, 43).expect("matrix"));
        let mut used = std::collections::HashSet::new();
        for row in first.chunks_exact(144) {
            let index = (0..POOL_ROWS)
                .find(|&index| pool.row(index) == row)
                .expect("every row comes from the pool");
            used.insert(index);
        }
        assert!(used.len() > POOL_ROWS / 2, "rows spread over the pool");
    }
}
