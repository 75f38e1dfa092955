//! The eight-lane f32 accumulator that every quantized kernel shares with ggml-cpu's AVX2
//! code, in scalar form.
//!
//! Lane `k` holds the contributions of elements `4k..4k+4` of every 32-element group, so a
//! 256-bit register of eight i32 sums (what `vpmaddubsw` + `vpmaddwd`, or `vpdpbusd`, leave
//! behind) maps onto it one to one.

use bytemuck::Pod;

/// Eight f32 partial sums.
pub(crate) type Lanes = [f32; 8];

/// ggml's `hsum_float_8`: upper half plus lower half, then `(0 + 2) + (1 + 3)`.
pub(crate) fn hsum8(lanes: &Lanes) -> f32 {
    let quad = [
        lanes[0] + lanes[4],
        lanes[1] + lanes[5],
        lanes[2] + lanes[6],
        lanes[3] + lanes[7],
    ];
    (quad[0] + quad[2]) + (quad[1] + quad[3])
}

/// `acc[k] = fma(scale, sums[k], acc[k])`, one block's contribution.
pub(crate) fn fma_lanes(acc: &mut Lanes, scale: f32, sums: &[i32; 8]) {
    for (lane, &sum) in acc.iter_mut().zip(sums) {
        *lane = scale.mul_add(sum as f32, *lane);
    }
}

/// Integer dot product of `weights` and `activations` (equal lengths, a multiple of 32),
/// split into the eight lanes.
pub(crate) fn lane_sums<W: Copy + Into<i32>>(weights: &[W], activations: &[i8]) -> [i32; 8] {
    let mut sums = [0i32; 8];
    for (index, (&w, &a)) in weights.iter().zip(activations).enumerate() {
        sums[(index % 32) / 4] += w.into() * i32::from(a);
    }
    sums
}

/// Block `index` of the packed row `bytes`, read without alignment requirements.
pub(crate) fn block<B: Pod>(bytes: &[u8], index: usize) -> B {
    let size = std::mem::size_of::<B>();
    bytemuck::pod_read_unaligned(&bytes[index * size..(index + 1) * size])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hsum8_adds_in_ggml_order() {
        // Values whose sum depends on the association order in f32.
        let lanes = [1.0e8, 1.0, -1.0e8, 1.0, 3.0, 0.5, 7.0, 0.25];
        let quad = [1.0e8f32 + 3.0, 1.0 + 0.5, -1.0e8 + 7.0, 1.0 + 0.25];
        assert_eq!(hsum8(&lanes), (quad[0] + quad[2]) + (quad[1] + quad[3]));
    }

    #[test]
    fn lane_sums_group_by_four_within_each_32() {
        let weights = [1i8; 64];
        let activations: Vec<i8> = (0..64).map(|i| (i % 32) as i8).collect();
        let sums = lane_sums(&weights, &activations);
        for (k, sum) in sums.iter().enumerate() {
            let expected: i32 = (4 * k as i32..4 * k as i32 + 4).sum::<i32>() * 2;
            assert_eq!(*sum, expected);
        }
    }
}
