//! The backend parity suite on a wgpu adapter (Mesa's lavapipe in CI), with the CPU scalar
//! twin as the reference.
//!
//! Without an adapter the test prints a notice and passes, unless `RUNIT_REQUIRE_WGPU=1`,
//! where that fails. Cases this backend does not run yet (weight types without a kernel,
//! quantized KV caches) are listed, not hidden: skipped types print as skipped, and the
//! attention cases on Q8_0/Q4_0 caches must fail with `UnsupportedKv`.

use runit_backend::testing::{run_parity, ParityOutcome};
use runit_backend_cpu::{CpuBackend, SimdLevel};
use runit_backend_wgpu::WgpuBackend;

fn require_wgpu() -> bool {
    std::env::var("RUNIT_REQUIRE_WGPU").is_ok_and(|v| v == "1")
}

/// Quantized KV caches are not stored by this backend yet: their attention cases must be
/// refused with the error that says so.
fn refused_kv_type(detail: &str, outcome: &ParityOutcome) -> bool {
    let quantized = detail.contains("Q8_0") || detail.contains("Q4_0");
    matches!(outcome, ParityOutcome::Error(message)
        if quantized && message.contains("KV cache type") && message.contains("not supported"))
}

#[test]
fn wgpu_matches_the_cpu_reference() {
    let backend = match WgpuBackend::new(0) {
        Ok(backend) => backend,
        Err(error) => {
            assert!(!require_wgpu(), "RUNIT_REQUIRE_WGPU=1 but: {error}");
            println!("NOTICE: no wgpu adapter, parity not run: {error}");
            return;
        }
    };
    let reference = CpuBackend::with_simd(1, SimdLevel::Scalar).expect("scalar backend");
    let report = run_parity(&reference, &backend);
    println!("adapter: {}", backend.adapter());
    println!("{report}");
    let failures: Vec<_> = report
        .failures()
        .into_iter()
        .filter(|case| !(case.op == "attention" && refused_kv_type(&case.detail, &case.outcome)))
        .collect();
    assert!(failures.is_empty(), "failures: {failures:#?}");
}
