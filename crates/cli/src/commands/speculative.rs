//! The speculative-decoding flags of `generate`, `chat`, `bench` and `serve` (llama.cpp's
//! names), and the drafter they ask for: prompt lookup or a draft model, whose vocabulary
//! is checked token by token against the target's at load.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use runit_engine::speculative::{
    check_vocabularies, DraftModel, DraftModelPool, DraftParams, Drafter, PromptLookup, Speculation,
};
use runit_engine::EngineConfig;

use super::common::{load_on, Loaded, ModelArgs};

/// Speculative decoding: a drafter proposes tokens that the model verifies in one pass.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct SpeculativeArgs {
    /// Draft by prompt lookup: continue the most recent earlier occurrence of the last N
    /// tokens of the prompt and output (no second model).
    #[arg(long = "draft-ngram", value_name = "N", conflicts_with = "model_draft")]
    pub draft_ngram: Option<usize>,
    /// Draft with this smaller model of the same vocabulary (`-md` as in llama.cpp).
    #[arg(long = "model-draft", value_name = "FILE")]
    pub model_draft: Option<PathBuf>,
    /// Most tokens drafted per step.
    #[arg(long = "draft-max", default_value_t = DraftParams::DEFAULT.max)]
    pub draft_max: usize,
    /// Fewest drafted tokens worth verifying (a shorter draft is dropped).
    #[arg(long = "draft-min", default_value_t = DraftParams::DEFAULT.min)]
    pub draft_min: usize,
    /// The draft model stops drafting at a token it gives less than this probability.
    #[arg(long = "draft-p-min", default_value_t = DraftParams::DEFAULT.p_min)]
    pub draft_p_min: f32,
    /// Device of the draft model (default: the model's `--device`).
    #[arg(long = "device-draft", value_name = "DEVICE")]
    pub device_draft: Option<String>,
}

/// What the flags load once: the draft model, when there is one.
pub struct DraftSource {
    params: DraftParams,
    kind: DraftKind,
}

enum DraftKind {
    Lookup(usize),
    Model {
        path: PathBuf,
        loaded: Loaded,
        config: EngineConfig,
        target_vocab: usize,
    },
}

impl SpeculativeArgs {
    /// True when a drafter is asked for.
    pub fn enabled(&self) -> bool {
        self.draft_ngram.is_some() || self.model_draft.is_some()
    }

    /// The drafter's source for `target` (loaded with `model`), or `None` without a
    /// drafter flag; refuses bad settings, and a draft model of another vocabulary, and
    /// warns when the draft model is no smaller than the target. The draft flags without
    /// a drafter are refused rather than ignored.
    pub fn load(&self, model: &ModelArgs, target: &Loaded) -> anyhow::Result<Option<DraftSource>> {
        let params = DraftParams {
            max: self.draft_max,
            min: self.draft_min,
            p_min: self.draft_p_min,
        };
        if !self.enabled() {
            if params != DraftParams::DEFAULT || self.device_draft.is_some() {
                anyhow::bail!(
                    "--draft-max, --draft-min, --draft-p-min and --device-draft need a drafter: give --draft-ngram N or -md FILE"
                );
            }
            return Ok(None);
        }
        params.validate()?;
        let kind = match (&self.draft_ngram, &self.model_draft) {
            (&Some(n), _) => {
                PromptLookup::new(n)?;
                if self.device_draft.is_some() {
                    anyhow::bail!(
                        "--device-draft needs a draft model (-md FILE), not --draft-ngram"
                    );
                }
                DraftKind::Lookup(n)
            }
            (None, Some(path)) => {
                let draft_args = ModelArgs {
                    source: super::common::ModelSource {
                        model: Some(path.clone()),
                        hf_repo: None,
                    },
                    tokenizer: None,
                    device: self
                        .device_draft
                        .clone()
                        .unwrap_or_else(|| model.device.clone()),
                    ..model.clone()
                };
                // On the target's device, the target's backend (one thread team).
                let shared =
                    (draft_args.device == model.device).then(|| Arc::clone(&target.model.backend));
                let loaded = load_on(&draft_args, shared)
                    .with_context(|| format!("loading the draft model {}", path.display()))?;
                check_vocabularies(&target.tokenizer, &loaded.tokenizer)
                    .with_context(|| format!("the draft model {}", path.display()))?;
                let (target_bytes, draft_bytes) =
                    (target.file.file_size(), loaded.file.file_size());
                if draft_bytes >= target_bytes {
                    eprintln!(
                        "warning: the draft model ({:.1} MiB) is no smaller than the target ({:.1} MiB): drafting costs as much as it saves",
                        draft_bytes as f64 / (1u64 << 20) as f64,
                        target_bytes as f64 / (1u64 << 20) as f64
                    );
                }
                DraftKind::Model {
                    path: path.clone(),
                    loaded,
                    config: draft_args.engine_config(),
                    target_vocab: target.model.config.vocab_size,
                }
            }
            (None, None) => unreachable!("enabled() checked that one is given"),
        };
        Ok(Some(DraftSource { params, kind }))
    }
}

