//! The generation test of `runit bench`: `batch` sequences, each first filled to `depth`
//! positions, decoded together one token per sequence per step, as llama-bench's `tg` with
//! `-d` (one sequence) and llama-batched-bench's S_TG (many) measure it. Each step computes
//! every sequence's logits and copies them to the host, as both tools do, or with
//! `--pick-on-device` picks the greedy tokens where the logits are and copies only those.

use std::time::Instant;

use runit_backend::SequenceSpan;
use runit_model::{Batch, KvState, Model, Scratch};

/// The shape of one generation test.
pub struct DecodeTest {
    /// Sequences decoded together.
    pub batch: usize,
    /// Positions filled in each sequence before the timed steps.
    pub depth: usize,
    /// Timed steps (tokens generated per sequence).
    pub steps: usize,
    /// Most tokens of one prefill pass.
    pub chunk: usize,
    /// Cells per KV block.
    pub block_size: usize,
    /// Each step picks the greedy tokens on the device and copies only them (instead of
    /// every sequence's logits).
    pub pick_on_device: bool,
}

/// The KV cache and buffers of a [`DecodeTest`], with each sequence's depth filled.
pub struct DecodeBench<'m> {
    model: &'m Model,
    test: DecodeTest,
    kv: KvState,
    scratch: Scratch,
    /// Block table of each sequence: its own run of consecutive blocks.
    tables: Vec<Vec<u32>>,
    logits: Vec<f32>,
}

impl<'m> DecodeBench<'m> {
    /// Allocates the cache for `test` and fills every sequence to its depth with `token(i)`.
    pub fn new(
        model: &'m Model,
        test: DecodeTest,
        kv_types: runit_backend::KvTypes,
        token: impl Fn(usize) -> u32,
    ) -> anyhow::Result<DecodeBench<'m>> {
        let per_sequence = (test.depth + test.steps).div_ceil(test.block_size);
        let cells = test.batch * per_sequence * test.block_size;
        if test.depth + test.steps > model.config.context_length {
            anyhow::bail!(
                "depth {} + {} generated tokens exceed the model's training context ({})",
                test.depth,
                test.steps,
                model.config.context_length
            );
        }
        let kv = KvState::new(model, cells, kv_types)?;
        let scratch = Scratch::new(model, test.batch.max(test.chunk.min(test.depth.max(1))))?;
        let tables = (0..test.batch)
            .map(|s| ((s * per_sequence) as u32..((s + 1) * per_sequence) as u32).collect())
            .collect();
        let mut bench = DecodeBench {
            model,
            test,
            kv,
            scratch,
            tables,
            logits: Vec::new(),
        };
        let prompt: Vec<u32> = (0..bench.test.depth).map(token).collect();
        for sequence in 0..bench.test.batch {
            bench.prefill(sequence, &prompt)?;
        }
        Ok(bench)
    }

    fn span(&self, sequence: usize, first_row: usize, rows: usize, start: usize) -> SequenceSpan {
        SequenceSpan {
            first_row,
            rows,
            start_position: start,
            block_table: self.tables[sequence].clone(),
            block_size: self.test.block_size,
        }
    }

    /// Fills `sequence`'s positions `0..prompt.len()` in passes of at most `chunk` tokens.
    fn prefill(&mut self, sequence: usize, prompt: &[u32]) -> anyhow::Result<()> {
        let chunk = self.scratch.capacity.min(self.test.chunk).max(1);
        for (index, part) in prompt.chunks(chunk).enumerate() {
            let start = index * chunk;
            let positions: Vec<u32> = (start..start + part.len()).map(|p| p as u32).collect();
            let spans = [self.span(sequence, 0, part.len(), start)];
            let batch = Batch {
                tokens: part,
                positions: &positions,
                spans: &spans,
                logit_rows: &[],
                window_spans: None,
                rows_alone: false,
            };
            self.model.forward(
                &batch,
                &mut self.kv,
                &mut self.scratch,
                &mut self.logits,
                None,
            )?;
        }
        Ok(())
    }

    /// Runs the timed steps (each sequence from its depth on) and returns the aggregate
    /// tokens per second (`batch × steps` over the time of all steps) and the time of the
    /// steps.
    pub fn run(&mut self, token: impl Fn(usize) -> u32) -> anyhow::Result<StepTimes> {
        let (batch, depth) = (self.test.batch, self.test.depth);
        let rows: Vec<u32> = (0..batch as u32).collect();
        let mut submit = 0.0;
        let start = Instant::now();
        for step in 0..self.test.steps {
            let position = depth + step;
            let tokens: Vec<u32> = (0..batch).map(|s| token(step * batch + s)).collect();
            let positions = vec![position as u32; batch];
            let spans: Vec<SequenceSpan> =
                (0..batch).map(|s| self.span(s, s, 1, position)).collect();
            let pass = Batch {
                tokens: &tokens,
                positions: &positions,
                spans: &spans,
                logit_rows: &rows,
                window_spans: None,
                rows_alone: false,
            };
            if self.test.pick_on_device {
                self.model
                    .forward_greedy(&pass, &mut self.kv, &mut self.scratch, false)?;
            } else {
                self.model.forward(
                    &pass,
                    &mut self.kv,
                    &mut self.scratch,
                    &mut self.logits,
                    None,
                )?;
            }
            submit += self.scratch.submit_seconds;
        }
        let seconds = start.elapsed().as_secs_f64();
        let steps = self.test.steps.max(1) as f64;
        Ok(StepTimes {
            tokens_per_second: (batch * self.test.steps) as f64 / seconds,
            step_seconds: seconds / steps,
            submit_seconds: submit / steps,
        })
    }
}

/// What the timed steps of one [`DecodeBench::run`] took.
pub struct StepTimes {
    /// Tokens of all sequences per second.
    pub tokens_per_second: f64,
    /// Mean seconds of one step.
    pub step_seconds: f64,
    /// Mean seconds of a step the host spent checking, building and submitting the pass
    /// (`runit_model::Scratch::submit_seconds`): on a GPU the rest of the step the host
    /// waits for the device (and picks or copies the results).
    pub submit_seconds: f64,
}
