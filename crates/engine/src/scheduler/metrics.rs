//! What the scheduler counts for monitoring (`/metrics`): tokens in and out, prefix-cache
//! hits and misses, and the latency histograms of first tokens and of the tokens after.

use std::time::Duration;

/// Upper bounds in seconds of the time-to-first-token buckets (vLLM's).
pub const FIRST_TOKEN_BOUNDS: &[f64] = &[
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0,
];

/// Upper bounds in seconds of the inter-token-latency buckets (vLLM's).
pub const INTER_TOKEN_BOUNDS: &[f64] = &[
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
    40.0, 80.0,
];

/// Observations counted into buckets of fixed upper bounds, as Prometheus histograms are.
#[derive(Debug, Clone, PartialEq)]
pub struct Histogram {
    /// Upper bounds of the buckets, ascending; a last bucket without bound follows.
    pub bounds: &'static [f64],
    /// Observations per bucket (not cumulative), `bounds.len() + 1` of them.
    pub counts: Vec<u64>,
    /// Sum of the observations.
    pub sum: f64,
}

impl Histogram {
    /// An empty histogram with buckets up to `bounds`.
    pub fn new(bounds: &'static [f64]) -> Histogram {
        Histogram {
            bounds,
            counts: vec![0; bounds.len() + 1],
            sum: 0.0,
        }
    }

    /// Counts `value` in the first bucket whose bound is at least `value`.
    pub fn observe(&mut self, value: f64) {
        let bucket = self.bounds.partition_point(|&bound| bound < value);
        self.counts[bucket] += 1;
        self.sum += value;
    }

    /// Observations in all.
    pub fn count(&self) -> u64 {
        self.counts.iter().sum()
    }
}

/// Counters since the scheduler started.
#[derive(Debug, Clone, PartialEq)]
pub struct SchedulerMetrics {
    /// Requests (sequences) admitted.
    pub admitted: u64,
    /// Prompt tokens of the admitted sequences, cached or evaluated.
    pub prompt_tokens: u64,
    /// Prompt tokens found in the prefix cache (not evaluated).
    pub prefix_hit_tokens: u64,
    /// Prompt tokens evaluated: not cached, or cached but recomputed (at least the last).
    pub prefix_miss_tokens: u64,
    /// Tokens generated and reported.
    pub generated_tokens: u64,
    /// Idle blocks the prefix cache holds (evictable, so counted as free), as of the
    /// latest step.
    pub cached_blocks: usize,
    /// Cached blocks evicted to make room.
    pub evicted_blocks: u64,
    /// Scheduler steps that ran at least one forward pass.
    pub steps: u64,
    /// Seconds of those steps, whole (admission, passes, sampling, reporting).
    pub step_seconds: f64,
    /// Seconds of their forward passes, results included (on a GPU: the device's time as
    /// the host waits for it).
    pub pass_seconds: f64,
    /// Seconds of those passes the host spent checking, building and submitting them
    /// (`runit_model::Scratch::submit_seconds`); `step_seconds - pass_seconds +
    /// submit_seconds` is the steps' host time.
    pub submit_seconds: f64,
    /// Seconds from submission to a sequence's first token.
    pub time_to_first_token: Histogram,
    /// Seconds between a sequence's consecutive tokens.
    pub inter_token_latency: Histogram,
}

impl Default for SchedulerMetrics {
    fn default() -> Self {
        SchedulerMetrics {
            admitted: 0,
            prompt_tokens: 0,
            prefix_hit_tokens: 0,
            prefix_miss_tokens: 0,
            generated_tokens: 0,
            cached_blocks: 0,
            evicted_blocks: 0,
            steps: 0,
            step_seconds: 0.0,
            pass_seconds: 0.0,
            submit_seconds: 0.0,
            time_to_first_token: Histogram::new(FIRST_TOKEN_BOUNDS),
            inter_token_latency: Histogram::new(INTER_TOKEN_BOUNDS),
        }
    }
}

impl SchedulerMetrics {
    /// Counts an admitted sequence with `prompt_len` prompt tokens, `reused` of them cached.
    pub(super) fn admit(&mut self, prompt_len: usize, reused: usize) {
        self.admitted += 1;
        self.prompt_tokens += prompt_len as u64;
        self.prefix_hit_tokens += reused as u64;
        self.prefix_miss_tokens += (prompt_len - reused) as u64;
    }

    /// Counts a step of `seconds` whose passes took `pass` seconds, `submit` of them on
    /// the host (nothing for a step without a pass).
    pub(super) fn step(&mut self, seconds: f64, pass: f64, submit: f64) {
        if pass == 0.0 {
            return;
        }
        self.steps += 1;
        self.step_seconds += seconds;
        self.pass_seconds += pass;
        self.submit_seconds += submit;
    }

    /// Counts a generated token that came `since` after the sequence's submission (its
    /// first token) or its previous token.
    pub(super) fn token(&mut self, first: bool, since: Duration) {
        self.generated_tokens += 1;
        let histogram = if first {
            &mut self.time_to_first_token
        } else {
            &mut self.inter_token_latency
        };
        histogram.observe(since.as_secs_f64());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn observations_land_in_the_first_bucket_that_holds_them() {
        let mut histogram = Histogram::new(&[0.1, 1.0]);
        for value in [0.05, 0.1, 0.5, 3.0] {
            histogram.observe(value);
        }
        assert_eq!(histogram.counts, [2, 1, 1]);
        assert_eq!(histogram.count(), 4);
        assert!((histogram.sum - 3.65).abs() < 1e-12);
    }
}
