//! The Hugging Face Hub over HTTP, as `huggingface_hub` uses it: the file listing from
//! `{endpoint}/api/models/{repo}/tree/{revision}`, files from
//! `{endpoint}/{repo}/resolve/{revision}/{path}` (redirects followed), `HF_TOKEN` as a bearer
//! token and `HF_ENDPOINT` for another host.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use sha2::{Digest, Sha256};

/// The public hub, used when `HF_ENDPOINT` is not set.
const DEFAULT_ENDPOINT: &str = "https://huggingface.co";

/// A file of a repository as the tree listing describes it.
#[derive(Clone, Debug)]
pub struct RemoteFile {
    /// Path in the repository.
    pub path: String,
    /// Size in bytes.
    pub size: u64,
    /// The LFS object's sha256 (hex); files stored in git itself have none.
    pub sha256: Option<String>,
}

/// A connection to one hub endpoint.
pub struct Hub {
    agent: ureq::Agent,
    endpoint: String,
    token: Option<String>,
}

impl Hub {
    /// The hub named by `HF_ENDPOINT` (default huggingface.co), authenticated by `HF_TOKEN`.
    pub fn from_env() -> Hub {
        let endpoint = std::env::var("HF_ENDPOINT")
            .ok()
            .filter(|value| !value.is_empty())
            .unwrap_or_else(|| DEFAULT_ENDPOINT.to_string());
        let token = std::env::var("HF_TOKEN")
            .ok()
            .filter(|value| !value.trim().is_empty());
        Hub::new(endpoint, token)
    }

    /// A hub at `endpoint` (no trailing `/` needed).
    pub fn new(endpoint: String, token: Option<String>) -> Hub {
        let agent = ureq::AgentBuilder::new()
            .redirects(10)
            .timeout_connect(Duration::from_secs(30))
            .timeout_read(Duration::from_secs(120))
            .user_agent(concat!("runit/", env!("CARGO_PKG_VERSION")))
            .build();
        Hub {
            agent,
            endpoint: endpoint.trim_end_matches('/').to_string(),
            token,
        }
    }

    fn get(&self, url: &str) -> ureq::Request {
        let request = self.agent.get(url);
        match &self.token {
            Some(token) => request.set("Authorization", &format!("Bearer {}", token.trim())),
            None => request,
        }
    }

    /// Sends `request`, turning HTTP errors into messages that say what to do.
    fn call(&self, request: ureq::Request, what: &str) -> Result<ureq::Response> {
        let url = request.url().to_string();
        match request.call() {
            Ok(response) => Ok(response),
            Err(ureq::Error::Status(401 | 403, _)) => {
                bail!(
                "{what}: {url} refused access ({}); the repository is private or gated, or the \
                 token is wrong: set HF_TOKEN to a token that may read it",
                if self.token.is_some() { "HF_TOKEN was sent" } else { "HF_TOKEN is not set" }
            )
            }
            Err(ureq::Error::Status(404, _)) => {
                bail!("{what}: {url} was not found (404); check the repository name and revision")
            }
            Err(ureq::Error::Status(code, response)) => bail!(
                "{what}: {url} answered HTTP {code} {}",
                response.status_text()
            ),
            Err(ureq::Error::Transport(error)) => {
                bail!("{what}: cannot reach {url}: {error}")
            }
        }
    }

    /// Every file of `repo` at `revision`, subfolders included (following the listing's
    /// pages).
    pub fn list_files(&self, repo: &str, revision: &str) -> Result<Vec<RemoteFile>> {
        let mut url = Some(format!(
            "{}/api/models/{repo}/tree/{revision}?recursive=true",
            self.endpoint
        ));
        let mut files = Vec::new();
        while let Some(page) = url.take() {
            let response = self.call(self.get(&page), &format!("listing the files of {repo}"))?;
            url = response.header("link").and_then(next_page_link);
            let entries: serde_json::Value = response
                .into_json()
                .with_context(|| format!("{page}: the file listing is not JSON"))?;
            let Some(entries) = entries.as_array() else {
                bail!("{page}: expected a JSON array of files, found {entries}");
            };
            for entry in entries {
                if entry["type"] != "file" {
                    continue;
                }
                let (Some(path), Some(size)) = (entry["path"].as_str(), entry["size"].as_u64())
                else {
                    bail!("{page}: a file entry without `path` or `size`: {entry}");
                };
                files.push(RemoteFile {
                    path: path.to_string(),
                    size: entry["lfs"]["size"].as_u64().unwrap_or(size),
                    sha256: entry["lfs"]["oid"].as_str().map(str::to_ascii_lowercase),
                });
            }
        }
        Ok(files)
    }

