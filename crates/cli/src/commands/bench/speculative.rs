//! `runit bench --draft-ngram N` / `-md FILE`: greedy generation from real prompts, timed
//! with speculation off and on in the same run (alternating, one repetition of each in
//! turn, so both meet the same load), with the drafts' acceptance rate. Greedy output with
//! speculation is the same tokens, so both sides generate the same text. The adaptive draft
//! length (what it measured of the drafter and of the passes) carries from one generation
//! to the next, as `runit chat` carries it from turn to turn; each generation's drafter
//! starts afresh. The table ends with what a verification pass of each row count cost
//! against a one-row step (the adaptive length's running averages).

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use runit_engine::speculative::DraftLength;
use runit_engine::{
    generate_with, GenerateParams, GenerationOutput, Sampler, SamplerParams, Session,
};
use serde_json::json;

use super::super::common::Loaded;
use super::super::speculative::DraftSource;
use super::Format;

/// One prompt's figures over the repetitions.
struct PromptRow {
    name: String,
    tokens: usize,
    off: Duration,
    on: Duration,
    drafted: usize,
    accepted: usize,
}

/// Runs every prompt file `repetitions` times each way and prints the table.
pub fn run(
    loaded: &Loaded,
    config: &runit_engine::EngineConfig,
    drafts: &DraftSource,
    prompt_files: &[PathBuf],
    n_gen: usize,
    repetitions: usize,
    format: Format,
) -> anyhow::Result<()> {
    if prompt_files.is_empty() {
        anyhow::bail!("speculation is measured on real text: give one or more --prompt-file FILE");
    }
    let params = GenerateParams {
        max_tokens: n_gen,
        end_of_generation: loaded.tokenizer.eog_ids(),
        top_logprobs: 0,
    };
    let mut session = Session::new(loaded.model.clone(), config)?;
    let mut rows = Vec::new();
    // The adaptive length learned so far.
    let mut learned: Option<DraftLength> = None;
    for path in prompt_files {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading the prompt {}", path.display()))?;
        let prompt = loaded.tokenizer.encode(&text, true, true);
        let mut row = PromptRow {
            name: path
                .file_name()
                .unwrap_or_default()
                .to_string_lossy()
                .into_owned(),
            tokens: 0,
            off: Duration::ZERO,
            on: Duration::ZERO,
            drafted: 0,
            accepted: 0,
        };
        // One warm-up run each way, then the timed repetitions.
        for rep in 0..=repetitions {
            let mut generate = |speculate: bool| -> anyhow::Result<GenerationOutput> {
                session.reset();
                let mut sampler = Sampler::new(SamplerParams::greedy())?;
                let mut speculation = speculate.then(|| drafts.speculation()).transpose()?;
                if let (Some(speculation), Some(length)) = (&mut speculation, &learned) {
                    speculation.length = length.clone();
                }
                let output = generate_with(
                    &mut session,
                    &mut sampler,
                    &prompt,
                    &params,
                    speculation.as_mut(),
                    |_| true,
                )?;
                if let Some(speculation) = speculation {
                    learned = Some(speculation.length);
                }
                Ok(output)
            };
            let off = generate(false)?;
            let on = generate(true)?;
            if off.tokens != on.tokens {
                let at = off
                    .tokens
                    .iter()
                    .zip(&on.tokens)
                    .take_while(|(a, b)| a == b)
                    .count();
                // The CPU's kernels give each row the same bits whatever the batch, so there a
                // difference is a bug; a GPU's verification pass may sum in another order
                // than its one-row step and part at a near tie (`--exact` for equal tokens).
                if session.model().backend.name() == "cpu" {
                    anyhow::bail!(
                        "{}: greedy output with speculation differs from without it (token {at})",
                        row.name
                    );
                }
                eprintln!(
                    "warning: {}: greedy output with speculation parts from the plain output at \
                     token {at} of {} (the device's verification pass sums in another order \
                     than its one-row step)",
                    row.name,
                    off.tokens.len()
                );
            }
            if rep == 0 {
                continue;
            }
            row.tokens += off.tokens.len().saturating_sub(1);
            row.off += off.decode_time;
            row.on += on.decode_time;
            let stats = on.speculation.unwrap_or_default();
            row.drafted += stats.drafted;
            row.accepted += stats.accepted;
        }
        rows.push(row);
    }
    let rate = |tokens: usize, time: Duration| tokens as f64 / time.as_secs_f64().max(1e-9);
    let acceptance = |row: &PromptRow| row.accepted as f64 / row.drafted.max(1) as f64;
    match format {
        Format::Md => {
            println!(
                "| prompt | drafter | tokens | off t/s | on t/s | speed-up | drafted | accepted | acceptance |"
            );
            println!("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
            for row in &rows {
                let (off, on) = (rate(row.tokens, row.off), rate(row.tokens, row.on));
                println!(
                    "| {} | {} | {} | {off:.2} | {on:.2} | {:.2}x | {} | {} | {:.1}% |",
                    row.name,
                    drafts.describe(),
                    row.tokens,
                    on / off,
                    row.drafted,
                    row.accepted,
                    100.0 * acceptance(row)
                );
            }
            let tokens: usize = rows.iter().map(|row| row.tokens).sum();
            let off: Duration = rows.iter().map(|row| row.off).sum();
            let on: Duration = rows.iter().map(|row| row.on).sum();
            let drafted: usize = rows.iter().map(|row| row.drafted).sum();
            let accepted: usize = rows.iter().map(|row| row.accepted).sum();
            println!(
                "| all | {} | {tokens} | {:.2} | {:.2} | {:.2}x | {drafted} | {accepted} | {:.1}% |",
                drafts.describe(),
                rate(tokens, off),
                rate(tokens, on),
                rate(tokens, on) / rate(tokens, off),
                100.0 * accepted as f64 / drafted.max(1) as f64
            );
            if let Some(costs) = learned.as_ref().map(|length| pass_costs(length, drafts)) {
                println!();
                println!("verification pass cost against a 1-row step (running averages): {costs}");
            }
        }
        Format::Json => {
            let results: Vec<_> = rows
                .iter()
                .map(|row| {
                    json!({"prompt": row.name, "tokens": row.tokens,
                           "off_ts": rate(row.tokens, row.off), "on_ts": rate(row.tokens, row.on),
                           "drafted": row.drafted, "accepted": row.accepted,
                           "acceptance": acceptance(row)})
                })
                .collect();
            let pass_ms: serde_json::Map<String, serde_json::Value> = learned
                .iter()
                .flat_map(|length| {
                    (1..=drafts.params().max + 1).filter_map(|rows| {
                        let seconds = length.pass_seconds(rows)?;
                        Some((rows.to_string(), json!(1e3 * seconds)))
                    })
                })
                .collect();
            println!(
                "{}",
                json!({"drafter": drafts.describe(), "results": results, "pass_ms": pass_ms})
            );
        }
    }
    Ok(())
}

/// `rows: ratio` of every measured row count's pass time to a one-row step's.
fn pass_costs(length: &DraftLength, drafts: &DraftSource) -> String {
    let Some(one) = length.pass_seconds(1) else {
        return "no one-row step measured".into();
    };
    (2..=drafts.params().max + 1)
        .filter_map(|rows| {
            let seconds = length.pass_seconds(rows)?;
            Some(format!("{rows} rows {:.2}x", seconds / one))
        })
        .collect::<Vec<_>>()
        .join(", ")
}
