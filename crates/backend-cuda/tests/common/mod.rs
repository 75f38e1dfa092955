//! What the GPU test files share.

use runit_backend_cuda::CudaBackend;

/// Device 0, or `None` with a notice naming the `tests` not run when there is no CUDA
/// device (a failure instead under `RUNIT_REQUIRE_GPU=1`).
pub fn cuda_or_notice(tests: &str) -> Option<CudaBackend> {
    match CudaBackend::new(0) {
        Ok(cuda) => Some(cuda),
        Err(error) => {
            let required = std::env::var("RUNIT_REQUIRE_GPU").is_ok_and(|v| v == "1");
            assert!(!required, "RUNIT_REQUIRE_GPU=1 but: {error}");
            println!("NOTICE: no CUDA device, {tests} not run: {error}");
            None
        }
    }
}
