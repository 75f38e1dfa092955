//! Typed reads of a file's `{arch}.*` metadata keys; every error names the whole key.

use runit_gguf::{GgufFile, Value};

use crate::ModelError;

/// The keys of one file under one architecture's prefix.
pub(crate) struct Keys<'a> {
    pub file: &'a GgufFile,
    /// `general.architecture`: the prefix of every key read here.
    pub arch: &'static str,
}

impl Keys<'_> {
    /// The whole key of `suffix` (`qwen2.rope.freq_base`).
    pub fn key(&self, suffix: &str) -> String {
        format!("{}.{suffix}", self.arch)
    }

    /// A count that must be present: between 1 and 2^32.
    pub fn required(&self, suffix: &str) -> Result<usize, ModelError> {
        let key = self.key(suffix);
        let value = self.file.get_u64(&key)?;
        positive(&key, value)
    }

    /// A count between 1 and 2^32, when present.
    pub fn optional(&self, suffix: &str) -> Result<Option<usize>, ModelError> {
        let key = self.key(suffix);
        match self.file.get_u64_opt(&key)? {
            Some(v) => Ok(Some(positive(&key, v)?)),
            None => Ok(None),
        }
    }

    /// A positive finite number, when present.
    pub fn float(&self, suffix: &str) -> Result<Option<f32>, ModelError> {
        let key = self.key(suffix);
        match self.file.get_f32_opt(&key)? {
            Some(v) if !v.is_finite() || v <= 0.0 => Err(bad(
                key,
                format!("must be a positive finite number, found {v}"),
            )),
            other => Ok(other),
        }
    }

    /// Any number, when present.
    pub fn any_float(&self, suffix: &str) -> Result<Option<f32>, ModelError> {
        Ok(self.file.get_f32_opt(&self.key(suffix))?)
    }

    /// Any unsigned integer, when present.
    pub fn unsigned(&self, suffix: &str) -> Result<Option<u64>, ModelError> {
        Ok(self.file.get_u64_opt(&self.key(suffix))?)
    }

    /// A string, when present.
    pub fn string(&self, suffix: &str) -> Result<Option<&str>, ModelError> {
        Ok(self.file.get_str_opt(&self.key(suffix))?)
    }

    /// A boolean, when present.
    pub fn boolean(&self, suffix: &str) -> Result<Option<bool>, ModelError> {
        Ok(self.file.get_bool_opt(&self.key(suffix))?)
    }

    /// The raw value, when present.
    pub fn value(&self, suffix: &str) -> Option<&Value> {
        self.file.get(&self.key(suffix))
    }

    /// The refusal of `value` at `suffix`, naming the values the engine implements.
    pub fn unsupported(&self, suffix: &str, value: String, supported: &str) -> ModelError {
        ModelError::UnsupportedMetadata {
            key: self.key(suffix),
            value,
            supported: supported.to_string(),
        }
    }
}

fn positive(key: &str, value: u64) -> Result<usize, ModelError> {
    if value == 0 || value > (1 << 32) {
        return Err(bad(
            key.to_string(),
            format!("must be between 1 and 2^32, found {value}"),
        ));
    }
    Ok(value as usize)
}

/// A hyperparameter outside its range.
pub(crate) fn bad(key: String, message: String) -> ModelError {
    ModelError::BadHyperparameter { key, message }
}
