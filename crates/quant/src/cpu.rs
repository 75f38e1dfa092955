//! Which x86 instruction-set extensions RunIT may use: those this CPU has, no more than the
//! measuring cap `RUNIT_CPU_ISA` allows. Every runtime feature check in the workspace asks
//! [`may_use`] or [`may_use_all`] (the dot kernels, quantizers, the CPU backend's vector,
//! attention, RoPE and TurboQuant kernels, the host's greedy pick), so one variable restricts
//! every kernel choice. Results do not change with it (each fast kernel is bit-identical to
//! the twin chosen in its place), except F16's one-row sums below AVX-512 (next paragraph).
//!
//! `RUNIT_CPU_ISA` takes one of [`IsaCap`]'s names:
//! - `avx2`: AVX2, FMA and F16C only (a proxy for an AVX2-only CPU, where llama.cpp runs its
//!   `haswell` variant);
//! - `avx2-vnni`: those and AVX-VNNI (the 256-bit VEX `vpdpbusd`);
//! - `avx512`: no cap (every extension this CPU has), as when the variable is unset or empty.
//!
//! Any other value is an error ([`cap`] returns it, [`may_use`] panics with it), never
//! ignored. `RUNIT_CPU_NO_AVX512FP16` (the older knob, still read) withholds AVX512-FP16
//! alone, whatever the cap.
//!
//! One choice of arithmetic is not a matter of extensions: on CPUs without AVX-512 the F16
//! kernels sum one activation row as llama.cpp's AVX2 build does (f32 lanes), unless
//! `RUNIT_CPU_F16_REFERENCE` is set ([`f16_reference`]; `dot::HalfSums` says more).
//!
//! ```
//! use runit_quant::cpu::{may_use, may_use_all, Feature, AVX2};
//! // AVX-512 F implies what the AVX2 kernels need, under any cap.
//! assert!(!may_use(Feature::Avx512F) || may_use_all(&AVX2));
//! ```

use std::sync::OnceLock;

/// The environment variable that caps the extensions RunIT uses.
pub const ISA_VARIABLE: &str = "RUNIT_CPU_ISA";
/// The older environment variable that withholds AVX512-FP16 alone (set = withheld).
pub const NO_FP16_VARIABLE: &str = "RUNIT_CPU_NO_AVX512FP16";

/// An x86 extension some RunIT kernel is compiled for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Feature {
    /// 256-bit integer vectors.
    Avx2,
    /// Fused multiply-add.
    Fma,
    /// f16 <-> f32 conversions (`vcvtph2ps`, `vcvtps2ph`).
    F16c,
    /// 256-bit VEX `vpdpbusd` (Alder Lake and later).
    AvxVnni,
    /// AVX-512 Foundation.
    Avx512F,
    /// AVX-512 byte and word instructions.
    Avx512Bw,
    /// AVX-512 instructions on 128- and 256-bit registers.
    Avx512Vl,
    /// AVX-512 doubleword and quadword instructions.
    Avx512Dq,
    /// AVX-512 `vpdpbusd`.
    Avx512Vnni,
    /// AVX-512 byte permutes and `vpmultishiftqb`.
    Avx512Vbmi,
    /// AVX-512 BF16 (`vdpbf16ps`).
    Avx512Bf16,
    /// AVX-512 f16 arithmetic (`vfmadd…ph`).
    Avx512Fp16,
}

/// What the AVX2 kernels need: AVX2, FMA and F16C.
pub const AVX2: [Feature; 3] = [Feature::Avx2, Feature::Fma, Feature::F16c];
/// What every 512-bit kernel needs at least: AVX-512 F, BW and VL.
pub const AVX512: [Feature; 3] = [Feature::Avx512F, Feature::Avx512Bw, Feature::Avx512Vl];

impl Feature {
    /// Every feature, in the order of [`Feature::name`]'s listing.
    pub const ALL: [Feature; 12] = [
        Feature::Avx2,
        Feature::Fma,
        Feature::F16c,
        Feature::AvxVnni,
        Feature::Avx512F,
        Feature::Avx512Bw,
        Feature::Avx512Vl,
        Feature::Avx512Dq,
        Feature::Avx512Vnni,
        Feature::Avx512Vbmi,
        Feature::Avx512Bf16,
        Feature::Avx512Fp16,
    ];

