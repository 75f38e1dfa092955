//! Models by name: `OWNER/NAME[:QUANT]` references resolved against the Hugging Face Hub
//! (`client`), the GGUF file a quant tag picks (`select`), and the local cache they are
//! downloaded into (`cache`). `runit pull`, `-hf` and `-m NAME` all come here.

pub mod cache;
pub mod client;
pub mod merge;
pub mod select;

use std::path::PathBuf;

use anyhow::{Context, Result};

use cache::{CachedFile, CachedModel};
use client::Hub;
use select::ModelReference;

/// The revision pulled when none is named.
pub const DEFAULT_REVISION: &str = "main";

/// Downloads the model `reference` names (every part of a split one) into the cache, unless
/// the cache already holds it with the repository's checksums, and returns it.
pub fn pull(reference: &ModelReference, revision: &str) -> Result<CachedModel> {
    let hub = Hub::from_env();
    let root = cache::cache_root()?;
    let listing = hub.list_files(&reference.repo, revision)?;
    let paths: Vec<String> = listing.iter().map(|file| file.path.clone()).collect();
    let models = select::group_models(&paths)?;
    let chosen = select::pick(&reference.repo, &models, reference.quant.as_deref())?;
    let folder = cache::model_folder(&root, &reference.repo, &chosen.quant);
    let remote: Vec<&client::RemoteFile> = chosen
        .paths
        .iter()
        .map(|path| {
            listing
                .iter()
                .find(|file| file.path == *path)
                .expect("the chosen paths come from the listing")
        })
        .collect();
    let files: Vec<CachedFile> = remote
        .iter()
        .map(|file| CachedFile {
            name: file_name(&file.path).to_string(),
            size: file.size,
            sha256: file.sha256.clone(),
        })
        .collect();
    let mut model = CachedModel {
        repo: reference.repo.clone(),
        quant: chosen.quant.clone(),
        revision: revision.to_string(),
        files,
        parts: Vec::new(),
        folder: folder.clone(),
    };
    if let Ok(Some(cached)) = cache::find(&root, &model.name()) {
        if same_files(&cached, &model) {
            eprintln!(
                "{} is up to date ({})",
                model.name(),
                cached.path().display()
            );
            return Ok(cached);
        }
    }
    std::fs::create_dir_all(&folder)
        .with_context(|| format!("cannot create {}", folder.display()))?;
    // A manifest of an older version of the model must not vouch for files being replaced.
    let _ = std::fs::remove_file(folder.join("manifest.json"));
    for file in &remote {
        eprintln!(
            "downloading {}/{} ({})",
            reference.repo,
            file.path,
            crate::units::human_bytes(file.size)
        );
        hub.download(
            &reference.repo,
            revision,
            file,
            &folder.join(file_name(&file.path)),
        )?;
    }
    if model.files.len() > 1 {
        model = merge_split(model)?;
    }
    model.write_manifest()?;
    eprintln!("{} -> {}", model.name(), model.path().display());
    Ok(model)
}

/// The model file `-m VALUE` means: a path when one exists, else a cached model's name.
pub fn resolve_model(value: &str) -> Result<PathBuf> {
    let path = PathBuf::from(value);
    if path.exists() {
        return Ok(path);
    }
    let root = cache::cache_root()?;
    match cache::find(&root, value)? {
        Some(model) => Ok(model.path()),
        None => anyhow::bail!(
            "{value}: no such file, and no cached model has that name (`runit list` shows the \
             cached ones; `runit pull OWNER/NAME[:QUANT]` or `-hf` downloads one)"
        ),
    }
}

/// The model file of `-hf OWNER/NAME[:QUANT]`: the cached copy when there is one, else pulled.
pub fn resolve_hub_model(text: &str) -> Result<PathBuf> {
    let reference = ModelReference::parse(text)?;
    let root = cache::cache_root()?;
    let cached = match &reference.quant {
        Some(_) => cache::find(&root, text)?,
        None => cache::find(
            &root,
            &format!("{}:{}", reference.repo, select::DEFAULT_QUANT),
        )?
        .or(cache::find(&root, &reference.repo).ok().flatten()),
    };
    match cached {
        Some(model) => Ok(model.path()),
        None => Ok(pull(&reference, DEFAULT_REVISION)?.path()),
    }
}

/// Joins a split model's downloaded parts into one file (RunIT loads single files), records
/// the parts as its source and deletes them.
fn merge_split(model: CachedModel) -> Result<CachedModel> {
    let first = &model.files[0].name;
    let stem = first.strip_suffix(".gguf").unwrap_or(first);
    let base = stem
        .rsplit_once("-of-")
        .and_then(|(rest, _)| rest.rsplit_once('-'))
        .map_or(stem, |(base, _)| base);
    let merged = format!("{base}.gguf");
    let parts: Vec<PathBuf> = model
        .files
        .iter()
        .map(|file| model.folder.join(&file.name))
        .collect();
    eprintln!("joining {} parts into {merged}", parts.len());
    let output = model.folder.join(&merged);
    merge::merge_parts(&parts, &output)?;
    let size = std::fs::metadata(&output)
        .with_context(|| format!("reading {}", output.display()))?
        .len();
    let sha256 = cache::file_sha256(&output)?;
    for part in &parts {
        std::fs::remove_file(part).with_context(|| format!("cannot delete {}", part.display()))?;
    }
    Ok(CachedModel {
        files: vec![CachedFile {
            name: merged,
            size,
            sha256: Some(sha256),
        }],
        parts: model.files,
        ..model
    })
}

/// True when the cached copy came from the same repository files (same names, sizes and
/// checksums) and its files are all present.
fn same_files(cached: &CachedModel, wanted: &CachedModel) -> bool {
    let source = if cached.parts.is_empty() {
        &cached.files
    } else {
        &cached.parts
    };
    source.len() == wanted.files.len()
        && source.iter().zip(&wanted.files).all(|(have, want)| {
            have.name == want.name && have.size == want.size && have.sha256 == want.sha256
        })
        && cached.files.iter().all(|file| {
            std::fs::metadata(cached.folder.join(&file.name))
                .is_ok_and(|meta| meta.len() == file.size)
        })
}

/// The last component of a repository path.
fn file_name(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}
