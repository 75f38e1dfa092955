//! `runit devices`: every device this build can run a model on, with the `--device` string
//! that selects it: the CPU (model, cores, SIMD level), CUDA GPUs (a pointer to
//! `nvidia-smi -L`: the CUDA crate opens devices but does not list them) and wgpu adapters.
//! A backend this build lacks is named with the feature that adds it.

use runit_quant::dot::SimdLevel;

#[derive(clap::Args)]
pub struct Args {}

pub fn run(_args: Args) -> anyhow::Result<()> {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    println!(
        "cpu       {} ({cores} cores, SIMD {:?})  --device cpu",
        cpu_model(),
        SimdLevel::detect()
    );
    if let Some(note) = super::common::cpu_isa_cap_note() {
        println!("          {note}");
    }
    cuda();
    wgpu();
    Ok(())
}

/// The CPU's model name (Linux `/proc/cpuinfo`), or its architecture where that is unknown.
fn cpu_model() -> String {
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|info| {
            info.lines()
                .find(|line| line.starts_with("model name"))
                .and_then(|line| line.split_once(':'))
                .map(|(_, name)| name.trim().to_string())
        });
    model.unwrap_or_else(|| format!("{} CPU", std::env::consts::ARCH))
}

#[cfg(feature = "cuda")]
fn cuda() {
    println!(
        "cuda      built in; list the GPUs with `nvidia-smi -L`  --device cuda:N (N as listed; cuda = cuda:0)"
    );
}

#[cfg(not(feature = "cuda"))]
fn cuda() {
    println!("cuda      not in this build (rebuild with `cargo build --release --features cuda`)");
}

#[cfg(feature = "wgpu")]
fn wgpu() {
    let adapters = runit_backend_wgpu::adapters();
    if adapters.is_empty() {
        println!(
            "wgpu      no adapter found (needs a Vulkan, Metal or DX12 driver; on Linux for a \
             CPU one: mesa-vulkan-drivers libvulkan1)"
        );
    }
    for adapter in adapters {
        println!("{adapter}  --device wgpu:{}", adapter.ordinal);
    }
}

#[cfg(not(feature = "wgpu"))]
fn wgpu() {
    println!("wgpu      not in this build (rebuild with `cargo build --release --features wgpu`)");
}
