//! Joins the parts of a split GGUF (`NAME-00001-of-0000N.gguf`, as llama.cpp's gguf-split
//! writes them) into one file, as `llama-gguf-split --merge` does: the first part's metadata
//! without the `split.*` keys, then every part's tensors in order.

use std::borrow::Cow;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use runit_gguf::{GgufFile, GgufWriter, TensorInfo};

/// The keys that describe the split, left out of the merged file.
const SPLIT_KEYS: [&str; 3] = ["split.no", "split.count", "split.tensors.count"];

/// Writes the parts (in order) as one GGUF at `output` (through a temporary file).
pub fn merge_parts(parts: &[PathBuf], output: &Path) -> Result<()> {
    let files: Vec<GgufFile> = parts
        .iter()
        .map(|path| GgufFile::open(path).with_context(|| format!("reading {}", path.display())))
        .collect::<Result<_>>()?;
    for (index, (file, path)) in files.iter().zip(parts).enumerate() {
        let number = file.get_u32_opt("split.no")?;
        let count = file.get_u32_opt("split.count")?;
        if number != Some(index as u32) || count != Some(parts.len() as u32) {
            bail!(
                "{}: split.no {number:?} of split.count {count:?}, expected part {index} of {}",
                path.display(),
                parts.len()
            );
        }
    }
    let expected: Option<u32> = files[0].get_u32_opt("split.tensors.count")?;
    let tensors: Vec<(&GgufFile, &TensorInfo)> = files
        .iter()
        .flat_map(|file| file.tensors().iter().map(move |info| (file, info)))
        .collect();
    if let Some(expected) = expected.filter(|&count| count as usize != tensors.len()) {
        bail!(
            "the parts hold {} tensors but split.tensors.count says {expected}",
            tensors.len()
        );
    }
    let mut writer = GgufWriter::new();
    for (key, value) in files[0].metadata() {
        if !SPLIT_KEYS.contains(&key.as_str()) {
            writer.add_metadata(key.clone(), value.clone())?;
        }
    }
    for (_, info) in &tensors {
        writer.add_tensor(info.name.clone(), info.ty, info.shape.clone())?;
    }
    writer
        .write_to_path(output, |index, _| {
            let (file, info) = tensors[index];
            Ok(Cow::Borrowed(file.tensor_data(info)))
        })
        .with_context(|| format!("writing {}", output.display()))?;
    Ok(())
}
