//! `runit bench`: prompt-processing and generation speed in the manner of llama-bench
//! (`pp` = one batch of P prompt tokens, `tg` = N single-token decode steps, optionally after
//! `-d` positions of context and for `--batch` sequences at once), mean ± sd over repetitions.
//! Generation rows also report the weight bandwidth they reached: the bytes of weights one
//! decode step reads (every tensor but the token embedding, which a tied output head reads
//! whole) times the steps per second; KV-cache reads are not counted.

mod decode;
mod speculative;

use std::time::Instant;

use indicatif::{ProgressBar, ProgressStyle};
use runit_engine::Session;
use runit_model::KvState;

use decode::{DecodeBench, DecodeTest};
use serde_json::json;

use super::common::{cpu_isa_cap_note, load, ModelArgs};
use super::speculative::SpeculativeArgs;

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Prompt tokens per prompt-processing test (0 = skip).
    #[arg(short = 'p', long = "n-prompt", default_value_t = 512)]
    pub n_prompt: usize,
    /// Generated tokens per generation test (0 = skip).
    #[arg(short = 'n', long = "n-gen", default_value_t = 128)]
    pub n_gen: usize,
    /// Context depth: positions filled in each sequence before the generation test (as
    /// llama-bench's `-d`); the prompt test is unaffected.
    #[arg(short = 'd', long = "n-depth", default_value_t = 0)]
    pub n_depth: usize,
    /// Sequences decoded together in the generation test, each at depth `-d`; reported as
    /// aggregate tokens per second (B × N over the time of the N steps), comparable with
    /// llama-batched-bench's S_TG.
    #[arg(long = "batch", default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=4096))]
    pub batch: u64,
    /// In the generation test, pick each sequence's next token (greedy) where the logits
    /// are and copy only the token ids to the host, as `runit serve` does for greedy
    /// requests, instead of copying every sequence's logits (what llama-bench and
    /// llama-batched-bench do, and the default). The test's name gets ` ids`.
    #[arg(long = "pick-on-device")]
    pub pick_on_device: bool,
    /// Repetitions of each test.
    #[arg(short = 'r', long = "repetitions", default_value_t = 5)]
    pub repetitions: usize,
    #[command(flatten)]
    pub speculative: SpeculativeArgs,
    /// With a drafter: a prompt (text, special tokens parsed) to generate greedily from
    /// with speculation off and on; repeat the flag for several prompts.
    #[arg(long = "prompt-file", value_name = "FILE")]
    pub prompt_files: Vec<std::path::PathBuf>,
    /// `md` prints a table like llama-bench; `json` one object.
    #[arg(short = 'o', long = "output-format", value_enum, default_value_t = Format::Md)]
    pub output_format: Format,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Md,
    Json,
}

struct Row {
    test: String,
    samples: Vec<f64>,
    /// Weight bytes read per generated token (a step's weight bytes over its sequences);
    /// `None` for prompt rows.
    weight_bytes_per_token: Option<f64>,
    /// Generation rows: per sample, the mean seconds of a step and of its host part
    /// (`decode::StepTimes`).
    steps: Vec<(f64, f64)>,
}

impl Row {
    fn mean(&self) -> f64 {
        self.samples.iter().sum::<f64>() / self.samples.len() as f64
    }

    /// Weight bandwidth reached, GB/s (generation rows).
    fn weight_gbps(&self) -> Option<f64> {
        self.weight_bytes_per_token
            .map(|bytes| bytes * self.mean() / 1e9)
    }

    /// Mean milliseconds of a step and of the host's part of it (generation rows).
    fn step_ms(&self) -> Option<(f64, f64)> {
        if self.steps.is_empty() {
            return None;
        }
        let n = self.steps.len() as f64;
        let (step, host) = self
            .steps
            .iter()
            .fold((0.0, 0.0), |(a, b), &(s, h)| (a + s, b + h));
        Some((1e3 * step / n, 1e3 * host / n))
    }

