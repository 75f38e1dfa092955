//! The AVX2 kernels against their scalar twins (bit for bit), and the code-domain kernels
//! against decoding the block.

use runit_backend::turbo::{self, TurboLayout, BLOCK};
use runit_backend::KvRole;

use super::*;

fn values(seed: u64) -> [f32; BLOCK] {
    let mut state = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    std::array::from_fn(|_| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    })
}

#[test]
fn simd_kernels_equal_their_scalar_twins() {
    let isa = Isa::detect(true);
    for seed in 0..50u64 {
        for bits in 1..=4 {
            let table = Table::new(bits);
            let q = values(seed);
            let codes: [u8; BLOCK] =
                std::array::from_fn(|i| ((seed as usize * 7 + i * 13) % (1 << bits)) as u8);
            let signs = turbo::signs(seed as usize, turbo::Diagonal::Sketch);
            assert_eq!(
                code_dot(isa, &q, &codes, &table).to_bits(),
                code_dot(Isa::Scalar, &q, &codes, &table).to_bits()
            );
            assert_eq!(
                sign_dot(isa, &q, signs).to_bits(),
                sign_dot(Isa::Scalar, &q, signs).to_bits()
            );
            let mut fast = values(seed + 100);
            let mut slow = fast;
            code_mad(isa, &mut fast, &codes, &table, 0.37);
            code_mad(Isa::Scalar, &mut slow, &codes, &table, 0.37);
            assert_eq!(fast.map(f32::to_bits), slow.map(f32::to_bits));
        }
    }
}

#[test]
fn code_domain_scores_equal_decoded_dot_products() {
    for (bits, role) in [(4, KvRole::Keys), (3, KvRole::Keys), (4, KvRole::Values)] {
        let layout = TurboLayout::new(bits, role);
        let mut bytes = vec![0u8; layout.block_bytes()];
        for seed in 0..20 {
            let x = values(seed);
            let query = values(seed + 1000);
            let block = seed as usize % 5;
            turbo::encode_block(layout, &x, block, &mut bytes);
            let mut decoded = [0.0f32; BLOCK];
            turbo::decode_block(layout, &bytes, block, &mut decoded);
            let want: f32 = decoded.iter().zip(&query).map(|(a, b)| a * b).sum();

            let mut rotated = query;
            turbo::rotate(&mut rotated, block);
            let mut codes = [0u8; BLOCK];
            let header = layout.header_bytes();
            turbo::unpack_codes(
                &bytes[header..header + layout.code_bytes()],
                layout.code_bits,
                &mut codes,
            );
            let table = Table::new(layout.code_bits);
            let mut got = code_dot(Isa::Scalar, &rotated, &codes, &table);
            if layout.sketch {
                let mut sketched = rotated;
                turbo::sketch(&mut sketched, block);
                let at = header + layout.code_bytes();
                let signs = u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap());
                let residual = half::f16::from_le_bytes([bytes[2], bytes[3]]).to_f32();
                got += turbo::sketch_factor() * residual * sign_dot(Isa::Scalar, &sketched, signs);
            }
            got *= half::f16::from_le_bytes([bytes[0], bytes[1]]).to_f32();
            assert!((got - want).abs() < 1e-4 * (1.0 + want.abs()), "{got} vs {want}");
        }
    }
}
