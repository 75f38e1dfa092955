//! Which GGUF files of a repository a `REPO[:QUANT]` reference means: the reference's syntax,
//! multi-part files grouped, and the quant tag matched against file names.

use std::collections::BTreeMap;

use anyhow::{bail, Result};

/// The quant picked when a reference names none (llama.cpp's `-hf` default).
pub const DEFAULT_QUANT: &str = "Q4_K_M";

/// `owner/name[:QUANT]`, as `runit pull` and `-hf` take it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelReference {
    /// `owner/name` on the hub.
    pub repo: String,
    /// The quant tag asked for, if any (matched case-insensitively).
    pub quant: Option<String>,
}

impl ModelReference {
    /// Parses `owner/name[:QUANT]`.
    pub fn parse(text: &str) -> Result<ModelReference> {
        let (repo, quant) = match text.split_once(':') {
            Some((repo, quant)) => (repo, Some(quant)),
            None => (text, None),
        };
        let parts: Vec<&str> = repo.split('/').collect();
        let valid_part = |part: &str| {
            !part.is_empty()
                && part != "."
                && part != ".."
                && part
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
        };
        if parts.len() != 2 || !parts.iter().all(|part| valid_part(part)) {
            bail!("`{text}` is not a model reference; expected OWNER/NAME[:QUANT], e.g. bartowski/SmolLM2-135M-Instruct-GGUF:Q4_K_M");
        }
        if let Some(quant) = quant {
            if quant.is_empty() || !quant.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
                bail!("`{quant}` is not a quant tag; expected letters, digits and `_` such as Q4_K_M or Q8_0");
            }
        }
        Ok(ModelReference {
            repo: repo.to_string(),
            quant: quant.map(str::to_string),
        })
    }
}

/// One model in a repository: a single GGUF file, or the parts of a split one in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelFiles {
    /// The paths in the repository (one, or `-00001-of-0000N` ... in order).
    pub paths: Vec<String>,
    /// The quant tag found in the file name (`Q4_K_M`), or the name's stem when none is.
    pub quant: String,
}

/// `name-00001-of-00003.gguf` -> (`name`, 1, 3).
fn split_part(path: &str) -> Option<(&str, u32, u32)> {
    let stem = path.strip_suffix(".gguf")?;
    let (rest, count) = stem.rsplit_once("-of-")?;
    let (base, index) = rest.rsplit_once('-')?;
    let is_number = |s: &str| s.len() == 5 && s.bytes().all(|b| b.is_ascii_digit());
    if !is_number(index) || !is_number(count) {
        return None;
    }
    Some((base, index.parse().ok()?, count.parse().ok()?))
}

/// Groups a repository's GGUF paths into models (multi-modal projector files left out: they
/// are not language models). An incomplete split model is an error naming the missing part.
pub fn group_models(paths: &[String]) -> Result<Vec<ModelFiles>> {
    let mut groups: BTreeMap<String, Vec<(u32, u32, String)>> = BTreeMap::new();
    for path in paths {
        let lower = path.to_ascii_lowercase();
        if !lower.ends_with(".gguf")
            || lower
                .rsplit('/')
                .next()
                .is_some_and(|n| n.contains("mmproj"))
        {
            continue;
        }
        match split_part(path) {
            Some((base, index, count)) => {
                groups
                    .entry(base.to_string())
                    .or_default()
                    .push((index, count, path.clone()))
            }
            None => groups
                .entry(path.trim_end_matches(".gguf").to_string())
                .or_default()
                .push((1, 1, path.clone())),
        }
    }
    let mut models = Vec::new();
    for (base, mut parts) in groups {
        parts.sort();
        let count = parts[0].1;
        let indexes: Vec<u32> = parts.iter().map(|part| part.0).collect();
        if parts.iter().any(|part| part.1 != count) || indexes != (1..=count).collect::<Vec<_>>() {
            bail!("the split model {base} is incomplete in the repository: parts {indexes:?} of {count}");
        }
        let name = base.rsplit('/').next().unwrap_or(&base);
        models.push(ModelFiles {
            paths: parts.into_iter().map(|part| part.2).collect(),
            quant: quant_tag(name).unwrap_or_else(|| name.to_string()),
        });
    }
    Ok(models)
}

/// The quant tag in a file stem: the last `-` or `.` separated word that reads like one
/// (`Q4_K_M`, `IQ4_XS`, `F16`, `BF16`, `Q8_0`).
fn quant_tag(stem: &str) -> Option<String> {
    stem.rsplit(['-', '.'])
        .find(|word| {
            let upper = word.to_ascii_uppercase();
            let looks_quant = (upper.starts_with('Q') || upper.starts_with("IQ"))
                && upper.chars().any(|c| c.is_ascii_digit());
            looks_quant || ["F16", "BF16", "F32"].contains(&upper.as_str())
        })
        .map(str::to_ascii_uppercase)
}

