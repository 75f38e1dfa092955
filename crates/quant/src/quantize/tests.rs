//! Round-trip properties: quantize then dequantize random data, per type, with error bounds
//! derived from each format's step size.

use proptest::prelude::*;

use crate::{dequantize, quantize, GgmlType};

/// Quantizes and dequantizes `x` as `ty`; also through a misaligned destination buffer,
/// which must give the same bytes.
fn round_trip(ty: GgmlType, x: &[f32]) -> Vec<f32> {
    let bytes = ty.row_bytes(x.len() as u64).expect("whole blocks") as usize;
    let mut packed = vec![0u8; bytes];
    quantize(ty, x, &mut packed).expect("quantize");
    let mut shifted = vec![0u8; bytes + 1];
    quantize(ty, x, &mut shifted[1..]).expect("quantize unaligned");
    assert_eq!(
        packed,
        shifted[1..],
        "{ty}: aligned and unaligned bytes differ"
    );
    let mut back = vec![0.0f32; x.len()];
    dequantize(ty, &packed, &mut back).expect("dequantize");
    back
}

/// Largest error allowed for a block, from its absolute maximum `amax` and range `spread`.
fn allowed_error(ty: GgmlType, amax: f32, spread: f32) -> f32 {
    use GgmlType::*;
    let relative = match ty {
        F32 => 0.0,
        F16 => amax * 2f32.powi(-11),
        BF16 => amax * 2f32.powi(-8),
        // Half a step, plus the f16 rounding of the scale times the largest quant.
        Q8_0 | Q8_1 => amax / 127.0,
        Q8_K => amax / 127.0 * 0.51,
        // The side opposite the extreme element clamps one step short: up to a full step.
        Q4_0 => amax / 8.0 * 1.02,
        Q5_0 => amax / 16.0 * 1.04,
        Q4_1 => spread / 15.0 * 0.52 + amax * 2f32.powi(-10),
        Q5_1 => spread / 31.0 * 0.54 + amax * 2f32.powi(-10),
        // Searched scales: bounds relative to the block maximum, with room for the clamping
        // of sub-block scales against the super-block scale.
        Q6_K => amax / 32.0 * 1.5,
        Q5_K => spread / 31.0 * 1.5,
        Q4_K => spread / 15.0 * 1.5,
        Q3_K => amax / 4.0 * 1.5,
        Q2_K => spread / 3.0 * 1.5,
        IQ4_NL | IQ4_XS => amax * 0.2,
        _ => unreachable!("not a quantizable type: {ty}"),
    };
    // f16 scales of small blocks are subnormal, with an absolute step of 2^-24; the error of
    // the stored scale is multiplied by the largest factor that multiplies it in the format
    // (e.g. 6-bit sub-block scale 63 times quant 15 plus min factor 63 for Q4_K).
    let largest_factor = match ty {
        F32 | BF16 | Q8_K => 0.0,
        F16 => 1.0,
        Q4_0 => 8.0,
        Q5_0 => 16.0,
        Q4_1 => 16.0,
        Q5_1 => 32.0,
        Q8_0 | Q8_1 | IQ4_NL => 127.0,
        Q2_K => 60.0,
        Q3_K => 128.0,
        Q4_K => 1008.0,
        Q5_K => 2016.0,
        Q6_K => 4096.0,
        IQ4_XS => 4064.0,
        _ => unreachable!("not a quantizable type: {ty}"),
    };
    relative + largest_factor * 2f32.powi(-24)
}

fn check_type(ty: GgmlType, x: &[f32]) {
    let back = round_trip(ty, x);
    let group = if ty.block_size() == 1 {
        1
    } else {
        ty.block_size()
    };
    for (start, (x, y)) in x.chunks(group).zip(back.chunks(group)).enumerate() {
        let amax = x.iter().fold(0.0f32, |a, v| a.max(v.abs()));
        let max = x.iter().fold(f32::MIN, |a, &v| a.max(v));
        let min = x.iter().fold(f32::MAX, |a, &v| a.min(v));
        let spread = max - min.min(0.0);
        let bound = allowed_error(ty, amax, spread.max(amax));
        for (a, b) in x.iter().zip(y) {
            assert!(
                (a - b).abs() <= bound,
                "{ty} block {start}: {a} came back as {b}, bound {bound}"
            );
        }
    }
}

const TYPES: [GgmlType; 17] = [
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Q8_1,
    GgmlType::Q2_K,
    GgmlType::Q3_K,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
    GgmlType::Q8_K,
    GgmlType::IQ4_NL,
    GgmlType::IQ4_XS,
];

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn round_trip_error_is_bounded(
        values in prop::collection::vec(-1.0f32..1.0, 512),
        scale in prop_oneof![Just(1.0f32), Just(0.06), Just(1e-3), Just(30.0)],
        offset in prop_oneof![Just(0.0f32), Just(0.5)],
    ) {
        let x: Vec<f32> = values.iter().map(|v| (v + offset) * scale).collect();
        for ty in TYPES {
            check_type(ty, &x);
        }
    }
}

#[test]
fn zero_blocks_come_back_as_zeros() {
    let x = vec![0.0f32; 512];
    for ty in TYPES {
        assert!(round_trip(ty, &x).iter().all(|&v| v == 0.0), "{ty}");
    }
}

#[test]
fn rejects_bad_lengths_and_types() {
    use crate::QuantError;
    let x = vec![0.0f32; 48];
    assert_eq!(
        quantize(GgmlType::Q4_0, &x, &mut [0; 36]),
        Err(QuantError::NotBlockMultiple {
            ty: GgmlType::Q4_0,
            n: 48,
            block: 32
        })
    );
    assert_eq!(
        quantize(GgmlType::Q4_0, &x[..32], &mut [0; 36]),
        Err(QuantError::Length {
            ty: GgmlType::Q4_0,
            expected: 18,
            found: 36
        })
    );
    assert!(matches!(
        quantize(GgmlType::IQ2_XS, &[0.0; 256], &mut [0; 74]),
        Err(QuantError::Unsupported { .. })
    ));
}

#[test]
fn bf16_rounds_to_nearest_even_and_keeps_nan() {
    use super::f32_to_bf16_bits;
    assert_eq!(f32_to_bf16_bits(1.0), 0x3f80);
    assert_eq!(f32_to_bf16_bits(f32::from_bits(0x3f80_8000)), 0x3f80);
    assert_eq!(f32_to_bf16_bits(f32::from_bits(0x3f81_8000)), 0x3f82);
    assert_eq!(f32_to_bf16_bits(f32::from_bits(0x3f80_8001)), 0x3f81);
    assert!(crate::dequant::bf16_bits_to_f32(f32_to_bf16_bits(f32::NAN)).is_nan());
}
