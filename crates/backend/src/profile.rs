//! Device time per kernel, for the GPU backends' profiling switches (`RUNIT_CUDA_PROFILE`,
//! `RUNIT_WGPU_PROFILE`): each backend times its launches its own way and sums them here, by
//! a label naming the kernel and its launch shape; [`KernelTimes::report`] is the table both
//! print.

use std::collections::HashMap;

/// Calls and total milliseconds per label.
#[derive(Default)]
pub struct KernelTimes {
    totals: HashMap<String, (u64, f64)>,
}

impl KernelTimes {
    /// One launch of `label` that took `milliseconds`.
    pub fn add(&mut self, label: String, milliseconds: f64) {
        let total = self.totals.entry(label).or_default();
        total.0 += 1;
        total.1 += milliseconds;
    }

    /// The table, largest first: total milliseconds, share, calls, mean microseconds and the
    /// label, under a line `{title}: T ms of kernels in N {launches}` and the column heads
    /// (`label_head` naming the last).
    pub fn report(&self, title: &str, launches: &str, label_head: &str) -> String {
        let all: f64 = self.totals.values().map(|t| t.1).sum();
        let mut rows: Vec<(&String, &(u64, f64))> = self.totals.iter().collect();
        rows.sort_by(|a, b| b.1 .1.total_cmp(&a.1 .1));
        let mut text = format!(
            "{title}: {all:.3} ms of kernels in {} {launches}\n{:>11} {:>6} {:>8} {:>10}  {label_head}\n",
            rows.iter().map(|r| r.1 .0).sum::<u64>(),
            "total ms",
            "share",
            "calls",
            "mean us",
        );
        for (label, &(calls, milliseconds)) in rows {
            text += &format!(
                "{milliseconds:>11.3} {:>5.1}% {calls:>8} {:>10.2}  {label}\n",
                100.0 * milliseconds / all.max(f64::MIN_POSITIVE),
                1000.0 * milliseconds / calls as f64,
            );
        }
        text
    }
}

#[cfg(test)]
mod tests {
    use super::KernelTimes;

    #[test]
    fn the_report_sums_per_label_largest_first() {
        let mut times = KernelTimes::default();
        times.add("a [1x1x1]".into(), 1.0);
        times.add("b [2x1x1]".into(), 3.0);
        times.add("a [1x1x1]".into(), 1.0);
        let report = times.report("TEST", "launches", "kernel [grid]");
        let lines: Vec<&str> = report.lines().collect();
        assert_eq!(lines[0], "TEST: 5.000 ms of kernels in 3 launches");
        assert!(
            lines[2].ends_with("b [2x1x1]") && lines[2].contains("60.0%"),
            "{report}"
        );
        assert!(
            lines[3].ends_with("a [1x1x1]") && lines[3].contains("1000.00"),
            "{report}"
        );
    }
}
