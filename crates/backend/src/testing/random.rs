//! Seeded inputs for the parity suite: a SplitMix64 generator and weights made by quantizing
//! random f32 data (so block scales are realistic).

use std::sync::Arc;

use runit_quant::GgmlType;

use crate::{Backend, BackendError, HostMemory, Weight, WeightRole, WeightSource};

/// SplitMix64: a small, fast, seeded generator (no dependency needed).
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator whose sequence is fixed by `seed`.
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `[0, 1)`.
    pub fn unit(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32
    }

    /// Uniform in `[low, high)`.
    pub fn uniform(&mut self, low: f32, high: f32) -> f32 {
        low + (high - low) * self.unit()
    }

    /// Uniform integer in `0 .. bound` (`bound > 0`).
    pub fn below(&mut self, bound: usize) -> usize {
        (self.next_u64() % bound as u64) as usize
    }

    /// `n` values uniform in `[low, high)`.
    pub fn values(&mut self, n: usize, low: f32, high: f32) -> Vec<f32> {
        (0..n).map(|_| self.uniform(low, high)).collect()
    }

    /// `n` roughly normal values (sum of four uniforms), mean 0, deviation `sigma`.
    pub fn normal(&mut self, n: usize, sigma: f32) -> Vec<f32> {
        // Four uniforms on [-1, 1) have variance 4/3.
        let k = sigma / (4.0f32 / 3.0).sqrt();
        (0..n)
            .map(|_| k * (0..4).map(|_| self.uniform(-1.0, 1.0)).sum::<f32>())
            .collect()
    }
}

/// Quantizes `values` (`shape` in ggml order) to `ty` and loads the result on `backend`, in
/// the role its shape gives it ([`WeightRole::of_shape`]).
pub fn make_weight(
    backend: &dyn Backend,
    name: &str,
    ty: GgmlType,
    shape: &[usize],
    values: &[f32],
) -> Result<Weight, BackendError> {
    make_weight_as(
        backend,
        WeightRole::of_shape(shape),
        name,
        ty,
        shape,
        values,
    )
}

/// [`make_weight`] in the role `role` (a token embedding, say).
pub fn make_weight_as(
    backend: &dyn Backend,
    role: WeightRole,
    name: &str,
    ty: GgmlType,
    shape: &[usize],
    values: &[f32],
) -> Result<Weight, BackendError> {
    let invalid = |message: String| BackendError::Device {
        backend: backend.name(),
        op: "make_weight",
        message: format!("tensor {name}: {message}"),
    };
    let n: usize = shape.iter().product();
    if values.len() != n {
        return Err(invalid(format!(
            "{} values for shape {shape:?}",
            values.len()
        )));
    }
    let row_bytes = ty
        .row_bytes(shape[0] as u64)
        .ok_or_else(|| invalid(format!("rows of {} are not whole {ty} blocks", shape[0])))?;
    let bytes_len = row_bytes as usize * (n / shape[0].max(1));
    let mut bytes = vec![0u8; bytes_len];
    runit_quant::quantize(ty, values, &mut bytes).map_err(|error| invalid(error.to_string()))?;
    let memory: Arc<dyn HostMemory> = Arc::new(bytes);
    backend.load_weight(WeightSource {
        name,
        role,
        ty,
        shape,
        memory,
        range: 0..bytes_len,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rng_is_seeded_and_in_range() {
        let mut a = Rng::new(7);
        let mut b = Rng::new(7);
        assert_eq!(a.next_u64(), b.next_u64());
        let values = a.values(1000, -2.0, 3.0);
        assert!(values.iter().all(|v| (-2.0..3.0).contains(v)));
        let mean = values.iter().sum::<f32>() / 1000.0;
        assert!((mean - 0.5).abs() < 0.2, "{mean}");
        let normal = a.normal(4000, 0.5);
        let var = normal.iter().map(|v| v * v).sum::<f32>() / 4000.0;
        assert!((var.sqrt() - 0.5).abs() < 0.05, "{}", var.sqrt());
    }
}