    fn sd(&self) -> f64 {
        let n = self.samples.len();
        if n < 2 {
            return 0.0;
        }
        let m = self.mean();
        (self.samples.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / (n - 1) as f64).sqrt()
    }
}

pub fn run(mut args: Args) -> anyhow::Result<()> {
    if args.repetitions == 0 {
        anyhow::bail!("-r must be at least 1");
    }
    if args.n_prompt == 0 && args.n_gen == 0 {
        anyhow::bail!("nothing to measure: -p and -n are both 0");
    }
    args.model.batch_size = args.model.batch_size.max(args.n_prompt);
    args.model.ctx_size = Some(args.model.context_size().max(args.n_prompt + 1));
    let batch = args.batch as usize;
    if !args.prompt_files.is_empty() && !args.speculative.enabled() {
        anyhow::bail!(
            "--prompt-file is for measuring speculation: give --draft-ngram N or -md FILE"
        );
    }
    if args.speculative.enabled() && (batch > 1 || args.n_depth > 0) {
        anyhow::bail!(
            "--batch and -d shape the plain generation test; speculation is measured on one \
             sequence over the prompts (--prompt-file): leave them out with --draft-ngram or -md"
        );
    }
    if args.pick_on_device && (args.n_gen == 0 || args.speculative.enabled()) {
        anyhow::bail!(
            "--pick-on-device applies to the generation test of plain decoding: give -n above 0 \
             and no drafter"
        );
    }
    let loaded = load(&args.model)?;
    if let (Some(note), Format::Md) = (cpu_isa_cap_note(), args.output_format) {
        println!("{note}\n");
    }
    if let Some(drafts) = args.speculative.load(&args.model, &loaded)? {
        return speculative::run(
            &loaded,
            &args.model.engine_config(),
            &drafts,
            &args.prompt_files,
            args.n_gen,
            args.repetitions,
            args.output_format,
        );
    }
    let model = loaded.model.clone();
    let vocab = model.config.vocab_size as u32;
    // Deterministic pseudo-random tokens, as llama-bench feeds random ids.
    let token = |i: usize| ((i as u64 * 2_654_435_761 + 12_345) % vocab as u64) as u32;
    let tests = usize::from(args.n_prompt > 0) + usize::from(args.n_gen > 0);
    let bar = ProgressBar::new(((args.repetitions + 1) * tests) as u64).with_style(
        ProgressStyle::with_template("{bar:40} {pos}/{len} runs {msg}")
            .expect("the template is valid"),
    );
    let mut rows = Vec::new();
    if args.n_prompt > 0 {
        let mut session = Session::new(model.clone(), &args.model.engine_config())?;
        let prompt: Vec<u32> = (0..args.n_prompt).map(token).collect();
        let mut row = Row {
            test: format!("pp{}", args.n_prompt),
            samples: Vec::new(),
            weight_bytes_per_token: None,
            steps: Vec::new(),
        };
        for rep in 0..=args.repetitions {
            session.reset();
            let start = Instant::now();
            session.eval(&prompt, false, None)?;
            let secs = start.elapsed().as_secs_f64();
            if rep > 0 {
                row.samples.push(args.n_prompt as f64 / secs);
            }
            bar.inc(1);
        }
        rows.push(row);
    }
    if args.n_gen > 0 {
        let mut test = format!("tg{}", args.n_gen);
        if args.n_depth > 0 {
            test += &format!(" @ d{}", args.n_depth);
        }
        if batch > 1 {
            test += &format!(" x{batch}");
        }
        if args.pick_on_device {
            test += " ids";
        }
        let mut row = Row {
            test,
            samples: Vec::new(),
            weight_bytes_per_token: Some(decode_weight_bytes(&loaded.file) as f64 / batch as f64),
            steps: Vec::new(),
        };
        let shape = DecodeTest {
            batch,
            depth: args.n_depth,
            steps: args.n_gen,
            chunk: args.model.batch_size,
            block_size: args.model.engine_config().kv_block_size,
            pick_on_device: args.pick_on_device,
        };
        let mut decode = DecodeBench::new(&model, shape, args.model.kv_types(), token)?;
        for rep in 0..=args.repetitions {
            let times = decode.run(token)?;
            if rep > 0 {
                row.samples.push(times.tokens_per_second);
                row.steps.push((times.step_seconds, times.submit_seconds));
            }
            bar.inc(1);
        }
        rows.push(row);
    }
    bar.finish_and_clear();
    let model_name = loaded
        .path
        .file_name()
        .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
    let size_gib = loaded.file.file_size() as f64 / (1u64 << 30) as f64;
    let params_m = loaded
        .file
        .tensors()
        .iter()
        .map(|t| t.n_elements())
        .sum::<u64>() as f64
        / 1e6;
    let threads = args.model.thread_count();
    let kv_types = args.model.kv_types();
    let kv_bytes = KvState::token_bytes(&model, kv_types)?;
    match args.output_format {
        Format::Md => {
            println!(
                "| model | size | params | backend | threads | KV cache | KV B/token | test | t/s | weights GB/s |"
            );
            println!("| --- | ---: | ---: | --- | ---: | --- | ---: | ---: | ---: | ---: |");
            for r in &rows {
                let gbps = r
                    .weight_gbps()
                    .map_or_else(String::new, |g| format!("{g:.1}"));
                println!(
                    "| {model_name} | {size_gib:.2} GiB | {params_m:.1} M | {} | {threads} | {kv_types} | {kv_bytes} | {} | {:.2} ± {:.2} | {gbps} |",
                    args.model.device, r.test, r.mean(), r.sd()
                );
            }
            // Where a generation step's time goes between the host and the device.
            let on_cpu = model.backend.name().starts_with("cpu");
            for r in &rows {
                if let Some((step, host)) = r.step_ms() {
                    println!(
                        "\n{}: a step takes {step:.3} ms, {host:.3} ms of it ({:.1}%) on the host checking, building and submitting the pass{}",
                        r.test,
                        100.0 * host / step.max(f64::MIN_POSITIVE),
                        if on_cpu { " (on the CPU: the work itself)" } else { "; the rest waiting for the device" }
                    );
                }
            }
        }
        Format::Json => {
            let results: Vec<_> = rows
                .iter()
                .map(|r| json!({"test": r.test, "avg_ts": r.mean(), "stddev_ts": r.sd(), "samples_ts": r.samples,
                                "weight_gbps": r.weight_gbps(),
                                "step_ms": r.step_ms().map(|(step, _)| step),
                                "host_ms_per_step": r.step_ms().map(|(_, host)| host)}))
                .collect();
            println!(
                "{}",
                json!({"model": model_name, "size_bytes": loaded.file.file_size(), "params_m": params_m,
                       "backend": args.model.device, "threads": threads, "results": results,
                       "cpu_isa_cap": runit_quant::cpu::cap().ok().flatten().map(|cap| cap.name()),
                       "cpu_isa_note": cpu_isa_cap_note(),
                       "kv_cache": {"keys": kv_types.keys.name(), "values": kv_types.values.name(),
                                    "bytes_per_token": kv_bytes,
                                    "bytes_per_token_per_layer": kv_bytes / model.config.block_count.max(1)}})
            );
        }
    }
    Ok(())
}

/// Bytes of weights one decode step reads: every tensor but the token embedding (one row of
/// it is read), unless the output head is tied to it (no `output.weight`).
fn decode_weight_bytes(file: &runit_gguf::GgufFile) -> u64 {
    let tied = !file.tensors().iter().any(|t| t.name == "output.weight");
    file.tensors()
        .iter()
        .filter(|t| tied || t.name != "token_embd.weight")
        .map(|t| t.n_bytes)
        .sum()
}
