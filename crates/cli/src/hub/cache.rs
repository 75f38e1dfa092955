//! The local model cache: `$RUNIT_HOME/models` (default `~/.cache/runit/models`), one folder
//! per model (`OWNER/NAME/QUANT/`) holding its GGUF files and a `manifest.json` written last,
//! so a folder without a manifest (an interrupted pull) is never taken for a model.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use serde_json::json;
use sha2::{Digest, Sha256};

use super::client::hex;

const MANIFEST: &str = "manifest.json";

/// RunIT's own folder: `$RUNIT_HOME`, else `$XDG_CACHE_HOME/runit`, else `~/.cache/runit`.
pub fn runit_home() -> Result<PathBuf> {
    let variable = |name: &str| std::env::var_os(name).filter(|value| !value.is_empty());
    if let Some(home) = variable("RUNIT_HOME") {
        return Ok(PathBuf::from(home));
    }
    if let Some(cache) = variable("XDG_CACHE_HOME") {
        return Ok(PathBuf::from(cache).join("runit"));
    }
    match variable("HOME") {
        Some(home) => Ok(PathBuf::from(home).join(".cache/runit")),
        None => bail!("neither RUNIT_HOME nor HOME is set; set RUNIT_HOME to a folder for models"),
    }
}

/// The cache's root folder: `models/` in [`runit_home`].
pub fn cache_root() -> Result<PathBuf> {
    Ok(runit_home()?.join("models"))
}

/// A file of a cached model, with the checksum it was verified against.
#[derive(Clone, Debug)]
pub struct CachedFile {
    /// File name inside the model's folder.
    pub name: String,
    pub size: u64,
    /// sha256 (hex), when the repository gave one.
    pub sha256: Option<String>,
}

/// A model in the cache.
#[derive(Clone, Debug)]
pub struct CachedModel {
    /// `OWNER/NAME` on the hub.
    pub repo: String,
    /// The quant tag (`Q4_K_M`), also the folder's name.
    pub quant: String,
    pub revision: String,
    /// The files, the model's first (the one to open) first.
    pub files: Vec<CachedFile>,
    /// The repository's parts of a split model that were merged into `files[0]` (whose
    /// checksum was then computed here); empty for a model pulled as one file.
    pub parts: Vec<CachedFile>,
    /// The model's folder.
    pub folder: PathBuf,
}

impl CachedModel {
    /// `OWNER/NAME:QUANT`, the name `runit list` shows and `-m` and `runit rm` take.
    pub fn name(&self) -> String {
        format!("{}:{}", self.repo, self.quant)
    }

    /// The file to open.
    pub fn path(&self) -> PathBuf {
        self.folder.join(&self.files[0].name)
    }

    /// Bytes on disk.
    pub fn size(&self) -> u64 {
        self.files.iter().map(|file| file.size).sum()
    }

    /// Writes the manifest (through a temporary file, so it appears whole or not at all).
    pub fn write_manifest(&self) -> Result<()> {
        let entries = |files: &[CachedFile]| -> Vec<serde_json::Value> {
            files
                .iter()
                .map(|file| json!({"name": file.name, "size": file.size, "sha256": file.sha256}))
                .collect()
        };
        let manifest = json!({
            "repo": self.repo,
            "quant": self.quant,
            "revision": self.revision,
            "files": entries(&self.files),
            "merged_from": entries(&self.parts),
        });
        let path = self.folder.join(MANIFEST);
        let temporary = self.folder.join(format!("{MANIFEST}.tmp"));
        std::fs::write(&temporary, serde_json::to_vec_pretty(&manifest)?)
            .with_context(|| format!("cannot write {}", temporary.display()))?;
        std::fs::rename(&temporary, &path)
            .with_context(|| format!("cannot write {}", path.display()))
    }

    /// Checks every file's size and sha256; returns the problems found (none when sound).
    pub fn verify(&self) -> Vec<String> {
        let mut problems = Vec::new();
        for file in &self.files {
            let path = self.folder.join(&file.name);
            match std::fs::metadata(&path) {
                Err(error) => problems.push(format!("{}: {error}", path.display())),
                Ok(meta) if meta.len() != file.size => problems.push(format!(
                    "{}: {} bytes, expected {}",
                    path.display(),
                    meta.len(),
                    file.size
                )),
                Ok(_) => {
                    let Some(want) = &file.sha256 else { continue };
                    match file_sha256(&path) {
                        Ok(got) if got == *want => {}
                        Ok(got) => problems
                            .push(format!("{}: sha256 {got}, expected {want}", path.display())),
                        Err(error) => problems.push(format!("{}: {error:#}", path.display())),
                    }
                }
            }
        }
        problems
    }
}

