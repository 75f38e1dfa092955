#!/usr/bin/env bash
# Builds what a GPU check needs and copies it into device/ (git-ignored), which the device
# tool carries to the GPU machine: the CUDA-enabled runit, the GPU test binaries, and a subset
# of tests/golden with the synthetic model files of models/ (only 64 MiB travel per call).
#   scripts/gpu_pack.sh tests    # test binaries + golden synthetic models (parity, fidelity, perplexity)
#   scripts/gpu_pack.sh bench    # runit only (the device makes its own models with `runit synth`)
#   scripts/gpu_pack.sh slim T.. # runit + the named test binaries (wgpu ones prefixed wgpu_,
#                                # the CUDA crate's examples by name: *_bench),
#                                # stripped and xz-packed into device/slim.tar.xz for
#                                # scripts/gpu_stages.sh (14 MB with eight tests)
# Then, on the device: scripts/gpu_check.sh tests|bench
set -euo pipefail
cd "$(dirname "$0")/.."
mode=${1:-tests}
# pick_tests DIR PREFIX NAMES: copies the test executables cargo's JSON (stdin) names whose
# PREFIX + name is among NAMES into DIR (the wgpu crate's tests share names with the CUDA crate's).
pick_tests() {
  python3 -c '
import json, shutil, sys
into, prefix, want = sys.argv[1], sys.argv[2], set(sys.argv[3].split())
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["kind"] == ["test"]:
        if prefix + m["target"]["name"] in want:
            shutil.copy(m["executable"], into + "/" + prefix + m["target"]["name"])
' "$@"
}
# test_binaries DIR PREFIX NAMES CARGO-TEST-ARGS...: pick_tests over `cargo test --no-run` of the
# named packages. A run that compiled the crates has at times named only some executables, so
# the build comes first and the (then fresh) JSON listing second.
test_binaries() {
  local into=$1 prefix=$2 names=$3; shift 3
  cargo test --release "$@" --no-run >/dev/null 2>&1 || cargo test --release "$@" --no-run
  cargo test --release "$@" --no-run --message-format=json 2>/dev/null | pick_tests "$into" "$prefix" "$names"
}
# build_into DIR NAMES: runit with both GPU backends (the wgpu backend runs on the GPU through
# NVIDIA's Vulkan driver beside CUDA: issue 30 compares them in one call) and the named tests.
build_into() {
  cargo build --release -p runit-cli --features cuda,wgpu
  cp "${CARGO_TARGET_DIR:-target}/release/runit" "$1/runit"
  [ -n "${2// /}" ] && test_binaries "$1" "" "$2" -p runit-backend-cuda -p runit-engine
  case " $2 " in *" wgpu_"*) test_binaries "$1" wgpu_ "$2" -p runit-backend-wgpu ;; esac
  case " $2 " in *" cuda_fault "*) test_binaries "$1" "" "$2" -p runit-cli --features cuda --test cuda_fault ;; esac
  # The CUDA crate's examples (matmul_bench, attention_bench) by name.
  for name in $2; do
    case "$name" in *_bench)
      cargo build --release -p runit-backend-cuda --example "$name"
      cp "${CARGO_TARGET_DIR:-target}/release/examples/$name" "$1/$name" ;;
    esac
  done
  strip "$1"/*
}
if [ "$mode" = slim ]; then
  shift
  stage=$(mktemp -d)
  trap 'rm -rf "$stage"' EXIT
  build_into "$stage" "${*:-turbo_gpu turbo_cuda}"
  missing=""
  for name in ${*:-turbo_gpu turbo_cuda}; do [ -e "$stage/$name" ] || missing="$missing $name"; done
  [ -z "$missing" ] || { echo "gpu_pack.sh: no test executable named:$missing" >&2; exit 1; }
  mkdir -p device
  (cd "$stage" && tar -cf - .) | xz -T2 -6 >device/slim.tar.xz.part  # a device call meanwhile carries the old one
  mv device/slim.tar.xz.part device/slim.tar.xz
  ls "$stage"
  du -sh device/slim.tar.xz
  exit 0
fi
rm -rf device/bin device/golden && mkdir -p device/bin  # device/llama.cpp.tar.xz (the anchor) stays
if [ "$mode" = tests ]; then
  gpu_tests="parity ops_gpu matmul_gpu fused_gpu moe_gpu exact_gpu fidelity perplexity nvrtc cuda_fault window
    speculative errors sample_gpu turbo_gpu turbo_cuda"
  wgpu_tests=$(for t in $gpu_tests; do printf "wgpu_%s " "$t"; done)
  build_into device/bin "$gpu_tests $wgpu_tests"
  golden=tests/golden
  mkdir -p device/golden/generation device/golden/perplexity device/golden/models
  # The synthetic files llama-quantize made (rebuilt by scripts/make_requants.sh), 27 MB.
  (cd models && cp $(awk '{print $2}' ../$golden/models/SHA256SUMS) ../device/golden/models/)
  for m in device/golden/models/*.gguf; do
    base=$(basename "$m" .gguf)
    [ -f "$golden/generation/$base.json" ] && cp "$golden/generation/$base.json" device/golden/generation/
  done
  cp "$golden"/perplexity/* device/golden/perplexity/
else
  build_into device/bin ""
fi
du -sh device
