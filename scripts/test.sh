#!/usr/bin/env bash
# The test command: formatting, lints, and every test of the workspace (release mode: the
# golden tests run real models). Fetches the models the tests need first.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 scripts/fetch_models.py --all
# NVRTC from the package registry: the CUDA kernels are compiled (not run) for sm_80 and sm_90.
RUNIT_NVRTC_LIB=$(scripts/fetch_nvrtc.sh)
export RUNIT_NVRTC_LIB RUNIT_REQUIRE_NVRTC=1
cargo fmt --all -- --check
cargo clippy --workspace --all-targets --release -- -D warnings
if rustup target add aarch64-unknown-linux-gnu >/dev/null 2>&1; then
  cargo check --quiet --target aarch64-unknown-linux-gnu -p runit-quant -p runit-backend-cpu
else
  echo "note: aarch64 target unavailable; skipping the NEON build check"
fi
# Metal is checked by compiling the wgpu backend for Apple Silicon (its shaders are translated
# to MSL by crates/backend-wgpu/tests/shaders.rs).
if rustup target add aarch64-apple-darwin >/dev/null 2>&1; then
  cargo check --quiet --target aarch64-apple-darwin -p runit-backend-wgpu
else
  echo "note: aarch64-apple-darwin target unavailable; skipping the Metal build check"
fi
cargo build --release -p runit-cli
cargo check --quiet --release -p runit-cli --features cuda
scripts/make_requants.sh target/release/runit
# The chat page's browser test (crates/cli/tests/web_chat.rs) needs Debian's Chromium.
if ! command -v chromium >/dev/null && command -v apt-get >/dev/null; then
  (apt-get update -qq && apt-get install -y -qq chromium) >/dev/null 2>&1 \
    || echo "note: chromium could not be installed; the browser test will say so"
fi
if command -v chromium >/dev/null; then export RUNIT_REQUIRE_BROWSER=1; fi
# The wgpu backend's parity suite runs on Mesa's lavapipe (a CPU Vulkan driver).
if ! ls /usr/share/vulkan/icd.d/lvp_icd*.json >/dev/null 2>&1 && command -v apt-get >/dev/null; then
  (apt-get update -qq && apt-get install -y -qq mesa-vulkan-drivers libvulkan1) >/dev/null 2>&1 \
    || echo "note: lavapipe could not be installed; the wgpu tests will say so"
fi
if ls /usr/share/vulkan/icd.d/lvp_icd*.json >/dev/null 2>&1; then export RUNIT_REQUIRE_WGPU=1; fi
export XDG_RUNTIME_DIR=${XDG_RUNTIME_DIR:-$(mktemp -d)}
chmod 700 "$XDG_RUNTIME_DIR"
cargo test --workspace --release --no-fail-fast 2>&1 | tee target/test-output.txt
# The synthetic golden fidelity tests on lavapipe too, with the wgpu matmuls in the CPU's
# summation order (RUNIT_WGPU_EXACT=1; its fast kernels part from llama.cpp as CUDA's do).
if [ "${RUNIT_REQUIRE_WGPU:-}" = 1 ]; then
  RUNIT_TEST_DEVICE=wgpu RUNIT_WGPU_EXACT=1 cargo test --release -p runit-engine --test fidelity synthetic \
    2>&1 | tee -a target/test-output.txt
fi
python3 scripts/test_summary.py target/test-output.txt