    /// The name `is_x86_feature_detected!` and `#[target_feature]` give it.
    pub fn name(self) -> &'static str {
        match self {
            Feature::Avx2 => "avx2",
            Feature::Fma => "fma",
            Feature::F16c => "f16c",
            Feature::AvxVnni => "avxvnni",
            Feature::Avx512F => "avx512f",
            Feature::Avx512Bw => "avx512bw",
            Feature::Avx512Vl => "avx512vl",
            Feature::Avx512Dq => "avx512dq",
            Feature::Avx512Vnni => "avx512vnni",
            Feature::Avx512Vbmi => "avx512vbmi",
            Feature::Avx512Bf16 => "avx512bf16",
            Feature::Avx512Fp16 => "avx512fp16",
        }
    }

    /// True when this CPU has it (whatever the cap).
    pub fn is_detected(self) -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            match self {
                Feature::Avx2 => is_x86_feature_detected!("avx2"),
                Feature::Fma => is_x86_feature_detected!("fma"),
                Feature::F16c => is_x86_feature_detected!("f16c"),
                Feature::AvxVnni => is_x86_feature_detected!("avxvnni"),
                Feature::Avx512F => is_x86_feature_detected!("avx512f"),
                Feature::Avx512Bw => is_x86_feature_detected!("avx512bw"),
                Feature::Avx512Vl => is_x86_feature_detected!("avx512vl"),
                Feature::Avx512Dq => is_x86_feature_detected!("avx512dq"),
                Feature::Avx512Vnni => is_x86_feature_detected!("avx512vnni"),
                Feature::Avx512Vbmi => is_x86_feature_detected!("avx512vbmi"),
                Feature::Avx512Bf16 => is_x86_feature_detected!("avx512bf16"),
                Feature::Avx512Fp16 => is_x86_feature_detected!("avx512fp16"),
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            let _ = self;
            false
        }
    }

    fn bit(self) -> u32 {
        1 << self as u32
    }
}

/// The environment variable that keeps the reference machine's F16 sums on CPUs without
/// AVX-512 (set = kept; see [`f16_reference`]).
pub const F16_REFERENCE_VARIABLE: &str = "RUNIT_CPU_F16_REFERENCE";

/// True when `RUNIT_CPU_F16_REFERENCE` is set (to anything but the empty string): the F16
/// kernels then sum as the machine that made the goldens (AVX512-FP16's f16 arithmetic,
/// emulated exactly where the CPU lacks it) at every SIMD level, instead of in llama.cpp's
/// AVX2 order at the AVX2 levels. Read once.
pub fn f16_reference() -> bool {
    *F16_REFERENCE
        .get_or_init(|| std::env::var_os(F16_REFERENCE_VARIABLE).is_some_and(|v| !v.is_empty()))
}

/// Asks for the reference F16 sums in this process, as `RUNIT_CPU_F16_REFERENCE` does (for
/// programs that compare with the goldens). Takes effect only before the first F16 kernel
/// choice; returns whether the reference sums are in effect.
pub fn keep_f16_reference() -> bool {
    *F16_REFERENCE.get_or_init(|| true)
}

static F16_REFERENCE: OnceLock<bool> = OnceLock::new();

/// A cap on the extensions RunIT uses (`RUNIT_CPU_ISA`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IsaCap {
    /// AVX2, FMA and F16C only.
    Avx2,
    /// AVX2, FMA, F16C and AVX-VNNI.
    Avx2Vnni,
    /// Every extension (no cap).
    Avx512,
}

impl IsaCap {
    /// Every cap, narrowest first.
    pub const ALL: [IsaCap; 3] = [IsaCap::Avx2, IsaCap::Avx2Vnni, IsaCap::Avx512];

    /// The value of `RUNIT_CPU_ISA` that selects it.
    pub fn name(self) -> &'static str {
        match self {
            IsaCap::Avx2 => "avx2",
            IsaCap::Avx2Vnni => "avx2-vnni",
            IsaCap::Avx512 => "avx512",
        }
    }

    /// The cap named `value` (one of [`IsaCap::name`]'s, ASCII case ignored).
    pub fn parse(value: &str) -> Result<IsaCap, IsaCapError> {
        IsaCap::ALL
            .into_iter()
            .find(|cap| cap.name().eq_ignore_ascii_case(value.trim()))
            .ok_or_else(|| IsaCapError {
                value: value.to_string(),
            })
    }

    /// True when this cap lets RunIT use `feature` (where the CPU has it).
    pub fn allows(self, feature: Feature) -> bool {
        match self {
            IsaCap::Avx2 => AVX2.contains(&feature),
            IsaCap::Avx2Vnni => AVX2.contains(&feature) || feature == Feature::AvxVnni,
            IsaCap::Avx512 => true,
        }
    }
}

/// `RUNIT_CPU_ISA` holds a value that names no [`IsaCap`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{ISA_VARIABLE}={value:?} is not a known cap: expected one of {accepted} (or unset for no cap)", accepted = accepted_names())]
pub struct IsaCapError {
    /// The value found.
    pub value: String,
}

