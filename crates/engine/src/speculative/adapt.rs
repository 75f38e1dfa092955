//! The draft length of each step, from what has been measured: the per-token acceptance
//! rate `a` (a running average), the share `h` of drafting calls that return a draft at
//! all, the target's pass time for each row count, and the drafter's time per token it
//! evaluates (a call evaluates one token more than it drafts, the one that told it to stop).
//! Asking for `k` tokens yields `h (1 + a + ... + a^k) + (1 - h)` tokens per step on
//! average (drafts are kept up to the first rejection, and the pass yields one token of its
//! own) and costs `h pass(k + 1) + (1 - h) pass(1)` plus `(1 + h k)` drafted tokens' time;
//! the length with the most tokens per second wins, 0 (a plain step without drafting)
//! included. When 0 wins, one token is drafted after [`PROBE_EVERY`] plain steps so that a
//! drafter that gets better is noticed; a probe costs one drafting call and a pass of two
//! rows. For a drafter whose calls cost something (a draft model catching up), the wait
//! doubles after each probe whose draft is rejected (up to [`PROBE_EVERY_MOST`]), so probes
//! take less and less of the steps' time; a kept probe draft brings the next probe back to
//! [`PROBE_EVERY`] steps, so that a good drafter is not shut out for long by a run of
//! rejections. A probe's drafting call is not timed: after plain
//! steps a draft model first catches up with the tokens it missed (up to
//! `draft_model::CATCH_UP_LIMIT` of them in one pass), which a drafting step does not pay,
//! and counting it as the drafter's usual cost once kept an early run of rejections from
//! ever being outgrown.

/// Plain steps before the first probe while plain steps win.
pub const PROBE_EVERY: usize = 32;
/// Most plain steps between probes.
pub const PROBE_EVERY_MOST: usize = 1024;
/// Share of plain decoding's speed that drafting may give up for the chance to draft.
const TIE: f64 = 0.01;
/// Weight of the newest observation in the running averages of times.
const SMOOTHING: f64 = 0.2;
/// Least weight of the newest verdict in the acceptance rate, which is the plain mean of the
/// verdicts (and the prior, as one) until there are this many's inverse: one verdict is a
/// coin flip, and a faster average dipped below the break-even on short runs of
/// rejections, after which probes of one token took hundreds of steps to bring a drafter
/// kept ~90% of the time back (SmolLM2 F16 drafted by Q4_1: 1.12x-1.15x in some runs
/// against 1.44x in others).
const ACCEPTANCE_SMOOTHING: f64 = 0.05;
/// The acceptance rate assumed before any draft was verified: optimistic enough that
/// speculation is tried.
const PRIOR_ACCEPTANCE: f64 = 0.6;
/// Extra cost of each further row of a pass relative to one row, assumed until measured
/// (decode is bound by reading the weights, which a pass reads once).
const PRIOR_ROW_COST: f64 = 0.05;

/// The adaptive draft length.
#[derive(Debug, Clone)]
pub struct DraftLength {
    min: usize,
    max: usize,
    acceptance: f64,
    /// Verdicts counted into `acceptance`.
    verdicts: usize,
    /// Running average of a pass's seconds, by rows (index 0 unused).
    pass_seconds: Vec<Option<f64>>,
    /// Running average of the drafter's seconds per evaluated token.
    draft_seconds: Option<f64>,
    /// Running average of the share of drafting calls that return a draft.
    hits: f64,
    plain_steps: usize,
    /// Plain steps before the next probe.
    probe_after: usize,
    /// The last length chosen was a probe (its drafting call is not timed).
    probing: bool,
}

impl DraftLength {
    /// Lengths `min..=max` (and 0); `min` 0 is taken as 1.
    pub fn new(min: usize, max: usize) -> DraftLength {
        DraftLength {
            min: min.max(1),
            max,
            acceptance: PRIOR_ACCEPTANCE,
            verdicts: 0,
            pass_seconds: vec![None; max + 2],
            draft_seconds: None,
            hits: 1.0,
            plain_steps: 0,
            probe_after: PROBE_EVERY,
            probing: false,
        }
    }

    /// The estimated per-token acceptance rate.
    pub fn acceptance(&self) -> f64 {
        self.acceptance
    }

    /// The length to draft now, at most `room` (0: a plain step).
    pub fn choose(&mut self, room: usize) -> usize {
        let max = self.max.min(room);
        if max < self.min {
            return 0;
        }
        // Drafting wins ties within [`TIE`]: a drafter that costs nothing keeps being asked.
        let plain = (1.0 - TIE) / self.pass(1);
        let (best, _) = (self.min..=max)
            .map(|k| {
                let tokens = self.hits * self.expected_tokens(k) + (1.0 - self.hits);
                (k, tokens / self.cost(k))
            })
            .fold(
                (0, plain),
                |best, next| if next.1 > best.1 { next } else { best },
            );
        if best > 0 {
            self.plain_steps = 0;
            self.probe_after = PROBE_EVERY;
            self.probing = false;
            return best;
        }
        self.plain_steps += 1;
        if self.plain_steps >= self.probe_after {
            self.plain_steps = 0;
            // A call that costs more than 1% of a pass: wait longer next time (unless the
            // probe's draft is kept, `record_verdict`).
            let call = 2.0 * self.draft_seconds.unwrap_or(0.0);
            if call > TIE * self.pass(1) {
                self.probe_after = (self.probe_after * 2).min(PROBE_EVERY_MOST);
            }
            self.probing = true;
            return self.min;
        }
        0
    }

