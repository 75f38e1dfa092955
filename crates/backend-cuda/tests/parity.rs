//! The backend parity suite on the GPU, with the CPU scalar twin as the reference.
//!
//! Without a CUDA driver or device the test prints a notice and passes, unless
//! `RUNIT_REQUIRE_GPU=1` (set on the GPU machine), where that fails.

use runit_backend::testing::run_parity;
use runit_backend_cpu::{CpuBackend, SimdLevel};
use runit_backend_cuda::CudaBackend;

fn require_gpu() -> bool {
    std::env::var("RUNIT_REQUIRE_GPU").is_ok_and(|v| v == "1")
}

#[test]
fn cuda_matches_the_cpu_reference() {
    let cuda = match CudaBackend::new(0) {
        Ok(cuda) => cuda,
        Err(error) => {
            assert!(!require_gpu(), "RUNIT_REQUIRE_GPU=1 but: {error}");
            println!("NOTICE: no CUDA device, parity not run: {error}");
            return;
        }
    };
    let reference = CpuBackend::with_simd(1, SimdLevel::Scalar).expect("scalar backend");
    let report = run_parity(&reference, &cuda);
    println!("device: {} ({})", cuda.device_name(), cuda.target().arch());
    println!("{report}");
    assert!(report.all_passed(), "failures: {:#?}", report.failures());
    let skipped = report.skipped();
    assert!(skipped.is_empty(), "skipped: {skipped:#?}");
}
