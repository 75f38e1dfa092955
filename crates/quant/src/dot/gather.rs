//! Dot products of weight rows gathered from a table of blocks (the keys of a quantized KV
//! cache, one head of each cell) with a few activation rows (the queries of the heads that
//! share the key): one call for many keys, each key's blocks unpacked once for all the
//! queries, every dot product equal to the single-row [`DotFn`](super::DotFn) bit for bit.

use super::{activation_format, activation_row_bytes, legacy, SimdLevel};
use crate::GgmlType;

/// `gather_dot(n, weights, rows, activations, out)`: weight row `k` is the `n` elements from
/// block `rows[k]` of `weights` (whole blocks back to back), the activation rows lie back to
/// back in `activations` (`count = activations.len() / activation_row_bytes(format, n)` of
/// them), and `out[k * count + c]` receives the dot product of weight row `k` with
/// activation row `c`, equal to the type's [`DotFn`](super::DotFn) bit for bit.
///
/// Panics when `n` is not a whole number of blocks, `activations` not whole rows, `out`
/// not `rows.len() * count` values or a row outside `weights`.
pub type GatherDotFn =
    fn(n: usize, weights: &[u8], rows: &[usize], activations: &[u8], out: &mut [f32]);

/// The gathering kernel for `weight` at `level` (with [`super::dot_fn`]'s fallback to lower
/// levels this CPU supports): Q4_0 and Q8_0, the quantized KV cache types; `None` for the
/// others.
pub fn gather_dot_fn(weight: GgmlType, level: SimdLevel) -> Option<GatherDotFn> {
    if !matches!(weight, GgmlType::Q4_0 | GgmlType::Q8_0) {
        return None;
    }
    for &candidate in level.fallback_chain() {
        if !candidate.is_available() {
            continue;
        }
        let kernel = match candidate {
            SimdLevel::Scalar => Some(scalar_gather(weight)),
            #[cfg(target_arch = "x86_64")]
            _ => super::x86::gather::gather_dot(weight, candidate),
            #[cfg(not(target_arch = "x86_64"))]
            _ => None,
        };
        if kernel.is_some() {
            return kernel;
        }
    }
    None
}

/// The scalar twin: one single-row scalar dot product per (row, activation row).
fn scalar_gather(weight: GgmlType) -> GatherDotFn {
    match weight {
        GgmlType::Q4_0 => |n, weights, rows, activations, out| {
            looped(
                GgmlType::Q4_0,
                n,
                weights,
                rows,
                activations,
                out,
                legacy::dot_q4_0,
            )
        },
        _ => |n, weights, rows, activations, out| {
            looped(
                GgmlType::Q8_0,
                n,
                weights,
                rows,
                activations,
                out,
                legacy::dot_q8_0,
            )
        },
    }
}

/// Calls `dot` once per (row, activation row).
fn looped(
    ty: GgmlType,
    n: usize,
    weights: &[u8],
    rows: &[usize],
    activations: &[u8],
    out: &mut [f32],
    dot: super::DotFn,
) {
    let shape = check(ty, n, weights, rows, activations, out);
    for (&row, out) in rows.iter().zip(out.chunks_exact_mut(shape.count.max(1))) {
        let weight_row = &weights[row * ty.type_size()..][..shape.blocks * ty.type_size()];
        for (value, activation) in out
            .iter_mut()
            .zip(activations.chunks_exact(shape.activation_bytes))
        {
            *value = dot(n, weight_row, activation);
        }
    }
}

/// What [`check`] established about a call.
pub(super) struct Shape {
    /// Blocks of a weight row (and of an activation row).
    pub blocks: usize,
    /// Bytes of an activation row.
    pub activation_bytes: usize,
    /// Activation rows.
    pub count: usize,
}