    /// The running average of a target pass of `rows` rows, in seconds, when one was
    /// measured.
    pub fn pass_seconds(&self, rows: usize) -> Option<f64> {
        self.pass_seconds.get(rows).copied().flatten()
    }

    /// Records a target pass of `rows` rows that took `seconds`.
    pub fn record_pass(&mut self, rows: usize, seconds: f64) {
        if let Some(slot) = self.pass_seconds.get_mut(rows) {
            *slot = Some(average(*slot, seconds));
        }
    }

    /// Records a drafting call that returned `tokens` tokens (maybe none) in `seconds` (not
    /// timed when the call was a probe's).
    pub fn record_draft(&mut self, tokens: usize, seconds: f64) {
        if !self.probing || self.draft_seconds.is_none() {
            let evaluated = (tokens + 1) as f64;
            self.draft_seconds = Some(average(self.draft_seconds, seconds / evaluated));
        }
        self.hits = average(Some(self.hits), f64::from(u8::from(tokens > 0)));
    }

    /// Records a verification of `drafted` tokens whose first `accepted` were kept.
    pub fn record_verdict(&mut self, drafted: usize, accepted: usize) {
        // Positions judged: every kept draft and the first rejected one.
        let judged = accepted + usize::from(accepted < drafted);
        for kept in (0..judged).map(|i| i < accepted) {
            self.verdicts += 1;
            let weight = (1.0 / (self.verdicts + 1) as f64).max(ACCEPTANCE_SMOOTHING);
            self.acceptance += weight * (f64::from(u8::from(kept)) - self.acceptance);
        }
        if self.probing && drafted > 0 && accepted == drafted {
            self.probe_after = PROBE_EVERY;
        }
    }

    /// `1 + a + ... + a^k`.
    fn expected_tokens(&self, k: usize) -> f64 {
        (0..=k).map(|i| self.acceptance.powi(i as i32)).sum()
    }

    fn cost(&self, k: usize) -> f64 {
        let h = self.hits;
        let drafting = (1.0 + h * k as f64) * self.draft_seconds.unwrap_or(0.0);
        h * self.pass(k + 1) + (1.0 - h) * self.pass(1) + drafting
    }

    /// A pass of `rows` rows: measured, else interpolated between the nearest measured row
    /// counts, else extrapolated from one row at [`PRIOR_ROW_COST`] per further row.
    fn pass(&self, rows: usize) -> f64 {
        if let Some(Some(seconds)) = self.pass_seconds.get(rows) {
            return *seconds;
        }
        let at = |r: usize| self.pass_seconds.get(r).copied().flatten().map(|s| (r, s));
        let below = (1..rows).rev().find_map(at);
        let above = (rows + 1..self.pass_seconds.len()).find_map(at);
        let one = self.pass_seconds[1].unwrap_or(1.0);
        match (below, above) {
            (Some((r0, s0)), Some((r1, s1))) => {
                s0 + (s1 - s0) * (rows - r0) as f64 / (r1 - r0) as f64
            }
            (Some((r0, s0)), None) => s0 + one * PRIOR_ROW_COST * (rows - r0) as f64,
            (None, Some((r1, s1))) => (s1 - one * PRIOR_ROW_COST * (r1 - rows) as f64).max(0.0),
            (None, None) => one * (1.0 + PRIOR_ROW_COST * (rows - 1) as f64),
        }
    }
}

