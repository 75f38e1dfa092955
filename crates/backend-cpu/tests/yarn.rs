//! YaRN RoPE on the CPU against a reference written here from the published formulas (Peng et
//! al. 2023, "YaRN: Efficient Context Window Extension of Large Language Models", §3, as
//! llama.cpp parameterises them: `ext_factor`, `attn_factor`, `beta_fast`, `beta_slow`, the
//! original context), computed in f64.

use runit_backend::{Buffer, Device, PrimitiveOps, RopeParams, RopeStyle, Yarn};
use runit_backend_cpu::{CpuBackend, SimdLevel};

/// The rotation under test: Qwen2.5-style NEOX RoPE of 128 dims, base 10⁶, a context 4×
/// its original 4096 tokens.
const ROTARY_DIM: usize = 128;
const BASE: f64 = 1e6;
const FACTOR: f64 = 4.0;
const ORIGINAL_CONTEXT: f64 = 4096.0;
const BETA_FAST: f64 = 32.0;
const BETA_SLOW: f64 = 1.0;

/// The rotated dims at `position` of a head `x` (NEOX pairs `(i, i + d/2)`), from the paper:
/// frequency θᵢ = b^(-2i/d); the dim whose wavelength fits `n` turns into the original
/// context is r(n) = d·ln(L / (2πn)) / (2·ln b); the ramp runs from floor(r(β_fast)) to
/// ceil(r(β_slow)) (clamped to the dims), γᵢ = 1 - clamp((i - low) / (high - low)); each
/// angle blends the interpolated p·θᵢ/s (weight 1 - γᵢ·ext) and the extrapolated p·θᵢ
/// (weight γᵢ·ext), and the result is scaled by attn_factor · (1 + 0.1·ln s).
fn reference(x: &[f64], position: f64, ext_factor: f64, attn_factor: f64) -> Vec<f64> {
    let d = ROTARY_DIM as f64;
    let r = |turns: f64| {
        d * (ORIGINAL_CONTEXT / (2.0 * std::f64::consts::PI * turns)).ln() / (2.0 * BASE.ln())
    };
    let low = r(BETA_FAST).floor().max(0.0);
    let high = r(BETA_SLOW).ceil().min(d - 1.0);
    let magnitude = attn_factor * (1.0 + 0.1 * FACTOR.ln());
    let half = ROTARY_DIM / 2;
    let mut out = x.to_vec();
    for i in 0..half {
        let theta = BASE.powf(-2.0 * i as f64 / d);
        let gamma = 1.0 - ((i as f64 - low) / (high - low).max(0.001)).clamp(0.0, 1.0);
        let mix = gamma * ext_factor;
        let angle = position * theta / FACTOR * (1.0 - mix) + position * theta * mix;
        let (sin, cos) = angle.sin_cos();
        out[i] = (x[i] * cos - x[i + half] * sin) * magnitude;
        out[i + half] = (x[i] * sin + x[i + half] * cos) * magnitude;
    }
    out
}

fn rotated(backend: &CpuBackend, x: &[f32], position: u32, yarn: Option<Yarn>) -> Vec<f32> {
    let params = RopeParams {
        style: RopeStyle::Neox,
        heads: 1,
        head_dim: ROTARY_DIM,
        rotary_dim: ROTARY_DIM,
        theta: BASE as f32,
        freq_scale: (1.0 / FACTOR) as f32,
        yarn,
    };
    let mut buffer: Buffer = backend.alloc(x.len()).expect("alloc");
    backend.upload(&mut buffer, x).expect("upload");
    backend
        .rope(&mut buffer, &[position], &params, None)
        .expect("rope");
    let mut out = vec![0.0; x.len()];
    backend.download(&buffer, &mut out).expect("download");
    out
}

#[test]
fn yarn_rope_follows_the_published_formulas() {
    let x: Vec<f32> = (0..ROTARY_DIM).map(|i| ((i as f32) * 0.71).sin()).collect();
    let wide: Vec<f64> = x.iter().map(|&v| f64::from(v)).collect();
    // The magnitude llama.cpp gives ggml for a 4x YaRN context: get_mscale(4) over ggml's
    // own 1 + 0.1·ln 4, i.e. 1 (up to f32 rounding), so the product is 1 + 0.1·ln 4.
    let attn_factor = 1.0;
    let yarn = Yarn {
        ext_factor: 1.0,
        attn_factor: attn_factor as f32,
        beta_fast: BETA_FAST as f32,
        beta_slow: BETA_SLOW as f32,
        original_context: ORIGINAL_CONTEXT as u32,
    };
    let backends = [
        CpuBackend::with_simd(1, SimdLevel::Scalar).expect("backend"),
        CpuBackend::new(2).expect("backend"),
    ];
    for backend in &backends {
        for position in [0u32, 1, 7, 100, 4095, 9000, 16000] {
            let got = rotated(backend, &x, position, Some(yarn));
            let want = reference(&wide, f64::from(position), 1.0, attn_factor);
            // f32 angles of a running product: about an ulp per pair times the position.
            let tolerance = 1e-5 + 4e-7 * f64::from(position);
            for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
                assert!(
                    (f64::from(g) - w).abs() <= tolerance,
                    "position {position} dim {i}: {g} vs {w}"
                );
            }
            // Not plain linear scaling: the high-frequency dims extrapolate.
            let plain = reference(
                &wide,
                f64::from(position),
                0.0,
                1.0 / (1.0 + 0.1 * FACTOR.ln()),
            );
            if position >= 100 {
                let apart = want
                    .iter()
                    .zip(&plain)
                    .map(|(a, b)| (a - b).abs())
                    .fold(0.0, f64::max);
                assert!(apart > 100.0 * tolerance, "position {position}: {apart}");
            }
        }
    }
}

#[test]
fn a_magnitude_factor_alone_scales_plain_rope() {
    let x: Vec<f32> = (0..ROTARY_DIM).map(|i| ((i as f32) * 0.3).cos()).collect();
    let backend = CpuBackend::new(1).expect("backend");
    let scale = Yarn {
        ext_factor: 0.0,
        attn_factor: 0.5,
        beta_fast: BETA_FAST as f32,
        beta_slow: BETA_SLOW as f32,
        original_context: ORIGINAL_CONTEXT as u32,
    };
    let plain = rotated(&backend, &x, 321, None);
    let scaled = rotated(&backend, &x, 321, Some(scale));
    for (p, s) in plain.iter().zip(&scaled) {
        assert!((p * 0.5 - s).abs() <= 1e-6, "{p} vs {s}");
    }
}