/// The folder of `repo`'s `quant` in the cache.
pub fn model_folder(root: &Path, repo: &str, quant: &str) -> PathBuf {
    let quant: String = quant
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "._-".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect();
    root.join(repo).join(quant)
}

/// sha256 (hex) of a file's bytes.
pub fn file_sha256(path: &Path) -> Result<String> {
    let mut file =
        std::fs::File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    let mut hasher = Sha256::new();
    let mut buffer = vec![0u8; 1 << 20];
    loop {
        let read = std::io::Read::read(&mut file, &mut buffer)
            .with_context(|| format!("cannot read {}", path.display()))?;
        if read == 0 {
            return Ok(hex(&hasher.finalize()));
        }
        hasher.update(&buffer[..read]);
    }
}

/// Reads one model folder's manifest.
fn read_manifest(folder: &Path) -> Result<CachedModel> {
    let path = folder.join(MANIFEST);
    let text = std::fs::read_to_string(&path)
        .with_context(|| format!("cannot read {}", path.display()))?;
    let manifest: serde_json::Value =
        serde_json::from_str(&text).with_context(|| format!("{}: not JSON", path.display()))?;
    let field = |key: &str| {
        manifest[key]
            .as_str()
            .map(str::to_string)
            .with_context(|| format!("{}: `{key}` is missing or not a string", path.display()))
    };
    let entries = |key: &str| -> Result<Vec<CachedFile>> {
        let mut files = Vec::new();
        for file in manifest[key].as_array().into_iter().flatten() {
            let (Some(name), Some(size)) = (file["name"].as_str(), file["size"].as_u64()) else {
                bail!(
                    "{}: an entry of `{key}` without `name` or `size`: {file}",
                    path.display()
                );
            };
            files.push(CachedFile {
                name: name.to_string(),
                size,
                sha256: file["sha256"].as_str().map(str::to_string),
            });
        }
        Ok(files)
    };
    let files = entries("files")?;
    let parts = entries("merged_from")?;
    if files.is_empty() {
        bail!("{}: lists no files", path.display());
    }
    Ok(CachedModel {
        repo: field("repo")?,
        quant: field("quant")?,
        revision: field("revision")?,
        files,
        parts,
        folder: folder.to_path_buf(),
    })
}

/// Every model in the cache (folders without a manifest are pulls that did not finish, and
/// are left out), sorted by name. A manifest that cannot be read is reported on stderr.
pub fn list(root: &Path) -> Vec<CachedModel> {
    let mut models = Vec::new();
    let folders = |dir: &Path| -> Vec<PathBuf> {
        std::fs::read_dir(dir)
            .map(|entries| {
                entries
                    .flatten()
                    .map(|entry| entry.path())
                    .filter(|path| path.is_dir())
                    .collect()
            })
            .unwrap_or_default()
    };
    for owner in folders(root) {
        for repo in folders(&owner) {
            for quant in folders(&repo) {
                if !quant.join(MANIFEST).exists() {
                    continue;
                }
                match read_manifest(&quant) {
                    Ok(model) => models.push(model),
                    Err(error) => eprintln!("warning: {error:#}"),
                }
            }
        }
    }
    models.sort_by_key(CachedModel::name);
    models
}

/// The cached model `name` (`OWNER/NAME:QUANT`, or `OWNER/NAME` when one quant of it is
/// cached), or `None` when no cached model has that name. An `OWNER/NAME` with several cached
/// quants is an error listing them.
pub fn find(root: &Path, name: &str) -> Result<Option<CachedModel>> {
    let (repo, quant) = match name.split_once(':') {
        Some((repo, quant)) => (repo, Some(quant)),
        None => (name, None),
    };
    let candidates: Vec<CachedModel> = list(root)
        .into_iter()
        .filter(|model| model.repo.eq_ignore_ascii_case(repo))
        .filter(|model| quant.is_none_or(|quant| model.quant.eq_ignore_ascii_case(quant)))
        .collect();
    match candidates.len() {
        0 => Ok(None),
        1 => Ok(candidates.into_iter().next()),
        _ => bail!(
            "{name} names {} cached models; add the quant: {}",
            candidates.len(),
            candidates
                .iter()
                .map(CachedModel::name)
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

/// Deletes a cached model's folder (and its repository's folders when they are left empty).
pub fn remove(root: &Path, model: &CachedModel) -> Result<()> {
    std::fs::remove_dir_all(&model.folder)
        .with_context(|| format!("cannot delete {}", model.folder.display()))?;
    let mut parent = model.folder.parent();
    while let Some(dir) = parent.filter(|dir| *dir != root && dir.starts_with(root)) {
        if std::fs::remove_dir(dir).is_err() {
            break;
        }
        parent = dir.parent();
    }
    Ok(())
}