fn average(old: Option<f64>, new: f64) -> f64 {
    match old {
        Some(old) => old + SMOOTHING * (new - old),
        None => new,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_good_drafter_gets_long_drafts_and_a_poor_one_plain_steps() {
        let mut length = DraftLength::new(0, 16);
        for rows in 1..=17 {
            // A pass costs 10 ms plus 1 ms a further row.
            length.record_pass(rows, 0.010 + 0.001 * (rows - 1) as f64);
        }
        for _ in 0..50 {
            length.record_verdict(8, 8);
        }
        assert_eq!(length.choose(100), 16);
        assert_eq!(length.choose(5), 5, "no more than the room");
        for _ in 0..50 {
            length.record_verdict(4, 0);
            // Drafting calls that cost a fifth of a pass.
            length.record_draft(4, 0.010);
        }
        assert!(length.acceptance() < 0.1);
        let chosen: Vec<usize> = (0..3 * PROBE_EVERY).map(|_| length.choose(100)).collect();
        let probes: Vec<usize> = (0..chosen.len()).filter(|&i| chosen[i] > 0).collect();
        assert_eq!(
            probes,
            [PROBE_EVERY - 1, 3 * PROBE_EVERY - 1],
            "the wait doubles"
        );
    }

    #[test]
    fn a_slow_drafter_must_earn_its_time() {
        let mut length = DraftLength::new(1, 8);
        length.record_pass(1, 0.010);
        length.record_pass(9, 0.012);
        for _ in 0..50 {
            length.record_verdict(4, 2);
        }
        // Acceptance near 0.67: worth drafting when drafting is cheap ...
        length.record_draft(4, 0.0005);
        assert!(length.choose(100) > 1);
        // ... and not when a drafted token costs as much as a pass.
        for _ in 0..20 {
            length.record_draft(1, 0.020);
        }
        assert_eq!(length.choose(100), 0);
    }

    #[test]
    fn a_drafter_that_rarely_drafts_pays_for_its_calls() {
        let mut length = DraftLength::new(1, 8);
        length.record_pass(1, 0.010);
        length.record_pass(9, 0.012);
        for _ in 0..50 {
            length.record_verdict(4, 4);
        }
        // Free calls (prompt lookup finding nothing): drafting is still worth asking for.
        for _ in 0..50 {
            length.record_draft(0, 0.000_01);
        }
        assert!(length.choose(100) > 0);
        // Calls that cost a pass and draft nothing (a draft model below --draft-p-min).
        for _ in 0..50 {
            length.record_draft(0, 0.010);
        }
        assert_eq!(length.choose(100), 0);
    }

    /// A probe's call (slow: it catches up after plain steps) does not count as the
    /// drafter's usual cost, so kept probes bring drafting back.
    #[test]
    fn probes_catching_up_do_not_make_the_drafter_look_slow() {
        let mut length = DraftLength::new(1, 8);
        for rows in 1..=9 {
            length.record_pass(rows, 0.010 + 0.0005 * (rows - 1) as f64);
        }
        length.record_draft(4, 0.010);
        for _ in 0..4 {
            length.record_verdict(4, 0);
        }
        assert_eq!(length.choose(100), 0, "rejections: plain steps");
        // Probes (one token each) whose drafts are kept, until drafting comes back.
        let mut probes = 0;
        loop {
            match length.choose(100) {
                0 => {}
                1 => {
                    probes += 1;
                    assert!(probes <= 20, "twenty kept probes and still plain steps");
                    // Each probe catches up 16 tokens: three passes' time.
                    length.record_draft(1, 0.030);
                    length.record_verdict(1, 1);
                }
                _ => break,
            }
        }
    }

    /// Probes whose drafts are kept come every [`PROBE_EVERY`] steps and bring drafting
    /// back; rejected ones come ever more rarely.
    #[test]
    fn kept_probes_come_often_and_bring_drafting_back() {
        let mut length = DraftLength::new(1, 8);
        for rows in 1..=9 {
            length.record_pass(rows, 0.010 + 0.0005 * (rows - 1) as f64);
        }
        // A drafter costing a third of a pass per token, whose first drafts are rejected.
        length.record_draft(4, 0.015);
        for _ in 0..10 {
            length.record_verdict(4, 0);
        }
        let mut steps = 0;
        let mut probes = Vec::new();
        loop {
            steps += 1;
            assert!(
                steps < 2000,
                "drafting never came back: probes at {probes:?}"
            );
            match length.choose(100) {
                0 => {}
                1 => {
                    probes.push(steps);
                    length.record_draft(1, 0.006);
                    // The first two probes' drafts are rejected, then kept.
                    let kept = usize::from(probes.len() > 2);
                    length.record_verdict(1, kept);
                }
                _ => break,
            }
        }
        let gaps: Vec<usize> = probes.windows(2).map(|w| w[1] - w[0]).collect();
        assert_eq!(
            gaps[0],
            2 * PROBE_EVERY,
            "a rejected probe doubles the wait: {gaps:?}"
        );
        assert!(
            gaps[2..].iter().all(|&gap| gap == PROBE_EVERY),
            "kept probes come every {PROBE_EVERY} steps: {gaps:?}"
        );
    }

    /// A drafter kept 90% of the time keeps drafting through a short run of rejections.
    #[test]
    fn a_run_of_rejections_does_not_stop_a_good_drafter() {
        let mut length = DraftLength::new(1, 8);
        for rows in 1..=9 {
            length.record_pass(rows, 0.010 + 0.001 * (rows - 1) as f64);
        }
        // Drafted tokens costing a third of a pass each.
        length.record_draft(8, 0.030);
        for i in 0..60 {
            length.record_verdict(8, if i % 3 == 2 { 7 } else { 8 });
        }
        assert!(length.choose(100) > 0);
        for _ in 0..3 {
            length.record_verdict(8, 0);
        }
        assert!(length.choose(100) > 0, "acceptance {}", length.acceptance());
    }

    #[test]
    fn unmeasured_row_counts_are_interpolated() {
        let mut length = DraftLength::new(1, 8);
        length.record_pass(1, 0.010);
        length.record_pass(5, 0.014);
        assert!((length.pass(3) - 0.012).abs() < 1e-12);
        assert!((length.pass(7) - (0.014 + 2.0 * 0.010 * PRIOR_ROW_COST)).abs() < 1e-12);
    }
}
