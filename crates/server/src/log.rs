//! Request logging: every request runs in a `request{id, endpoint}` span, and a finished
//! generation logs one info line with its token counts, time to first token, decode speed
//! and finish reason. [`init_logging`] installs the subscriber `runit serve` uses.

use std::time::Instant;

use crate::choice::Delta;

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LogFormat {
    /// Human-readable lines, coloured only when stderr is a terminal.
    #[default]
    Text,
    /// One JSON object per line, for log collectors.
    Json,
}

/// Installs a stderr subscriber filtered by `RUST_LOG` (default `info`) writing `format`;
/// does nothing when a global subscriber is already set.
pub fn init_logging(format: LogFormat) {
    use std::io::IsTerminal;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    // An error means a subscriber is already installed, which is then kept.
    let _ = match format {
        LogFormat::Text => builder
            .with_ansi(std::io::stderr().is_terminal())
            .try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
}

/// Timings and counts of one request's choices, logged when it ends.
#[derive(Debug)]
pub struct RequestLog {
    start: Instant,
    first_token: Option<Instant>,
    last_token: Option<Instant>,
    prompt_tokens: usize,
    /// Tokens generated per choice.
    generated: Vec<usize>,
    finish_reasons: Vec<Option<&'static str>>,
}

impl RequestLog {
    /// Starts the clock for a request of `choices` sequences over `prompt_tokens` tokens.
    pub fn new(prompt_tokens: usize, choices: usize) -> RequestLog {
        RequestLog {
            start: Instant::now(),
            first_token: None,
            last_token: None,
            prompt_tokens,
            generated: vec![0; choices],
            finish_reasons: vec![None; choices],
        }
    }

    /// Notes a delta as it arrives.
    pub fn record(&mut self, delta: &Delta) {
        let Some(generated) = self.generated.get_mut(delta.index) else {
            return;
        };
        if delta.completion_tokens > *generated {
            let now = delta.sent.unwrap_or_else(Instant::now);
            self.first_token.get_or_insert(now);
            self.last_token = Some(now);
            *generated = delta.completion_tokens;
        }
        if delta.finish_reason.is_some() {
            self.finish_reasons[delta.index] = delta.finish_reason;
        }
    }

    /// The finish reasons of the choices, one if they agree, else comma-separated.
    fn finish_reason(&self) -> String {
        let mut reasons: Vec<&str> = self
            .finish_reasons
            .iter()
            .map(|reason| reason.unwrap_or("none"))
            .collect();
        if reasons.windows(2).all(|pair| pair[0] == pair[1]) {
            reasons.truncate(1);
        }
        reasons.join(",")
    }

    /// Logs the request's one summary line; `outcome` overrides the finish reason
    /// (`cancelled`, `error`).
    pub fn finish(&self, outcome: Option<&str>) {
        let generated: usize = self.generated.iter().sum();
        let ttft_ms = self
            .first_token
            .map_or(0.0, |first| (first - self.start).as_secs_f64() * 1e3);
        // Tokens after each choice's first, over the time from the first token to the last.
        let started = self.generated.iter().filter(|&&n| n > 0).count();
        let decode_seconds = match (self.first_token, self.last_token) {
            (Some(first), Some(last)) => (last - first).as_secs_f64(),
            _ => 0.0,
        };
        let decode_tps = if decode_seconds > 0.0 {
            (generated - started) as f64 / decode_seconds
        } else {
            0.0
        };
        let finish_reason = outcome.map_or_else(|| self.finish_reason(), str::to_string);
        tracing::info!(
            prompt_tokens = self.prompt_tokens,
            generated_tokens = generated,
            ttft_ms = (ttft_ms * 10.0).round() / 10.0,
            decode_tps = (decode_tps * 10.0).round() / 10.0,
            finish_reason = %finish_reason,
            "request finished"
        );
    }
}