/// Checks a [`GatherDotFn`] call's lengths (see its panics) for weight type `ty`.
pub(super) fn check(
    ty: GgmlType,
    n: usize,
    weights: &[u8],
    rows: &[usize],
    activations: &[u8],
    out: &mut [f32],
) -> Shape {
    let format = activation_format(ty).expect("a dot type");
    assert!(
        n.is_multiple_of(ty.block_size()) && n > 0,
        "{n} elements is not a whole number of {ty} blocks"
    );
    let blocks = n / ty.block_size();
    let activation_bytes = activation_row_bytes(format, n);
    assert!(
        activations.len().is_multiple_of(activation_bytes),
        "{} activation bytes are not whole rows of {activation_bytes}",
        activations.len()
    );
    let count = activations.len() / activation_bytes;
    assert_eq!(
        out.len(),
        rows.len() * count,
        "a value per row and activation row"
    );
    let last = rows.iter().max().map_or(0, |&row| row + blocks);
    assert!(
        last * ty.type_size() <= weights.len(),
        "a row of {ty} blocks up to block {last} outside {} bytes",
        weights.len()
    );
    Shape {
        blocks,
        activation_bytes,
        count,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dot::{dot_fn, quantize_activation, ActivationFormat};

    /// Every level's gathering kernel equals the scalar single-row dot of each pair bit
    /// for bit: Q4_0 and Q8_0 rows of random bytes (every code, the extreme -128 of Q8_0
    /// included), 1 to 9 activation rows, odd and even row counts, rows repeated and out of
    /// order.
    #[test]
    fn gathering_kernels_equal_the_single_row_dot() {
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let mut compared = 0;
        for ty in [GgmlType::Q4_0, GgmlType::Q8_0] {
            for n in [32, 64, 128, 96] {
                let table_blocks = 200;
                let mut weights: Vec<u8> = (0..table_blocks * ty.type_size())
                    .map(|_| next() as u8)
                    .collect();
                for block in weights.chunks_exact_mut(ty.type_size()) {
                    let scale = (next() % 2000) as f32 / 1000.0 - 1.0;
                    block[..2].copy_from_slice(&half::f16::from_f32(scale * 0.05).to_le_bytes());
                }
                let blocks = n / 32;
                for count in 1..=9 {
                    let x: Vec<f32> = (0..n * count)
                        .map(|_| (next() % 4001) as f32 / 1000.0 - 2.0)
                        .collect();
                    let row_bytes = activation_row_bytes(ActivationFormat::Q8_0, n);
                    let mut activations = vec![0u8; count * row_bytes];
                    for (x, row) in x.chunks(n).zip(activations.chunks_exact_mut(row_bytes)) {
                        quantize_activation(ActivationFormat::Q8_0, x, row);
                    }
                    for keys in [1, 2, 7, 16, 33] {
                        let rows: Vec<usize> = (0..keys)
                            .map(|_| next() as usize % (table_blocks - blocks + 1))
                            .collect();
                        let single = dot_fn(ty, SimdLevel::Scalar).expect("a Q4_0/Q8_0 dot");
                        let mut levels: Vec<SimdLevel> = SimdLevel::ALL
                            .into_iter()
                            .filter(|level| level.is_available())
                            .collect();
                        levels.push(SimdLevel::Scalar);
                        for level in levels {
                            let gather = gather_dot_fn(ty, level).expect("Q4_0/Q8_0 kernels");
                            let mut out = vec![f32::NAN; keys * count];
                            gather(n, &weights, &rows, &activations, &mut out);
                            for (k, &row) in rows.iter().enumerate() {
                                let weight = &weights[row * ty.type_size()..];
                                for c in 0..count {
                                    let activation = &activations[c * row_bytes..][..row_bytes];
                                    let expected = single(n, weight, activation);
                                    assert_eq!(
                                        out[k * count + c].to_bits(),
                                        expected.to_bits(),
                                        "{ty} n={n} {level:?} {keys} rows x {count}: ({k}, {c})"
                                    );
                                    compared += 1;
                                }
                            }
                        }
                    }
                }
            }
        }
        assert!(compared > 10_000, "{compared} compared");
    }

    #[test]
    fn other_types_have_no_gathering_kernel() {
        assert!(gather_dot_fn(GgmlType::Q4_1, SimdLevel::detect()).is_none());
        assert!(gather_dot_fn(GgmlType::F16, SimdLevel::Scalar).is_none());
        for level in SimdLevel::ALL {
            assert!(gather_dot_fn(GgmlType::Q8_0, level).is_some(), "{level:?}");
        }
    }
}
