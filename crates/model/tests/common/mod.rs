//! Helpers shared by the model crate's metadata tests.

#![allow(dead_code)]

use std::borrow::Cow;

use runit_gguf::{GgufFile, GgufWriter, Value};
use runit_model::{ModelConfig, ModelError};

/// A tensor-less file of `arch` holding `keys` (suffixes under `{arch}.`).
pub fn metadata_file(arch: &str, keys: Vec<(&str, Value)>) -> GgufFile {
    let mut writer = GgufWriter::new();
    writer
        .add_metadata("general.architecture", Value::String(arch.to_string()))
        .expect("new key");
    for (suffix, value) in keys {
        writer
            .add_metadata(format!("{arch}.{suffix}"), value)
            .expect("new key");
    }
    let mut bytes = Vec::new();
    writer
        .write(&mut bytes, |_, _| Ok(Cow::Borrowed(&[][..])))
        .expect("metadata-only file");
    GgufFile::from_bytes(bytes).expect("the file reads back")
}

/// The configuration of [`metadata_file`]'s file: `defaults`, with `extra` replacing the
/// keys of the same name or adding to them, less the keys of `removed`.
pub fn metadata_config<'a>(
    arch: &str,
    mut defaults: Vec<(&'a str, Value)>,
    extra: &[(&'a str, Value)],
    removed: &[&str],
) -> Result<ModelConfig, ModelError> {
    defaults.retain(|(name, _)| {
        !removed.contains(name) && !extra.iter().any(|(replaced, _)| replaced == name)
    });
    defaults.extend(extra.iter().cloned());
    ModelConfig::from_gguf(&metadata_file(arch, defaults))
}