impl SpeculativeArgs {
    /// `serve`'s prompt-lookup settings without a draft model: `--draft-ngram N` for
    /// every sequence, or none (then only requests' `prediction` fields speculate). With
    /// `-md` use [`SpeculativeArgs::load`] and [`DraftSource::pool`].
    pub fn serve_settings(&self) -> anyhow::Result<Option<(usize, DraftParams)>> {
        let params = DraftParams {
            max: self.draft_max,
            min: self.draft_min,
            p_min: self.draft_p_min,
        };
        match self.draft_ngram {
            Some(ngram) => {
                params.validate()?;
                PromptLookup::new(ngram)?;
                Ok(Some((ngram, params)))
            }
            None if params != DraftParams::DEFAULT || self.device_draft.is_some() => {
                anyhow::bail!("--draft-max, --draft-min, --draft-p-min and --device-draft need --draft-ngram N or -md FILE")
            }
            None => Ok(None),
        }
    }
}

impl DraftSource {
    /// A fresh speculation (its own draft cache and adaptive length), for one sequence.
    pub fn speculation(&self) -> anyhow::Result<Speculation> {
        let drafter: Box<dyn Drafter> = match &self.kind {
            DraftKind::Lookup(n) => Box::new(PromptLookup::new(*n)?),
            DraftKind::Model {
                loaded,
                config,
                target_vocab,
                ..
            } => Box::new(DraftModel::new(
                Arc::clone(&loaded.model),
                config,
                self.params.p_min,
                *target_vocab,
            )?),
        };
        Ok(Speculation::new(drafter, self.params)?)
    }

    /// The draft settings.
    pub fn params(&self) -> DraftParams {
        self.params
    }

    /// A pool of draft-model sessions of `context_size` cells each, one for each sequence
    /// the server decodes with it at once; `None` for prompt lookup.
    pub fn pool(&self, context_size: usize) -> anyhow::Result<Option<DraftModelPool>> {
        let DraftKind::Model {
            loaded,
            config,
            target_vocab,
            ..
        } = &self.kind
        else {
            return Ok(None);
        };
        let config = EngineConfig {
            context_size,
            ..config.clone()
        };
        let pool = DraftModelPool::new(
            Arc::clone(&loaded.model),
            config,
            self.params.p_min,
            *target_vocab,
        )
        .context("making the draft model's session")?;
        Ok(Some(pool))
    }

    /// A short name for reports: `ngram N` or the draft model's file name.
    pub fn describe(&self) -> String {
        match &self.kind {
            DraftKind::Lookup(n) => format!("ngram {n}"),
            DraftKind::Model { path, .. } => format!(
                "draft {}",
                path.file_name().unwrap_or_default().to_string_lossy()
            ),
        }
    }
}