    /// Downloads `file` of `repo` into `destination`, through `destination.partial`: an earlier
    /// partial download is resumed (HTTP Range), the result is checked against the file's size
    /// and LFS sha256, and only a checked file is renamed into place. A failed transfer keeps
    /// the partial file for the next attempt; a checksum mismatch deletes it.
    pub fn download(
        &self,
        repo: &str,
        revision: &str,
        file: &RemoteFile,
        destination: &Path,
    ) -> Result<()> {
        let partial = partial_path(destination);
        let url = format!("{}/{repo}/resolve/{revision}/{}", self.endpoint, file.path);
        let mut hasher = Sha256::new();
        let mut have = hash_existing(&partial, file.size, &mut hasher)?;
        let progress = progress_bar(file);
        progress.set_position(have);
        if have < file.size {
            let mut request = self.get(&url);
            if have > 0 {
                request = request.set("Range", &format!("bytes={have}-"));
            }
            let response = self.call(request, &format!("downloading {}", file.path))?;
            let resumed = response.status() == 206;
            if have > 0 && !resumed {
                // The server sent the whole file: start again from its first byte.
                hasher = Sha256::new();
                have = 0;
                progress.set_position(0);
            }
            let mut output = OpenOptions::new()
                .create(true)
                .write(true)
                .append(resumed)
                .truncate(!resumed)
                .open(&partial)
                .with_context(|| format!("cannot write {}", partial.display()))?;
            let mut body = response.into_reader();
            let mut buffer = vec![0u8; 1 << 20];
            loop {
                let read = body.read(&mut buffer).with_context(|| {
                    format!(
                        "the download of {} stopped at byte {have} of {}; run the command again \
                         to resume it",
                        file.path, file.size
                    )
                })?;
                if read == 0 {
                    break;
                }
                output.write_all(&buffer[..read]).with_context(|| {
                    format!(
                        "cannot write {} (the partial file is kept; free space and run the \
                         command again to resume)",
                        partial.display()
                    )
                })?;
                hasher.update(&buffer[..read]);
                have += read as u64;
                progress.set_position(have);
            }
            output
                .sync_all()
                .with_context(|| format!("cannot write {}", partial.display()))?;
        }
        progress.finish_and_clear();
        if have != file.size {
            bail!(
                "{}: received {have} bytes, expected {}; run the command again to resume",
                file.path,
                file.size
            );
        }
        let got = hex(&hasher.finalize());
        match &file.sha256 {
            Some(want) if *want != got => {
                let _ = std::fs::remove_file(&partial);
                bail!(
                    "{}: sha256 {got} does not match the repository's {want}; the download was \
                     deleted, run the command again",
                    file.path
                );
            }
            Some(_) => {}
            None => eprintln!(
                "warning: {} has no LFS checksum in the listing; only its size was checked",
                file.path
            ),
        }
        std::fs::rename(&partial, destination).with_context(|| {
            format!(
                "cannot move {} to {}",
                partial.display(),
                destination.display()
            )
        })?;
        Ok(())
    }
}

/// `destination` + `.partial`.
pub fn partial_path(destination: &Path) -> PathBuf {
    let mut name = destination.as_os_str().to_owned();
    name.push(".partial");
    PathBuf::from(name)
}

/// Feeds an earlier partial download into `hasher` and returns its length (0, after deleting
/// it, when it is longer than the whole file).
fn hash_existing(partial: &Path, size: u64, hasher: &mut Sha256) -> Result<u64> {
    let Ok(mut existing) = File::open(partial) else {
        return Ok(0);
    };
    let length = existing.metadata()?.len();
    if length > size {
        drop(existing);
        std::fs::remove_file(partial)
            .with_context(|| format!("cannot delete {}", partial.display()))?;
        return Ok(0);
    }
    let mut buffer = vec![0u8; 1 << 20];
    loop {
        let read = existing
            .read(&mut buffer)
            .with_context(|| format!("cannot read {}", partial.display()))?;
        if read == 0 {
            return Ok(length);
        }
        hasher.update(&buffer[..read]);
    }
}

/// The `rel="next"` target of a `Link` header (the tree listing's pagination).
fn next_page_link(header: &str) -> Option<String> {
    header.split(',').find_map(|link| {
        let (target, params) = link.split_once(';')?;
        params.contains("rel=\"next\"").then(|| {
            target
                .trim()
                .trim_start_matches('<')
                .trim_end_matches('>')
                .to_string()
        })
    })
}

/// Lower-case hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

/// A bar of bytes on stderr (drawn only when stderr is a terminal).
fn progress_bar(file: &RemoteFile) -> ProgressBar {
    let progress = ProgressBar::new(file.size);
    if let Ok(style) = ProgressStyle::with_template(
        "{msg} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
    ) {
        progress.set_style(style.progress_chars("=> "));
    }
    progress.set_message(
        file.path
            .rsplit('/')
            .next()
            .unwrap_or(&file.path)
            .to_string(),
    );
    progress
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_next_page_is_read_from_the_link_header() {
        let header = "<https://hf.co/api/models/a/b/tree/main?cursor=xyz>; rel=\"next\"";
        assert_eq!(
            next_page_link(header).as_deref(),
            Some("https://hf.co/api/models/a/b/tree/main?cursor=xyz")
        );
        assert_eq!(next_page_link("<x>; rel=\"prev\""), None);
    }
}
