//! Every kernel compiles with NVRTC for sm_80 and sm_90, on a machine without a GPU.
//!
//! Needs the NVRTC library (the `nvidia-cuda-nvrtc` Python package gives it; `scripts/test.sh`
//! installs it and sets `RUNIT_NVRTC_LIB`). Without it the test prints a notice and passes,
//! unless `RUNIT_REQUIRE_NVRTC=1` (set by CI), where a missing NVRTC fails.

use runit_backend_cuda::{compile_all, CudaError, Target, SOURCES};

/// Every kernel file compiles for `major.minor` (one test per target, so the harness compiles
/// both targets at once).
fn every_kernel_compiles_for(major: i32, minor: i32) {
    let target = Target { major, minor };
    match compile_all(&target) {
        Ok(built) => {
            assert_eq!(built.len(), SOURCES.len());
            for (file, size) in built {
                println!("{}: {file} -> {size} bytes of cubin", target.arch());
                assert!(size > 0, "{file} gave an empty cubin");
            }
        }
        Err(CudaError::NoNvrtc { tried }) => {
            assert!(
                std::env::var("RUNIT_REQUIRE_NVRTC").map_or(true, |v| v != "1"),
                "RUNIT_REQUIRE_NVRTC=1 but NVRTC was not found (tried {tried})"
            );
            println!("NOTICE: NVRTC not found, kernels not compiled (tried {tried})");
        }
        Err(error) => panic!("{error}"),
    }
}

#[test]
fn every_kernel_compiles_for_sm80() {
    every_kernel_compiles_for(8, 0);
}

#[test]
fn every_kernel_compiles_for_sm90() {
    every_kernel_compiles_for(9, 0);
}

#[test]
fn a_broken_kernel_reports_the_nvrtc_log() {
    let broken = runit_backend_cuda::KernelSource {
        file: "broken.cu",
        text: "extern \"C\" __global__ void k(float* x) { x[0] = undefined_name; }",
        options: &[],
    };
    match runit_backend_cuda::compile::compile(&broken, &Target { major: 9, minor: 0 }) {
        Err(CudaError::Compile { file, log, .. }) => {
            assert_eq!(file, "broken.cu");
            assert!(log.contains("undefined_name"), "log: {log}");
        }
        Err(CudaError::NoNvrtc { .. }) => println!("NOTICE: NVRTC not found"),
        other => panic!("expected a compile error, got {other:?}"),
    }
}
