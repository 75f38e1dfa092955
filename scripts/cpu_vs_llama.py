#!/usr/bin/env python3
"""RunIT against llama.cpp on this machine's CPU, side by side, per weight type.

For each type, `runit bench` and llama.cpp's `llama-bench` (same commit as the goldens, from
../shared/anchors) run pp128 and tg64 on the same SmolLM2 requantization, alternated for
--rounds rounds (a shared machine's speed drifts between runs); medians and the ratio
RunIT / llama.cpp are printed, with RunIT's weight bandwidth in tg and its aggregate rate for
--batch concurrent decode rows (the server's batch; llama-bench has no such test). Run it on a
quiet machine: builds, tests or other agents running beside it slow llama.cpp's spinning
threads more than RunIT's and inflate the ratios.

    scripts/cpu_vs_llama.py [--types Q4_0 F16 ...] [--threads 2] [--rounds 2] [--json FILE]
    scripts/cpu_vs_llama.py --models models/gemma-3-270m-q4_k_m.gguf ...   # any files instead
    scripts/cpu_vs_llama.py --isa avx2 ...   # both restricted to AVX2 (an AVX2-only CPU's proxy)

`--isa avx2` runs RunIT with RUNIT_CPU_ISA=avx2 (AVX2, FMA and F16C kernels only) and llama.cpp
with only its `haswell` CPU variant: ggml loads every libggml-cpu-*.so beside llama-bench (and in
the working directory) and takes the best scoring one, so the script makes a sibling folder
(~/.cache/llama-cpu-avx2) with a copy of llama-bench (ggml searches the directory of the real
executable) and links to everything else except the other variants, and checks that ggml reports
loading libggml-cpu-haswell.so. The default, `--isa native`, lets both use everything the CPU has.

llama-bench: the portable prebuilt (`llama-cpu-x86_64-*.tar.xz`) unpacked into
~/.cache/llama-cpu; without it, the source tarball is built there once (CMake and Ninja from
pip, `-DGGML_NATIVE=ON`). `--llama-bench PATH` takes another build instead (for example a
`-march=native` one, which on CPUs with AMX or AVX512-FP16 uses code the prebuilt's
variants lack). Missing requantizations are made with `runit quantize` from the SmolLM2 Q4_1 file.
"""

import argparse
import glob
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tarfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ANCHORS = os.path.join(ROOT, "..", "shared", "anchors")
CACHE = os.path.expanduser("~/.cache/llama-cpu")
# --isa: RunIT's RUNIT_CPU_ISA value (None: no cap) and the llama.cpp CPU variant it matches
# (None: the best one ggml scores on this CPU).
ISA_MODES = {"native": (None, None), "avx2": ("avx2", "haswell")}
SOURCE_MODEL = os.path.join(ROOT, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")
TYPES = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K_M", "Q4_K_M", "Q5_K_M", "Q6_K",
         "IQ4_NL", "IQ4_XS", "F16", "BF16"]


def llama_bench():
    """Path of llama-bench, unpacking the prebuilt or building the source once."""
    binary = os.path.join(CACHE, "llama-bench")
    if os.path.exists(binary):
        return binary
    prebuilt = sorted(glob.glob(os.path.join(ANCHORS, "llama-cpu-x86_64-*.tar.xz")))
    if prebuilt and platform.machine() == "x86_64":
        os.makedirs(os.path.dirname(CACHE), exist_ok=True)
        with tarfile.open(prebuilt[-1]) as archive:
            archive.extractall(os.path.dirname(CACHE))
        if os.path.exists(binary):
            return binary
    sources = sorted(glob.glob(os.path.join(ANCHORS, "llama.cpp-*.tar.xz")))
    if not sources:
        sys.exit(f"no llama.cpp under {ANCHORS}: neither the prebuilt nor the source tarball")
    build = CACHE + "-src"
    os.makedirs(build, exist_ok=True)
    subprocess.run(["tar", "-xJf", sources[-1], "-C", build, "--strip-components=1"], check=True)
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "cmake", "ninja"], check=True)
    subprocess.run(["cmake", "-S", build, "-B", os.path.join(build, "build"), "-G", "Ninja",
                    "-DGGML_NATIVE=ON", "-DGGML_CUDA=OFF", "-DLLAMA_CURL=OFF",
                    "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF",
                    "-DLLAMA_BUILD_SERVER=OFF", "-DLLAMA_BUILD_APP=OFF",
                    "-DCMAKE_BUILD_TYPE=Release"], check=True)
    subprocess.run(["ninja", "-C", os.path.join(build, "build"), "llama-bench"], check=True)
    os.makedirs(CACHE, exist_ok=True)
    for path in glob.glob(os.path.join(build, "build", "bin", "*")):
        os.replace(path, os.path.join(CACHE, os.path.basename(path)))
    return binary