/// True when `tag` occurs in `name` (case-insensitively) as a whole word: not followed or
/// preceded by a letter, digit or `_` (so `Q4_K` does not match `Q4_K_M`).
fn contains_tag(name: &str, tag: &str) -> bool {
    let (name, tag) = (name.to_ascii_uppercase(), tag.to_ascii_uppercase());
    let word = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_');
    name.match_indices(&tag).any(|(at, _)| {
        !word(name[..at].chars().next_back()) && !word(name[at + tag.len()..].chars().next())
    })
}

/// The model `quant` picks among `models` of `repo` (the default quant when `None`, or the
/// only model when the repository holds one and no quant was asked for).
pub fn pick(repo: &str, models: &[ModelFiles], quant: Option<&str>) -> Result<ModelFiles> {
    let available = || {
        models
            .iter()
            .map(|model| format!("  {}:{}  ({})", repo, model.quant, model.paths[0]))
            .collect::<Vec<_>>()
            .join("\n")
    };
    if models.is_empty() {
        bail!("{repo} has no GGUF model file; RunIT runs GGUF files only (look for a repository named ...-GGUF)");
    }
    let tag = quant.unwrap_or(DEFAULT_QUANT);
    let matching: Vec<&ModelFiles> = models
        .iter()
        .filter(|model| {
            let name = model.paths[0].rsplit('/').next().unwrap_or(&model.paths[0]);
            contains_tag(name, tag) || model.quant.eq_ignore_ascii_case(tag)
        })
        .collect();
    match (matching.as_slice(), quant) {
        ([one], _) => Ok((*one).clone()),
        ([], None) if models.len() == 1 => Ok(models[0].clone()),
        ([], None) => bail!(
            "{repo} has no {DEFAULT_QUANT} file (the default); name a quant as {repo}:QUANT. Available:\n{}",
            available()
        ),
        ([], Some(tag)) => bail!("no GGUF file of {repo} matches the quant `{tag}`. Available:\n{}", available()),
        (_, _) => bail!(
            "`{tag}` matches {} models of {repo}; name one more precisely:\n{}",
            matching.len(),
            matching
                .iter()
                .map(|model| format!("  {}", model.paths[0]))
                .collect::<Vec<_>>()
                .join("\n")
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn paths(names: &[&str]) -> Vec<String> {
        names.iter().map(|name| name.to_string()).collect()
    }

    #[test]
    fn references_parse_and_bad_ones_are_refused() {
        let reference = ModelReference::parse("bartowski/Qwen3-0.6B-GGUF:q8_0").expect("valid");
        assert_eq!(reference.repo, "bartowski/Qwen3-0.6B-GGUF");
        assert_eq!(reference.quant.as_deref(), Some("q8_0"));
        assert_eq!(ModelReference::parse("a/b").expect("valid").quant, None);
        for bad in ["noslash", "a/b/c", "../x", "a/..", "a/b:", "a/b:Q4 K", "/b"] {
            assert!(ModelReference::parse(bad).is_err(), "{bad} accepted");
        }
    }

    #[test]
    fn split_parts_are_grouped_in_order_and_projectors_left_out() {
        let models = group_models(&paths(&[
            "README.md",
            "big-Q8_0-00002-of-00002.gguf",
            "big-Q8_0-00001-of-00002.gguf",
            "small-Q4_K_M.gguf",
            "mmproj-model-f16.gguf",
        ]))
        .expect("groups");
        assert_eq!(models.len(), 2);
        assert_eq!(
            models[0].paths,
            [
                "big-Q8_0-00001-of-00002.gguf",
                "big-Q8_0-00002-of-00002.gguf"
            ]
        );
        assert_eq!(models[0].quant, "Q8_0");
        assert_eq!(models[1].quant, "Q4_K_M");
        let missing = group_models(&paths(&["m-00001-of-00003.gguf", "m-00003-of-00003.gguf"]));
        assert!(missing.unwrap_err().to_string().contains("incomplete"));
    }

    #[test]
    fn quant_tags_match_whole_words_and_ambiguity_lists_the_files() {
        let models = group_models(&paths(&[
            "m-Q4_K_M.gguf",
            "m-Q4_K_S.gguf",
            "m.Q8_0.gguf",
            "other-Q8_0.gguf",
        ]))
        .expect("groups");
        assert_eq!(pick("o/m", &models, None).expect("default").quant, "Q4_K_M");
        assert_eq!(
            pick("o/m", &models, Some("q4_k_s")).expect("tag").paths,
            ["m-Q4_K_S.gguf"]
        );
        let ambiguous = pick("o/m", &models, Some("Q8_0")).unwrap_err().to_string();
        assert!(ambiguous.contains("m.Q8_0.gguf") && ambiguous.contains("other-Q8_0.gguf"));
        let none = pick("o/m", &models, Some("Q4_K")).unwrap_err().to_string();
        assert!(
            none.contains("matches the quant `Q4_K`") && none.contains("o/m:Q4_K_S"),
            "{none}"
        );
        let empty = pick("o/m", &[], None).unwrap_err().to_string();
        assert!(empty.contains("no GGUF model file"));
    }
}
