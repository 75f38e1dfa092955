//! Sampling flags shared by `generate` and `chat`.

use runit_engine::SamplerParams;

/// Sampling settings (defaults as llama.cpp's).
#[derive(clap::Args, Clone, Debug)]
pub struct SamplingArgs {
    /// Temperature; 0 picks the most likely token every time (greedy).
    #[arg(
        long,
        visible_alias = "temp",
        default_value_t = 0.8,
        allow_negative_numbers = true
    )]
    pub temperature: f32,
    /// Keep only the K most likely tokens (0 = all).
    #[arg(long, default_value_t = 40)]
    pub top_k: usize,
    /// Keep the smallest set of tokens whose probability adds up to P (1.0 = off).
    #[arg(long, default_value_t = 0.95, allow_negative_numbers = true)]
    pub top_p: f32,
    /// Drop tokens less likely than P times the most likely one (0 = off).
    #[arg(long, default_value_t = 0.05, allow_negative_numbers = true)]
    pub min_p: f32,
    /// Penalise tokens seen in the last `--repeat-last-n` tokens (1.0 = off).
    #[arg(long, default_value_t = 1.0, allow_negative_numbers = true)]
    pub repeat_penalty: f32,
    /// How many recent tokens the penalties consider.
    #[arg(long, default_value_t = 64)]
    pub repeat_last_n: usize,
    /// Subtract F for each earlier occurrence of a token.
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    pub frequency_penalty: f32,
    /// Subtract F once from every token already present.
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    pub presence_penalty: f32,
    /// Random seed; the same seed gives the same output (default: random).
    #[arg(short = 's', long)]
    pub seed: Option<u64>,
}

impl SamplingArgs {
    /// The sampler settings, validated (negative or NaN values are errors).
    pub fn params(&self) -> anyhow::Result<SamplerParams> {
        let seed = self.seed.unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0x5eed, |d| d.as_nanos() as u64)
        });
        let params = SamplerParams {
            temperature: self.temperature,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            repeat_penalty: self.repeat_penalty,
            frequency_penalty: self.frequency_penalty,
            presence_penalty: self.presence_penalty,
            penalty_window: self.repeat_last_n,
            seed,
        };
        params.validate()?;
        Ok(params)
    }
}
