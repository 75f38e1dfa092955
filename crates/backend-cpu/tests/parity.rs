//! The parity suite with the CPU scalar twin as reference and the best SIMD level of this
//! machine (two threads) as candidate; prints the report table (`--nocapture`).

use runit_backend::testing::run_parity;
use runit_backend_cpu::{CpuBackend, SimdLevel};

#[test]
fn simd_and_threads_match_the_scalar_reference() {
    let reference = CpuBackend::with_simd(1, SimdLevel::Scalar).expect("scalar backend");
    let candidate = CpuBackend::new(2).expect("SIMD backend");
    let report = run_parity(&reference, &candidate);
    println!("candidate SIMD level: {:?}", candidate.simd());
    println!("{report}");
    assert!(report.all_passed(), "failures: {:#?}", report.failures());
    // Every case ran (this backend supports every weight type of the suite).
    let skipped = report.skipped();
    assert!(skipped.is_empty(), "skipped: {skipped:#?}");
    assert!(report.passed() > 50, "{} cases passed", report.passed());
}
