//! The quantization presets `runit quantize` accepts: llama.cpp's `llama_ftype` file types,
//! each with the ggml type most tensors get and the number stored in `general.file_type`.

use std::fmt;
use std::str::FromStr;

use runit_quant::GgmlType;

/// A file type preset, named as `llama-quantize` names it (`Q4_K_M`, `Q8_0`, `F16`).
#[allow(non_camel_case_types)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Preset {
    F32,
    F16,
    BF16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q2_K,
    Q3_K_S,
    Q3_K_M,
    Q3_K_L,
    Q4_K_S,
    Q4_K_M,
    Q5_K_S,
    Q5_K_M,
    Q6_K,
    IQ4_NL,
    IQ4_XS,
}

/// Every preset, in the order `--help` and error messages list them.
pub const ALL_PRESETS: [Preset; 19] = [
    Preset::Q4_0,
    Preset::Q4_1,
    Preset::Q5_0,
    Preset::Q5_1,
    Preset::Q8_0,
    Preset::Q2_K,
    Preset::Q3_K_S,
    Preset::Q3_K_M,
    Preset::Q3_K_L,
    Preset::Q4_K_S,
    Preset::Q4_K_M,
    Preset::Q5_K_S,
    Preset::Q5_K_M,
    Preset::Q6_K,
    Preset::IQ4_NL,
    Preset::IQ4_XS,
    Preset::F16,
    Preset::BF16,
    Preset::F32,
];

/// Short names `llama-quantize` also accepts: the `_M` variant of each K-quant family.
const ALIASES: [(&str, Preset); 3] = [
    ("Q3_K", Preset::Q3_K_M),
    ("Q4_K", Preset::Q4_K_M),
    ("Q5_K", Preset::Q5_K_M),
];

impl Preset {
    /// The preset's name as `llama-quantize` spells it.
    pub fn name(self) -> &'static str {
        match self {
            Preset::F32 => "F32",
            Preset::F16 => "F16",
            Preset::BF16 => "BF16",
            Preset::Q4_0 => "Q4_0",
            Preset::Q4_1 => "Q4_1",
            Preset::Q5_0 => "Q5_0",
            Preset::Q5_1 => "Q5_1",
            Preset::Q8_0 => "Q8_0",
            Preset::Q2_K => "Q2_K",
            Preset::Q3_K_S => "Q3_K_S",
            Preset::Q3_K_M => "Q3_K_M",
            Preset::Q3_K_L => "Q3_K_L",
            Preset::Q4_K_S => "Q4_K_S",
            Preset::Q4_K_M => "Q4_K_M",
            Preset::Q5_K_S => "Q5_K_S",
            Preset::Q5_K_M => "Q5_K_M",
            Preset::Q6_K => "Q6_K",
            Preset::IQ4_NL => "IQ4_NL",
            Preset::IQ4_XS => "IQ4_XS",
        }
    }

    /// llama.cpp's `llama_ftype` number, written to `general.file_type`.
    pub fn file_type(self) -> u32 {
        match self {
            Preset::F32 => 0,
            Preset::F16 => 1,
            Preset::Q4_0 => 2,
            Preset::Q4_1 => 3,
            Preset::Q8_0 => 7,
            Preset::Q5_0 => 8,
            Preset::Q5_1 => 9,
            Preset::Q2_K => 10,
            Preset::Q3_K_S => 11,
            Preset::Q3_K_M => 12,
            Preset::Q3_K_L => 13,
            Preset::Q4_K_S => 14,
            Preset::Q4_K_M => 15,
            Preset::Q5_K_S => 16,
            Preset::Q5_K_M => 17,
            Preset::Q6_K => 18,
            Preset::IQ4_NL => 25,
            Preset::IQ4_XS => 30,
            Preset::BF16 => 32,
        }
    }

    /// The type a weight matrix gets unless a mixture rule or a fallback says otherwise.
    pub fn default_type(self) -> GgmlType {
        match self {
            Preset::F32 => GgmlType::F32,
            Preset::F16 => GgmlType::F16,
            Preset::BF16 => GgmlType::BF16,
            Preset::Q4_0 => GgmlType::Q4_0,
            Preset::Q4_1 => GgmlType::Q4_1,
            Preset::Q5_0 => GgmlType::Q5_0,
            Preset::Q5_1 => GgmlType::Q5_1,
            Preset::Q8_0 => GgmlType::Q8_0,
            Preset::Q2_K => GgmlType::Q2_K,
            Preset::Q3_K_S | Preset::Q3_K_M | Preset::Q3_K_L => GgmlType::Q3_K,
            Preset::Q4_K_S | Preset::Q4_K_M => GgmlType::Q4_K,
            Preset::Q5_K_S | Preset::Q5_K_M => GgmlType::Q5_K,
            Preset::Q6_K => GgmlType::Q6_K,
            Preset::IQ4_NL => GgmlType::IQ4_NL,
            Preset::IQ4_XS => GgmlType::IQ4_XS,
        }
    }

    /// All accepted spellings, for error messages: `Q4_0, Q4_1, ..., F32 (aliases: Q4_K = Q4_K_M, ...)`.
    pub fn valid_names() -> String {
        let names: Vec<&str> = ALL_PRESETS.iter().map(|preset| preset.name()).collect();
        let aliases: Vec<String> = ALIASES
            .iter()
            .map(|(alias, preset)| format!("{alias} = {}", preset.name()))
            .collect();
        format!("{} (aliases: {})", names.join(", "), aliases.join(", "))
    }
}

impl fmt::Display for Preset {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The error for a preset name that is not in the table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownPreset(pub String);

impl fmt::Display for UnknownPreset {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "unknown quantization type `{}`; valid types: {}",
            self.0,
            Preset::valid_names()
        )
    }
}

impl std::error::Error for UnknownPreset {}

impl FromStr for Preset {
    type Err = UnknownPreset;

    /// Parses a preset name case-insensitively, or the `llama_ftype` number as `llama-quantize` does.
    fn from_str(text: &str) -> Result<Preset, UnknownPreset> {
        let by_name = ALL_PRESETS
            .iter()
            .copied()
            .find(|preset| preset.name().eq_ignore_ascii_case(text));
        let by_alias = || {
            ALIASES
                .iter()
                .find(|(alias, _)| alias.eq_ignore_ascii_case(text))
                .map(|(_, preset)| *preset)
        };
        let by_number = || {
            let number: u32 = text.parse().ok()?;
            ALL_PRESETS
                .iter()
                .copied()
                .find(|preset| preset.file_type() == number)
        };
        by_name
            .or_else(by_alias)
            .or_else(by_number)
            .ok_or_else(|| UnknownPreset(text.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_aliases_and_numbers_parse() {
        for preset in ALL_PRESETS {
            assert_eq!(preset.name().parse::<Preset>(), Ok(preset));
            assert_eq!(preset.name().to_lowercase().parse::<Preset>(), Ok(preset));
            assert_eq!(preset.file_type().to_string().parse::<Preset>(), Ok(preset));
        }
        assert_eq!("q4_k".parse::<Preset>(), Ok(Preset::Q4_K_M));
        let error = "Q7_0".parse::<Preset>().expect_err("Q7_0 is not a preset");
        let message = error.to_string();
        assert!(message.contains("Q7_0") && message.contains("Q4_K_M") && message.contains("BF16"));
    }
}