fn accepted_names() -> String {
    IsaCap::ALL.map(IsaCap::name).join(", ")
}

/// The cap `RUNIT_CPU_ISA` sets, read once: `None` when it is unset or empty.
pub fn cap() -> Result<Option<IsaCap>, IsaCapError> {
    static CAP: OnceLock<Result<Option<IsaCap>, IsaCapError>> = OnceLock::new();
    CAP.get_or_init(|| match std::env::var_os(ISA_VARIABLE) {
        None => Ok(None),
        Some(value) if value.is_empty() => Ok(None),
        Some(value) => match value.to_str() {
            Some(text) => IsaCap::parse(text).map(Some),
            None => Err(IsaCapError {
                value: value.to_string_lossy().into_owned(),
            }),
        },
    })
    .clone()
}

/// `RUNIT_CPU_ISA=NAME` when a cap is set (for reports), `None` without one or with an
/// unknown value.
pub fn cap_setting() -> Option<String> {
    let cap = cap().ok().flatten()?;
    Some(format!("{ISA_VARIABLE}={}", cap.name()))
}

/// True when RunIT may use `feature`: this CPU has it, the cap allows it and, for
/// AVX512-FP16, `RUNIT_CPU_NO_AVX512FP16` is unset. Decided once; cheap afterwards.
///
/// Panics with [`IsaCapError`]'s message when `RUNIT_CPU_ISA` names no cap (a program that
/// wants to report it as an error calls [`cap`] first).
pub fn may_use(feature: Feature) -> bool {
    usable_bits() & feature.bit() != 0
}

/// True when RunIT may use every one of `features` ([`may_use`]).
pub fn may_use_all(features: &[Feature]) -> bool {
    features.iter().all(|&feature| may_use(feature))
}

/// The features RunIT may use, in [`Feature::ALL`]'s order.
pub fn usable() -> Vec<Feature> {
    Feature::ALL
        .into_iter()
        .filter(|&feature| may_use(feature))
        .collect()
}

fn usable_bits() -> u32 {
    static BITS: OnceLock<u32> = OnceLock::new();
    *BITS.get_or_init(|| {
        let cap = cap().unwrap_or_else(|error| panic!("{error}"));
        let no_fp16 = std::env::var_os(NO_FP16_VARIABLE).is_some();
        Feature::ALL
            .into_iter()
            .filter(|&feature| feature.is_detected())
            .filter(|&feature| cap.is_none_or(|cap| cap.allows(feature)))
            .filter(|&feature| !(no_fp16 && feature == Feature::Avx512Fp16))
            .fold(0, |bits, feature| bits | feature.bit())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_cap_parses_from_its_name_and_nothing_else_does() {
        for cap in IsaCap::ALL {
            assert_eq!(IsaCap::parse(cap.name()), Ok(cap));
            assert_eq!(IsaCap::parse(&cap.name().to_uppercase()), Ok(cap));
        }
        let error = IsaCap::parse("avx3").expect_err("no such cap");
        assert_eq!(
            error.to_string(),
            "RUNIT_CPU_ISA=\"avx3\" is not a known cap: expected one of avx2, avx2-vnni, \
             avx512 (or unset for no cap)"
        );
        assert!(IsaCap::parse("").is_err());
    }

    #[test]
    fn caps_allow_exactly_their_features() {
        let allowed = |cap: IsaCap| -> Vec<&str> {
            Feature::ALL
                .into_iter()
                .filter(|&f| cap.allows(f))
                .map(Feature::name)
                .collect()
        };
        assert_eq!(allowed(IsaCap::Avx2), ["avx2", "fma", "f16c"]);
        assert_eq!(
            allowed(IsaCap::Avx2Vnni),
            ["avx2", "fma", "f16c", "avxvnni"]
        );
        assert_eq!(allowed(IsaCap::Avx512).len(), Feature::ALL.len());
    }

    /// Whatever `RUNIT_CPU_ISA` this test runs under: a feature is used only where the CPU
    /// has it and the cap allows it, and every such feature is used.
    #[test]
    fn usable_features_are_the_detected_ones_the_cap_allows() {
        let cap = cap().expect("the tests run with no cap or a known one");
        let no_fp16 = std::env::var_os(NO_FP16_VARIABLE).is_some();
        for feature in Feature::ALL {
            let expected = feature.is_detected()
                && cap.is_none_or(|cap| cap.allows(feature))
                && !(no_fp16 && feature == Feature::Avx512Fp16);
            assert_eq!(may_use(feature), expected, "{}", feature.name());
        }
    }
}