def restricted_bench(bench, variant, mode):
    """llama-bench in a sibling folder (named after `mode`) whose only CPU variant is
    libggml-cpu-`variant`.so."""
    real = os.path.realpath(bench)
    source, executable = os.path.dirname(real), os.path.basename(real)
    wanted = f"libggml-cpu-{variant}.so"
    if not os.path.exists(os.path.join(source, wanted)):
        sys.exit(f"--isa needs {wanted} beside {bench} (the prebuilt's variants; a native build has none)")
    folder = f"{source}-{mode}"
    os.makedirs(folder, exist_ok=True)
    for name in os.listdir(source):
        target, path = os.path.join(source, name), os.path.join(folder, name)
        if os.path.lexists(path):
            os.remove(path)
        if name.startswith("libggml-cpu-") and name != wanted:
            continue
        if name == executable:
            shutil.copy2(target, path)  # a real file: ggml looks beside the executable's real path
        else:
            os.symlink(target, path)
    return os.path.join(folder, executable)


def llama_env(bench):
    return dict(os.environ, LD_LIBRARY_PATH=os.path.dirname(bench))


def llama_cpu_variant(bench):
    """The CPU backend library ggml loads for `bench`, as it reports it on stderr."""
    out = subprocess.run([bench, "--list-devices"], capture_output=True, text=True,
                         env=llama_env(bench), cwd=os.path.dirname(bench))
    loaded = [line.rsplit(" from ", 1)[1].strip() for line in out.stderr.splitlines()
              if "loaded CPU backend from" in line]
    return os.path.basename(loaded[-1]) if loaded else "libggml-cpu.so (built in, or not reported)"


