//! Sampling flags shared by `generate` and `chat`; their defaults are the engine's one set,
//! [`SamplerParams::DEFAULT`], which the server also gives requests that leave fields out.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use runit_engine::constraint::{Constraint, Grammar, GrammarCompiler};
use runit_engine::sampler::random_seed;
use runit_engine::SamplerParams;
use runit_tokenizer::Tokenizer;

/// The defaults of every sampling flag.
const DEFAULT: SamplerParams = SamplerParams::DEFAULT;

/// Sampling settings (defaults as llama.cpp's, see [`SamplerParams::DEFAULT`]).
#[derive(clap::Args, Clone, Debug)]
pub struct SamplingArgs {
    /// Temperature; 0 picks the most likely token every time (greedy).
    #[arg(
        long,
        visible_alias = "temp",
        default_value_t = DEFAULT.temperature,
        allow_negative_numbers = true
    )]
    pub temperature: f32,
    /// Keep only the K most likely tokens (0 = all).
    #[arg(long, default_value_t = DEFAULT.top_k)]
    pub top_k: usize,
    /// Keep the smallest set of tokens whose probability adds up to P (1.0 = off).
    #[arg(long, default_value_t = DEFAULT.top_p, allow_negative_numbers = true)]
    pub top_p: f32,
    /// Drop tokens less likely than P times the most likely one (0 = off).
    #[arg(long, default_value_t = DEFAULT.min_p, allow_negative_numbers = true)]
    pub min_p: f32,
    /// Penalise tokens seen in the last `--repeat-last-n` tokens (1.0 = off).
    #[arg(long, default_value_t = DEFAULT.repeat_penalty, allow_negative_numbers = true)]
    pub repeat_penalty: f32,
    /// How many recent tokens the penalties consider.
    #[arg(long, default_value_t = DEFAULT.penalty_window)]
    pub repeat_last_n: usize,
    /// Subtract F for each earlier occurrence of a token.
    #[arg(long, default_value_t = DEFAULT.frequency_penalty, allow_negative_numbers = true)]
    pub frequency_penalty: f32,
    /// Subtract F once from every token already present.
    #[arg(long, default_value_t = DEFAULT.presence_penalty, allow_negative_numbers = true)]
    pub presence_penalty: f32,
    /// Random seed; the same seed gives the same output (default: random).
    #[arg(short = 's', long)]
    pub seed: Option<u64>,
    /// Constrain the output to JSON valid under the JSON schema in FILE.
    #[arg(long, value_name = "FILE", conflicts_with = "grammar")]
    pub json_schema: Option<PathBuf>,
    /// Constrain the output to the GBNF grammar in FILE (llama.cpp's format, rule `root`).
    #[arg(long, value_name = "FILE")]
    pub grammar: Option<PathBuf>,
}

impl SamplingArgs {
    /// The sampler settings, validated (negative or NaN values are errors).
    pub fn params(&self) -> anyhow::Result<SamplerParams> {
        let params = SamplerParams {
            temperature: self.temperature,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            repeat_penalty: self.repeat_penalty,
            frequency_penalty: self.frequency_penalty,
            presence_penalty: self.presence_penalty,
            penalty_window: self.repeat_last_n,
            seed: self.seed.unwrap_or_else(random_seed),
            ..SamplerParams::DEFAULT
        };
        params.validate()?;
        Ok(params)
    }

    /// The grammar of `--json-schema` or `--grammar` compiled for `tokenizer`, in its
    /// starting state; `None` when neither is given.
    pub fn constraint(&self, tokenizer: &Arc<Tokenizer>) -> anyhow::Result<Option<Constraint>> {
        let grammar = match (&self.json_schema, &self.grammar) {
            (Some(path), _) => {
                let text = read(path)?;
                let schema = serde_json::from_str(&text)
                    .with_context(|| format!("{} is not JSON", path.display()))?;
                Grammar::JsonSchema(schema)
            }
            (None, Some(path)) => Grammar::Gbnf(read(path)?),
            (None, None) => return Ok(None),
        };
        let compiler = GrammarCompiler::new(Arc::clone(tokenizer), &tokenizer.eog_ids())?;
        Ok(Some(compiler.compile(&grammar)?))
    }
}

fn read(path: &PathBuf) -> anyhow::Result<String> {
    std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))
}

/// What `runit serve --help` says about the fields a request leaves out: the same defaults.
pub fn request_defaults_help() -> String {
    format!(
        "Requests that leave a sampling field out get the defaults of `runit generate` \
         (llama.cpp's, as llama.cpp's server gives them): temperature {}, top_k {}, top_p {}, \
         min_p {}, repetition_penalty {}, frequency_penalty {}, presence_penalty {} (over the \
         last {} tokens), and a random seed; `temperature: 0` is greedy. Without max_tokens a \
         request generates up to its share of the cache (--ctx-size / --parallel), cut to the \
         room its prompt leaves.",
        DEFAULT.temperature,
        DEFAULT.top_k,
        DEFAULT.top_p,
        DEFAULT.min_p,
        DEFAULT.repeat_penalty,
        DEFAULT.frequency_penalty,
        DEFAULT.presence_penalty,
        DEFAULT.penalty_window,
    )
}
