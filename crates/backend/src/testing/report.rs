//! The result table of a parity run.

use std::fmt;

use runit_quant::GgmlType;

/// Normalised mean squared error of `candidate` against `reference`:
/// `sum((r - c)²) / sum(r²)`; infinite on a length mismatch or non-finite values, 0 when
/// both are all zero.
pub fn nmse(reference: &[f32], candidate: &[f32]) -> f64 {
    if reference.len() != candidate.len() {
        return f64::INFINITY;
    }
    let mut error = 0.0f64;
    let mut norm = 0.0f64;
    for (r, c) in reference.iter().zip(candidate) {
        if !r.is_finite() || !c.is_finite() {
            return f64::INFINITY;
        }
        let d = f64::from(*r) - f64::from(*c);
        error += d * d;
        norm += f64::from(*r) * f64::from(*r);
    }
    if error == 0.0 {
        0.0
    } else if norm == 0.0 {
        f64::INFINITY
    } else {
        error / norm
    }
}

/// How one case ended.
#[derive(Debug, Clone, PartialEq)]
pub enum ParityOutcome {
    /// NMSE within the bound.
    Passed,
    /// NMSE over the bound.
    Failed,
    /// Not run (the candidate or the reference does not support it), with the reason.
    Skipped(String),
    /// An op returned an error (or did not return the expected one).
    Error(String),
}

/// One row of the report.
#[derive(Debug, Clone)]
pub struct ParityCase {
    /// Op under test (`"matmul"`, `"attention"`, ...).
    pub op: &'static str,
    /// Shape and settings of the case.
    pub detail: String,
    /// Weight type, for ops that take one.
    pub ty: Option<GgmlType>,
    pub nmse: f64,
    pub bound: f64,
    pub outcome: ParityOutcome,
}

impl ParityCase {
    /// True unless the case failed or errored (skips count as ok).
    pub fn ok(&self) -> bool {
        matches!(
            self.outcome,
            ParityOutcome::Passed | ParityOutcome::Skipped(_)
        )
    }
}

/// Every case of a parity run.
#[derive(Debug, Clone, Default)]
pub struct ParityReport {
    pub reference: String,
    pub candidate: String,
    pub cases: Vec<ParityCase>,
}

impl ParityReport {
    /// True when no case failed or errored.
    pub fn all_passed(&self) -> bool {
        self.cases.iter().all(ParityCase::ok)
    }

    /// The cases that failed or errored.
    pub fn failures(&self) -> Vec<&ParityCase> {
        self.cases.iter().filter(|case| !case.ok()).collect()
    }

    /// The cases the candidate did not run (an op or type it does not support).
    pub fn skipped(&self) -> Vec<&ParityCase> {
        self.cases
            .iter()
            .filter(|case| matches!(case.outcome, ParityOutcome::Skipped(_)))
            .collect()
    }

    /// Number of cases that ran and passed.
    pub fn passed(&self) -> usize {
        self.cases
            .iter()
            .filter(|case| case.outcome == ParityOutcome::Passed)
            .count()
    }
}

impl fmt::Display for ParityReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "parity: {} (candidate) vs {} (reference)",
            self.candidate, self.reference
        )?;
        writeln!(
            f,
            "{:<18} {:<44} {:<7} {:>10} {:>8}  ok",
            "op", "case", "type", "nmse", "bound"
        )?;
        for case in &self.cases {
            let ty = case.ty.map_or("-".to_string(), |t| t.name().to_string());
            let status = match &case.outcome {
                ParityOutcome::Passed => "ok".to_string(),
                ParityOutcome::Failed => "FAIL".to_string(),
                ParityOutcome::Skipped(why) => format!("skipped ({why})"),
                ParityOutcome::Error(why) => format!("ERROR ({why})"),
            };
            writeln!(
                f,
                "{:<18} {:<44} {:<7} {:>10.3e} {:>8.0e}  {status}",
                case.op, case.detail, ty, case.nmse, case.bound
            )?;
        }
        writeln!(
            f,
            "{} passed, {} failed, {} cases",
            self.passed(),
            self.failures().len(),
            self.cases.len()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nmse_of_known_vectors() {
        assert_eq!(nmse(&[1.0, 2.0], &[1.0, 2.0]), 0.0);
        // error 0.25 + 0, norm 1 + 4.
        assert!((nmse(&[1.0, 2.0], &[1.5, 2.0]) - 0.05).abs() < 1e-12);
        assert_eq!(nmse(&[1.0], &[1.0, 2.0]), f64::INFINITY);
        assert_eq!(nmse(&[0.0], &[1.0]), f64::INFINITY);
        assert_eq!(nmse(&[1.0], &[f32::NAN]), f64::INFINITY);
    }
}
