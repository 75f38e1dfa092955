//! A kernel fault on the GPU is reported with the op's name and the process exits cleanly:
//! `runit generate --device cuda` with a fault planted after the first matmul launch
//! (`RUNIT_CUDA_PLANT_FAULT=matmul`, a testing hook of the CUDA backend) prints the error and
//! exits with status 1, without a panic, an abort or a hang; with `RUNIT_CUDA_SYNC=1` the
//! error names `matmul`, without it the message says how to find the op.
//!
//! Needs the `cuda` feature (`cargo test -p runit-cli --features cuda --test cuda_fault`) and
//! a GPU; otherwise the tests print a notice and pass, unless `RUNIT_REQUIRE_GPU=1`. On a
//! machine where the binaries were copied, `RUNIT_BIN` names the `runit` binary and
//! `RUNIT_MODEL_DIR` the folder of model files (as for the engine's golden tests).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// How long one `runit generate` may take before it counts as hung.
const TIMEOUT: Duration = Duration::from_secs(300);

fn require_gpu() -> bool {
    std::env::var("RUNIT_REQUIRE_GPU").is_ok_and(|v| v == "1")
}

/// True when this test binary can run the GPU checks (else prints why not).
fn gpu_available() -> bool {
    #[cfg(feature = "cuda")]
    {
        match runit_backend_cuda::CudaBackend::new(0) {
            Ok(_) => true,
            Err(error) => {
                assert!(!require_gpu(), "RUNIT_REQUIRE_GPU=1 but: {error}");
                println!("NOTICE: no CUDA device, kernel fault test not run: {error}");
                false
            }
        }
    }
    #[cfg(not(feature = "cuda"))]
    {
        assert!(
            !require_gpu(),
            "RUNIT_REQUIRE_GPU=1 but this test was built without the `cuda` feature"
        );
        println!("NOTICE: built without the `cuda` feature, kernel fault test not run");
        false
    }
}

fn runit() -> PathBuf {
    std::env::var_os("RUNIT_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_runit")))
}

fn model() -> PathBuf {
    let models = match std::env::var_os("RUNIT_MODEL_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models"),
    };
    models.join("synth-qwen2-Q8_0.gguf")
}

/// Exit code and stderr of `runit generate` on the GPU with `env` set (and RUNIT_CUDA_SYNC /
/// RUNIT_CUDA_PLANT_FAULT cleared unless given); fails the test if it outlives [`TIMEOUT`].
fn generate(label: &str, env: &[(&str, &str)]) -> (Option<i32>, String) {
    let dir = std::env::temp_dir();
    let stderr_path = dir.join(format!("runit-fault-{}-{label}.stderr", std::process::id()));
    let stderr = std::fs::File::create(&stderr_path).expect("stderr file");
    let mut command = Command::new(runit());
    command
        .args(["generate", "-m"])
        .arg(model())
        .args(["-p", "Hello there", "-n", "4", "--temperature", "0"])
        .args(["--device", "cuda"])
        .env_remove("RUNIT_CUDA_SYNC")
        .env_remove("RUNIT_CUDA_PLANT_FAULT")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(stderr);
    for (key, value) in env {
        command.env(key, value);
    }
    let mut child = command.spawn().expect("runit starts");
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("waiting for runit") {
            break status;
        }
        if start.elapsed() > TIMEOUT {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{label}: runit generate still running after {TIMEOUT:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let text = std::fs::read_to_string(&stderr_path).unwrap_or_default();
    let _ = std::fs::remove_file(&stderr_path);
    println!("{label}: {status}\n{text}");
    (status.code(), text)
}

#[test]
fn a_kernel_fault_names_its_op_and_exits_with_status_1() {
    if !gpu_available() {
        return;
    }
    // Without a planted fault the same command succeeds: the failures below are the fault's.
    let (code, stderr) = generate("clean", &[]);
    assert_eq!(code, Some(0), "{stderr}");

    let (code, stderr) = generate(
        "sync",
        &[
            ("RUNIT_CUDA_SYNC", "1"),
            ("RUNIT_CUDA_PLANT_FAULT", "matmul"),
        ],
    );
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("error:"), "{stderr}");
    assert!(stderr.contains("a kernel of matmul faulted"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");

    // Without RUNIT_CUDA_SYNC the fault is found later, at some op or download; the message
    // names where and says how to pinpoint it.
    let (code, stderr) = generate("async", &[("RUNIT_CUDA_PLANT_FAULT", "matmul")]);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("error:"), "{stderr}");
    assert!(stderr.contains("RUNIT_CUDA_SYNC=1"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}
