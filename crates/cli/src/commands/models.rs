//! `runit pull`, `runit list` and `runit rm`: the local cache of models downloaded by name.

use anyhow::{bail, Result};
use runit_gguf::GgufFile;

use crate::hub::{self, cache, select::ModelReference};

/// Arguments of `runit pull`.
#[derive(clap::Args)]
pub struct PullArgs {
    /// OWNER/NAME[:QUANT] on the Hugging Face Hub (e.g. bartowski/SmolLM2-135M-Instruct-GGUF:Q8_0).
    /// QUANT picks the GGUF file whose name holds it (Q4_K_M when left out); a split model's
    /// parts all come. Files are resumed when a download was interrupted and checked against
    /// the repository's sha256. HF_TOKEN authenticates, HF_ENDPOINT names another hub, and
    /// RUNIT_HOME moves the cache (default ~/.cache/runit/models).
    #[arg(value_name = "REPO[:QUANT]")]
    pub reference: String,
    /// Branch, tag or commit to download from.
    #[arg(long, default_value = hub::DEFAULT_REVISION)]
    pub revision: String,
}

/// Arguments of `runit list`.
#[derive(clap::Args)]
pub struct ListArgs {
    /// Also check every file's size and sha256 (reads every byte).
    #[arg(long)]
    pub verify: bool,
}

/// Arguments of `runit rm`.
#[derive(clap::Args)]
pub struct RemoveArgs {
    /// The cached model, as `runit list` names it (OWNER/NAME:QUANT).
    pub name: String,
}

pub fn pull(args: PullArgs) -> Result<()> {
    let reference = ModelReference::parse(&args.reference)?;
    let model = hub::pull(&reference, &args.revision)?;
    println!("{}", model.path().display());
    Ok(())
}

pub fn list(args: ListArgs) -> Result<()> {
    let root = cache::cache_root()?;
    let models = cache::list(&root);
    if models.is_empty() {
        eprintln!(
            "no cached models in {} (`runit pull OWNER/NAME[:QUANT]` downloads one)",
            root.display()
        );
        return Ok(());
    }
    let rows: Vec<[String; 4]> = models
        .iter()
        .map(|model| {
            let architecture = GgufFile::open(model.path())
                .ok()
                .and_then(|file| {
                    file.get_str_opt("general.architecture")
                        .ok()
                        .flatten()
                        .map(str::to_string)
                })
                .unwrap_or_else(|| "?".to_string());
            [
                model.name(),
                model.quant.clone(),
                architecture,
                crate::units::human_bytes(model.size()),
            ]
        })
        .collect();
    let header = ["NAME", "QUANT", "ARCH", "SIZE"];
    let widths: Vec<usize> = (0..4)
        .map(|column| {
            rows.iter()
                .map(|row| row[column].len())
                .chain([header[column].len()])
                .max()
                .unwrap_or(0)
        })
        .collect();
    let line = |cells: [&str; 4]| {
        format!(
            "{:<w0$}  {:<w1$}  {:<w2$}  {:>w3$}",
            cells[0],
            cells[1],
            cells[2],
            cells[3],
            w0 = widths[0],
            w1 = widths[1],
            w2 = widths[2],
            w3 = widths[3]
        )
    };
    println!("{}", line(header));
    for row in &rows {
        println!("{}", line([&row[0], &row[1], &row[2], &row[3]]));
    }
    if args.verify {
        let mut broken = 0;
        for model in &models {
            let problems = model.verify();
            if problems.is_empty() {
                eprintln!("{}: ok", model.name());
            } else {
                broken += 1;
                for problem in problems {
                    eprintln!("{}: {problem}", model.name());
                }
            }
        }
        if broken > 0 {
            bail!(
                "{broken} cached model(s) failed verification; `runit rm NAME` and pull them again"
            );
        }
    }
    Ok(())
}

pub fn remove(args: RemoveArgs) -> Result<()> {
    let root = cache::cache_root()?;
    let Some(model) = cache::find(&root, &args.name)? else {
        bail!(
            "no cached model is named {} (`runit list` shows the names)",
            args.name
        );
    };
    cache::remove(&root, &model)?;
    eprintln!(
        "removed {} ({})",
        model.name(),
        crate::units::human_bytes(model.size())
    );
    Ok(())
}
