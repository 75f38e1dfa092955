#!/usr/bin/env python3
"""Registers, spills and SASS of the CUDA kernels without a GPU or a CUDA toolkit.

Compiles one file of crates/backend-cuda/kernels/ with NVRTC (as the backend does, with its
shared options) to PTX, assembles it with ptxas for the architecture, prints each kernel's
registers, shared memory and spills, and with --sass dumps the SASS of the kernels whose name
contains the filter (cuobjdump + nvdisasm). The tools come from PyPI wheels installed into
models/.venv on first use (nvidia-cuda-nvrtc, -nvcc, -cuobjdump, -nvdisasm; CUDA 13).

  scripts/cuda_sass.py mmqp.cu --filter mmqp_q4_k_n8 [--arch sm_90] [-D MMQP_PREFETCH=2] [--sass out.sass]
"""
import argparse
import ctypes
import glob
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KERNELS = os.path.join(ROOT, "crates", "backend-cuda", "kernels")
VENV = os.path.join(ROOT, "models", ".venv")
OPTIONS = ["--std=c++17", "-lineinfo", "--restrict"]  # src/compile.rs OPTIONS
WHEELS = ["nvidia-cuda-nvrtc==13.*", "nvidia-cuda-nvcc==13.*", "nvidia-cuda-cuobjdump==13.*",
          "nvidia-cuda-nvdisasm==13.*"]


def tool(pattern):
    found = glob.glob(os.path.join(VENV, "lib", "python3*", "site-packages", "nvidia", "cu13", pattern))
    return found[0] if found else None


def ensure_tools():
    python = os.path.join(VENV, "bin", "python")
    if not os.path.exists(python):
        subprocess.run([sys.executable, "-m", "venv", VENV], check=True)
    if not all(tool(p) for p in ["lib/libnvrtc.so.13", "bin/ptxas", "bin/cuobjdump", "bin/nvdisasm"]):
        subprocess.run([python, "-m", "pip", "install", "--quiet", *WHEELS], check=True)
    for name in ["ptxas", "cuobjdump", "nvdisasm"]:
        os.chmod(tool("bin/" + name), 0o755)


def compile_ptx(file, arch, defines):
    nvrtc = ctypes.CDLL(tool("lib/libnvrtc.so.13"))
    headers = sorted(h for h in os.listdir(KERNELS) if h.endswith(".cuh"))
    texts = [open(os.path.join(KERNELS, h), "rb").read() for h in headers]
    program = ctypes.c_void_p()
    count = len(headers)
    source = open(os.path.join(KERNELS, file), "rb").read()
    status = nvrtc.nvrtcCreateProgram(
        ctypes.byref(program), source, file.encode(), count,
        (ctypes.c_char_p * count)(*texts), (ctypes.c_char_p * count)(*[h.encode() for h in headers]))
    if status != 0:
        sys.exit(f"nvrtcCreateProgram failed ({status})")
    options = OPTIONS + [f"--gpu-architecture=compute_{arch[3:]}"] + [f"-D{d}" for d in defines]
    status = nvrtc.nvrtcCompileProgram(program, len(options), (ctypes.c_char_p * len(options))(*[o.encode() for o in options]))
    size = ctypes.c_size_t()
    nvrtc.nvrtcGetProgramLogSize(program, ctypes.byref(size))
    log = ctypes.create_string_buffer(size.value)
    nvrtc.nvrtcGetProgramLog(program, log)
    if log.value.strip():
        print(log.value.decode(errors="replace"))
    if status != 0:
        sys.exit(f"{file}: NVRTC compilation failed")
    nvrtc.nvrtcGetPTXSize(program, ctypes.byref(size))
    ptx = ctypes.create_string_buffer(size.value)
    nvrtc.nvrtcGetPTX(program, ptx)
    return ptx.value


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("file", help="a .cu file of crates/backend-cuda/kernels")
    parser.add_argument("--arch", default="sm_90")
    parser.add_argument("--filter", default="", help="kernels whose name contains this")
    parser.add_argument("-D", dest="defines", action="append", default=[], help="NAME=VALUE, as RUNIT_CUDA_DEFINES")
    parser.add_argument("--sass", help="write the filtered kernels' SASS here")
    args = parser.parse_args()
    ensure_tools()
    work = os.path.join(VENV, "sass")
    os.makedirs(work, exist_ok=True)
    ptx_path, cubin = os.path.join(work, "k.ptx"), os.path.join(work, "k.cubin")
    open(ptx_path, "wb").write(compile_ptx(args.file, args.arch, args.defines))
    result = subprocess.run([tool("bin/ptxas"), "-v", f"-arch={args.arch}", ptx_path, "-o", cubin],
                            capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit(result.stderr)
    kernel = None
    for line in (result.stdout + result.stderr).splitlines():
        entry = re.search(r"Compiling entry function '(\w+)'", line)
        if entry:
            kernel = entry.group(1)
        elif kernel and args.filter in kernel and ("Used" in line or ("spill" in line and " 0 bytes spill" not in line)):
            print(f"{kernel}: {line.split(':', 2)[-1].strip()}")
    if args.sass:
        env = dict(os.environ, PATH=os.path.dirname(tool("bin/nvdisasm")) + os.pathsep + os.environ["PATH"])
        names = [k for k in re.findall(r"\.entry (\w+)", open(ptx_path).read()) if args.filter in k]
        with open(args.sass, "w") as out:
            for name in names:
                out.write(subprocess.run([tool("bin/cuobjdump"), "-sass", "-fun", name, cubin],
                                         capture_output=True, text=True, env=env).stdout)
        print(f"SASS of {len(names)} kernels in {args.sass}")


if __name__ == "__main__":
    main()