def model_for(runit, ty):
    """The SmolLM2 file of weight type `ty`, made with `runit quantize` when missing."""
    if ty == "Q4_1":
        return SOURCE_MODEL
    path = os.path.join(ROOT, "models", "requant", f"SmolLM2-135M-Instruct.requant-{ty}.gguf")
    if not os.path.exists(path) or os.path.getsize(path) == 0:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        subprocess.run([runit, "quantize", "--allow-requantize", "--force", SOURCE_MODEL, path, ty], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return path


def run_json(command, env=None, cwd=None):
    out = subprocess.run(command, check=True, capture_output=True, text=True, env=env, cwd=cwd).stdout
    start = out.index("[") if out.lstrip().startswith("[") else out.index("{")
    return json.loads(out[start:])


def runit_env(cap):
    """The environment of `runit`: RUNIT_CPU_ISA=`cap`, or none at all without a cap."""
    env = {k: v for k, v in os.environ.items() if k != "RUNIT_CPU_ISA"}
    if cap:
        env["RUNIT_CPU_ISA"] = cap
    return env


def runit_rates(runit, model, args, cap):
    """(pp, tg, tg GB/s, aggregate tg of `batch` rows) of one `runit bench` call each."""
    base = [runit, "bench", "-m", model, "-r", str(args.repetitions), "-t", str(args.threads),
            "-o", "json"]
    env = runit_env(cap)
    single = run_json(base + ["-p", str(args.prompt), "-n", str(args.gen)], env)
    if single.get("cpu_isa_cap") != cap:
        sys.exit(f"runit bench ran with cap {single.get('cpu_isa_cap')!r}, not {cap!r} (an older binary?)")
    pp = next(r for r in single["results"] if r["test"] == f"pp{args.prompt}")
    tg = next(r for r in single["results"] if r["test"] == f"tg{args.gen}")
    rows = run_json(base + ["-p", "0", "-n", str(args.gen), "--batch", str(args.batch)], env)["results"][0]
    return pp["avg_ts"], tg["avg_ts"], tg.get("weight_gbps") or 0.0, rows["avg_ts"]


def llama_rates(bench, model, args):
    """(pp, tg) of one llama-bench call, run in its own folder (ggml also loads CPU variants
    from the working directory)."""
    results = run_json([bench, "-m", model, "-p", str(args.prompt), "-n", str(args.gen), "-r",
                        str(args.repetitions), "-t", str(args.threads), "-o", "json"],
                       llama_env(bench), os.path.dirname(bench))
    pp = next(r for r in results if r["n_prompt"] == args.prompt and r["n_gen"] == 0)
    tg = next(r for r in results if r["n_gen"] == args.gen and r["n_prompt"] == 0)
    return pp["avg_ts"], tg["avg_ts"]


def cpu_description():
    model, flags = platform.processor(), ""
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                if line.startswith("flags"):
                    wanted = ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni",
                              "avx512_bf16", "avx512_fp16", "avx512vbmi", "avx_vnni")
                    flags = " ".join(f for f in line.split(":", 1)[1].split() if f in wanted)
                    break
    except OSError:
        pass
    return model, flags


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--types", nargs="+", default=TYPES)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--batch", type=int, default=8, help="concurrent decode rows reported for RunIT")
    parser.add_argument("--runit", default=os.path.join(ROOT, "target", "release", "runit"))
    parser.add_argument("--models", nargs="+", help="model files to compare instead of --types")
    parser.add_argument("--json", help="also write the figures to this file")
    parser.add_argument("--llama-bench", help="llama-bench binary to use instead of the anchors' build")
    parser.add_argument("--isa", choices=sorted(ISA_MODES), default="native",
                        help="avx2: RunIT with RUNIT_CPU_ISA=avx2, llama.cpp with its haswell variant only")
    parser.add_argument("-p", "--prompt", type=int, default=128, help="prompt tokens (pp test)")
    parser.add_argument("-n", "--gen", type=int, default=64, help="generated tokens (tg test)")
    parser.add_argument("-r", "--repetitions", type=int, default=3, help="repetitions per bench call")
    args = parser.parse_args()
    cap, variant = ISA_MODES[args.isa]
    bench = args.llama_bench or llama_bench()
    if variant:
        bench = restricted_bench(bench, variant, args.isa)
    loaded = llama_cpu_variant(bench)
    if variant and loaded != f"libggml-cpu-{variant}.so":
        sys.exit(f"llama-bench in {os.path.dirname(bench)} loaded {loaded}, not the {variant} variant")
    model, flags = cpu_description()
    print(f"CPU: {model} ({os.cpu_count()} logical); flags: {flags}")
    print(f"ISA mode: {args.isa} (RunIT: " + (f"RUNIT_CPU_ISA={cap}" if cap else "no cap") +
          f"; llama.cpp: {loaded})")
    print(f"threads {args.threads}, rounds {args.rounds} (alternated), medians; llama.cpp: {bench}")
    pp, tg = f"pp{args.prompt}", f"tg{args.gen}"
    print(f"| {'model' if args.models else 'type'} | {pp} RunIT | {pp} llama.cpp | ratio | {tg} RunIT | {tg} llama.cpp | ratio "
          f"| RunIT tg GB/s | RunIT {args.batch} rows {tg} |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    table = []
    rows = ([(os.path.basename(m), m) for m in args.models] if args.models
            else [(ty, None) for ty in args.types])
    for ty, path in rows:
        path = os.path.abspath(path or model_for(args.runit, ty))
        ours, theirs = [], []
        for _ in range(args.rounds):
            ours.append(runit_rates(args.runit, path, args, cap))
            theirs.append(llama_rates(bench, path, args))
        median = lambda values, i: statistics.median(v[i] for v in values)
        row = {"type": ty, "pp_runit": median(ours, 0), "pp_llama": median(theirs, 0),
               "tg_runit": median(ours, 1), "tg_llama": median(theirs, 1),
               "tg_gbps": median(ours, 2), "batch_tg": median(ours, 3)}
        table.append(row)
        print(f"| {ty} | {row['pp_runit']:.1f} | {row['pp_llama']:.1f} | "
              f"{row['pp_runit'] / row['pp_llama']:.2f}x | {row['tg_runit']:.1f} | "
              f"{row['tg_llama']:.1f} | {row['tg_runit'] / row['tg_llama']:.2f}x | "
              f"{row['tg_gbps']:.1f} | {row['batch_tg']:.1f} |", flush=True)
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"cpu": model, "flags": flags, "isa": args.isa, "runit_cpu_isa": cap,
                       "llama_cpu_variant": loaded, "threads": args.threads, "prompt": args.prompt,
                       "gen": args.gen, "rows": table}, out, indent=1)


if __name__ == "__main__":
    main()
