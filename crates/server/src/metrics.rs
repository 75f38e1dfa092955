//! `GET /metrics`: the scheduler's load and counters in the Prometheus text exposition format
//! (version 0.0.4), written by the small encoder below: requests running and waiting, KV
//! blocks, prefix-cache hits and misses, prompt and generated tokens, the scheduler steps'
//! time (whole, in forward passes, on the host), and the histograms of time to first token
//! and inter-token latency.

use std::fmt::Write;
use std::sync::Arc;

use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use runit_engine::scheduler::Histogram;

use crate::AppState;

/// The content type of the Prometheus text format.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// `GET /metrics`.
pub async fn metrics(State(state): State<Arc<AppState>>) -> Response {
    let stats = state.scheduler.stats();
    let counters = state.scheduler.metrics();
    let mut text = Exposition::default();
    text.gauge(
        "runit_requests_running",
        "Sequences admitted and not finished (prefilling or decoding).",
        stats.active as u64,
    );
    text.gauge(
        "runit_requests_waiting",
        "Sequences submitted and not admitted yet.",
        stats.queued as u64,
    );
    text.gauge(
        "runit_kv_blocks_used",
        "KV cache blocks used by running sequences.",
        (stats.total_blocks - stats.free_blocks) as u64,
    );
    text.gauge(
        "runit_kv_blocks_free",
        "KV cache blocks a sequence can take (free, or cached and idle).",
        stats.free_blocks as u64,
    );
    text.gauge(
        "runit_kv_blocks_cached_idle",
        "Idle KV cache blocks kept by the prefix cache (evictable, counted as free).",
        counters.cached_blocks as u64,
    );
    text.gauge(
        "runit_kv_blocks_total",
        "KV cache blocks in the pool.",
        stats.total_blocks as u64,
    );
    text.counter(
        "runit_requests_admitted_total",
        "Sequences admitted to run.",
        counters.admitted,
    );
    text.counter(
        "runit_prompt_tokens_total",
        "Prompt tokens of admitted sequences, cached or evaluated.",
        counters.prompt_tokens,
    );
    text.counter(
        "runit_prefix_cache_hit_tokens_total",
        "Prompt tokens found in the prefix cache (not evaluated).",
        counters.prefix_hit_tokens,
    );
    text.counter(
        "runit_prefix_cache_miss_tokens_total",
        "Prompt tokens evaluated (not found in the prefix cache).",
        counters.prefix_miss_tokens,
    );
    text.counter(
        "runit_prefix_cache_evicted_blocks_total",
        "Cached KV blocks evicted to make room.",
        counters.evicted_blocks,
    );
    text.counter(
        "runit_generation_tokens_total",
        "Tokens generated.",
        counters.generated_tokens,
    );
    text.counter(
        "runit_steps_total",
        "Scheduler steps that ran a forward pass.",
        counters.steps,
    );
    text.counter_seconds(
        "runit_step_seconds_total",
        "Seconds of those steps, whole (admission, passes, sampling, reporting).",
        counters.step_seconds,
    );
    text.counter_seconds(
        "runit_step_pass_seconds_total",
        "Seconds of the steps' forward passes, results included (on a GPU, the host waits for the device in them).",
        counters.pass_seconds,
    );
    text.counter_seconds(
        "runit_step_host_seconds_total",
        "Seconds of the steps the host worked: outside the forward passes (a draft model's included), and inside them checking, building and submitting them.",
        counters.step_seconds - counters.pass_seconds + counters.submit_seconds,
    );
    text.histogram(
        "runit_time_to_first_token_seconds",
        "Seconds from a sequence's submission to its first token.",
        &counters.time_to_first_token,
    );
    text.histogram(
        "runit_inter_token_latency_seconds",
        "Seconds between a sequence's consecutive tokens.",
        &counters.inter_token_latency,
    );
    ([(header::CONTENT_TYPE, CONTENT_TYPE)], text.body).into_response()
}

/// A text exposition being written, metric family by family.
#[derive(Default)]
struct Exposition {
    body: String,
}

impl Exposition {
    fn family(&mut self, name: &str, help: &str, kind: &str) {
        // Writing to a String cannot fail.
        let _ = writeln!(self.body, "# HELP {name} {help}\n# TYPE {name} {kind}");
    }

    fn gauge(&mut self, name: &str, help: &str, value: u64) {
        self.family(name, help, "gauge");
        let _ = writeln!(self.body, "{name} {value}");
    }

    fn counter(&mut self, name: &str, help: &str, value: u64) {
        self.family(name, help, "counter");
        let _ = writeln!(self.body, "{name} {value}");
    }

    fn counter_seconds(&mut self, name: &str, help: &str, value: f64) {
        self.family(name, help, "counter");
        let _ = writeln!(self.body, "{name} {value}");
    }

    /// Cumulative buckets up to each bound, then `+Inf`, the sum and the count.
    fn histogram(&mut self, name: &str, help: &str, histogram: &Histogram) {
        self.family(name, help, "histogram");
        let mut cumulative = 0;
        for (bound, count) in histogram.bounds.iter().zip(&histogram.counts) {
            cumulative += count;
            let _ = writeln!(self.body, "{name}_bucket{{le=\"{bound}\"}} {cumulative}");
        }
        let total = histogram.count();
        let _ = writeln!(self.body, "{name}_bucket{{le=\"+Inf\"}} {total}");
        let _ = writeln!(self.body, "{name}_sum {}", histogram.sum);
        let _ = writeln!(self.body, "{name}_count {total}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histograms_are_written_cumulatively() {
        let mut histogram = Histogram::new(&[0.5, 1.0]);
        histogram.observe(0.25);
        histogram.observe(0.75);
        histogram.observe(2.0);
        let mut text = Exposition::default();
        text.histogram("latency_seconds", "Latency.", &histogram);
        assert_eq!(
            text.body,
            "# HELP latency_seconds Latency.\n# TYPE latency_seconds histogram\n\
             latency_seconds_bucket{le=\"0.5\"} 1\nlatency_seconds_bucket{le=\"1\"} 2\n\
             latency_seconds_bucket{le=\"+Inf\"} 3\nlatency_seconds_sum 3\n\
             latency_seconds_count 3\n"
        );
    }
}
