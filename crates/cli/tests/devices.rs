//! `runit devices` lists the CPU with its `--device` string and names each GPU backend, built
//! in or not.

use std::process::Command;

#[test]
fn devices_lists_the_cpu_and_each_backend() {
    let out = Command::new(env!("CARGO_BIN_EXE_runit"))
        .arg("devices")
        .env("XDG_RUNTIME_DIR", std::env::temp_dir())
        .output()
        .expect("runit runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).expect("UTF-8");
    let cpu = text.lines().next().expect("a first line");
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    assert!(cpu.starts_with("cpu "), "{text}");
    assert!(cpu.contains(&format!("({cores} cores, SIMD ")), "{text}");
    assert!(cpu.ends_with("--device cpu"), "{text}");
    let cuda = text
        .lines()
        .find(|l| l.starts_with("cuda "))
        .expect("a cuda line");
    assert_eq!(
        cuda.contains("not in this build"),
        !cfg!(feature = "cuda"),
        "{text}"
    );
    let wgpu = text.lines().any(|l| l.starts_with("wgpu"));
    assert!(wgpu, "{text}");
}
