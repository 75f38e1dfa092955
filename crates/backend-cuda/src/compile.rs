//! Run-time kernel compilation: NVRTC turns each embedded `.cu` source into a cubin for the
//! device's architecture, cached on disk.
//!
//! The cache key is the SHA-256 of the source and every header, the compiler options, the
//! target architecture and the NVRTC version, so a changed kernel, option or toolkit never
//! loads a stale binary. The cache lives in `$RUNIT_CACHE_DIR`, else `$XDG_CACHE_HOME/runit`,
//! else `~/.cache/runit`; a cache that cannot be written only costs a recompile next time.

use std::ffi::{c_char, c_int, CString};
use std::path::PathBuf;

use cudarc::nvrtc::sys;
use sha2::{Digest, Sha256};

use crate::error::CudaError;
use crate::kernels::{HEADERS, SOURCES};
use crate::library;

/// Compiler options shared by every kernel (the architecture is added per target).
const OPTIONS: &[&str] = &["--std=c++17", "-lineinfo", "--restrict"];

/// One embedded kernel source file.
#[derive(Debug, Clone, Copy)]
pub struct KernelSource {
    /// File name under `crates/backend-cuda/kernels/`.
    pub file: &'static str,
    pub text: &'static str,
    /// NVRTC options of this module on top of the shared ones (the exact-numerics modules
    /// take `--fmad=false`, so that no multiply and add are fused unless written as an FMA).
    pub options: &'static [&'static str],
}

/// A GPU architecture to compile for, as NVRTC names it (`sm_90`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub major: i32,
    pub minor: i32,
}

impl Target {
    /// The NVRTC architecture name, e.g. `sm_90`.
    pub fn arch(&self) -> String {
        format!("sm_{}{}", self.major, self.minor)
    }
}

/// The NVRTC library version `(major, minor)`.
pub fn nvrtc_version() -> Result<(i32, i32), CudaError> {
    library::ensure_nvrtc()?;
    let (mut major, mut minor): (c_int, c_int) = (0, 0);
    // SAFETY: both pointers are valid for writes of one c_int.
    let status = unsafe { sys::nvrtcVersion(&mut major, &mut minor) };
    check(status, "nvrtcVersion")?;
    Ok((major, minor))
}

/// Compiles `source` for `target`, or loads the cached cubin. Returns the cubin bytes.
pub fn compile(source: &KernelSource, target: &Target) -> Result<Vec<u8>, CudaError> {
    let version = nvrtc_version()?;
    let options = options(source, target);
    let key = cache_key(source, &options, version);
    let cached = cache_dir().map(|dir| dir.join(format!("{}-{key}.cubin", source.file)));
    if let Some(path) = &cached {
        if let Ok(bytes) = std::fs::read(path) {
            return Ok(bytes);
        }
    }
    let cubin = compile_uncached(source, target, &options)?;
    if let Some(path) = cached {
        store(&path, &cubin);
    }
    Ok(cubin)
}

/// Compiles every embedded kernel for `target` without touching the cache (what CI runs to
/// prove the kernels build without a GPU). Returns `(file, cubin size)` pairs.
pub fn compile_all(target: &Target) -> Result<Vec<(&'static str, usize)>, CudaError> {
    SOURCES
        .iter()
        .map(|source| {
            let options = options(source, target);
            Ok((
                source.file,
                compile_uncached(source, target, &options)?.len(),
            ))
        })
        .collect()
}

fn options(source: &KernelSource, target: &Target) -> Vec<String> {
    let mut options: Vec<String> = OPTIONS
        .iter()
        .chain(source.options)
        .map(|o| o.to_string())
        .collect();
    options.push(format!("--gpu-architecture={}", target.arch()));
    options.extend(experiment_defines());
    options
}

/// `RUNIT_CUDA_DEFINES="NAME=VALUE ..."`: preprocessor definitions added to every kernel's
/// compilation, for timing kernel variants (the knobs the `.cu` files declare with `#ifndef`)
/// in one run without rebuilding; part of the cache key like every option.
fn experiment_defines() -> Vec<String> {
    std::env::var("RUNIT_CUDA_DEFINES")
        .unwrap_or_default()
        .split_whitespace()
        .map(|define| format!("-D{define}"))
        .collect()
}

fn cache_key(source: &KernelSource, options: &[String], version: (i32, i32)) -> String {
    let mut hash = Sha256::new();
    for header in HEADERS {
        hash.update(header.file.as_bytes());
        hash.update(header.text.as_bytes());
    }
    hash.update(source.text.as_bytes());
    for option in options {
        hash.update(option.as_bytes());
        hash.update([0]);
    }
    hash.update(format!("nvrtc {}.{}", version.0, version.1).as_bytes());
    let digest = hash.finalize();
    digest[..12].iter().map(|b| format!("{b:02x}")).collect()
}

fn cache_dir() -> Option<PathBuf> {
    let base = std::env::var_os("RUNIT_CACHE_DIR")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("XDG_CACHE_HOME").map(|d| PathBuf::from(d).join("runit")))
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/runit")))?;
    Some(base.join("cuda-kernels"))
}

/// Writes through a temporary file and a rename, so a concurrent reader never sees half a file.
fn store(path: &std::path::Path, bytes: &[u8]) {
    let Some(dir) = path.parent() else { return };
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    let written = std::fs::create_dir_all(dir)
        .and_then(|()| std::fs::write(&tmp, bytes))
        .and_then(|()| std::fs::rename(&tmp, path));
    if let Err(error) = written {
        tracing::debug!("kernel cache not written ({}): {error}", path.display());
        let _ = std::fs::remove_file(&tmp);
    }
}

fn compile_uncached(
    source: &KernelSource,
    target: &Target,
    options: &[String],
) -> Result<Vec<u8>, CudaError> {
    library::ensure_nvrtc()?;
    let fail = |log: String| CudaError::Compile {
        file: source.file.to_string(),
        arch: target.arch(),
        log,
    };
    let text = CString::new(source.text).map_err(|_| fail("source holds a NUL byte".into()))?;
    let name = CString::new(source.file).map_err(|_| fail("bad file name".into()))?;
    let header_texts: Vec<CString> = HEADERS
        .iter()
        .map(|h| CString::new(h.text).map_err(|_| fail(format!("{} holds a NUL byte", h.file))))
        .collect::<Result<_, _>>()?;
    let header_names: Vec<CString> = HEADERS
        .iter()
        .map(|h| CString::new(h.file).map_err(|_| fail("bad header name".into())))
        .collect::<Result<_, _>>()?;
    let header_text_ptrs: Vec<*const c_char> = header_texts.iter().map(|h| h.as_ptr()).collect();
    let header_name_ptrs: Vec<*const c_char> = header_names.iter().map(|h| h.as_ptr()).collect();
    let option_strings: Vec<CString> = options
        .iter()
        .map(|o| CString::new(o.as_str()).map_err(|_| fail("bad option".into())))
        .collect::<Result<_, _>>()?;
    let option_ptrs: Vec<*const c_char> = option_strings.iter().map(|o| o.as_ptr()).collect();

    let mut program: sys::nvrtcProgram = std::ptr::null_mut();
    // SAFETY: every pointer refers to a NUL-terminated string that outlives every use of
    // the program (all are dropped at the end of this function); both header arrays hold
    // `HEADERS.len()` pointers; `program` is a valid place for the new handle.
    let status = unsafe {
        sys::nvrtcCreateProgram(
            &mut program,
            text.as_ptr(),
            name.as_ptr(),
            HEADERS.len() as c_int,
            header_text_ptrs.as_ptr(),
            header_name_ptrs.as_ptr(),
        )
    };
    check(status, "nvrtcCreateProgram")?;
    // SAFETY: `program` is the live program created above (nvrtcCreateProgram succeeded);
    // the option array holds `option_ptrs.len()` NUL-terminated strings that outlive the
    // call; `cubin` has the `size` bytes nvrtcGetCUBINSize reported for nvrtcGetCUBIN to
    // write. Every outcome reaches the destruction below (no early return).
    let result = unsafe {
        let status =
            sys::nvrtcCompileProgram(program, option_ptrs.len() as c_int, option_ptrs.as_ptr());
        if status != sys::nvrtcResult::NVRTC_SUCCESS {
            Err(fail(program_log(program)))
        } else {
            let mut size = 0usize;
            check(
                sys::nvrtcGetCUBINSize(program, &mut size),
                "nvrtcGetCUBINSize",
            )
            .and_then(|()| {
                let mut cubin = vec![0u8; size];
                check(
                    sys::nvrtcGetCUBIN(program, cubin.as_mut_ptr() as *mut c_char),
                    "nvrtcGetCUBIN",
                )
                .map(|()| cubin)
            })
        }
    };
    // SAFETY: destroying the live program created above, once; nothing uses it afterwards.
    unsafe { sys::nvrtcDestroyProgram(&mut program) };
    result
}

/// The compile log of `program`.
///
/// # Safety
/// `program` must be a live NVRTC program.
unsafe fn program_log(program: sys::nvrtcProgram) -> String {
    let mut size = 0usize;
    if sys::nvrtcGetProgramLogSize(program, &mut size) != sys::nvrtcResult::NVRTC_SUCCESS {
        return "(no log)".into();
    }
    let mut log = vec![0u8; size];
    if sys::nvrtcGetProgramLog(program, log.as_mut_ptr() as *mut c_char)
        != sys::nvrtcResult::NVRTC_SUCCESS
    {
        return "(no log)".into();
    }
    String::from_utf8_lossy(&log)
        .trim_end_matches('\0')
        .to_string()
}

fn check(status: sys::nvrtcResult, call: &str) -> Result<(), CudaError> {
    if status == sys::nvrtcResult::NVRTC_SUCCESS {
        Ok(())
    } else {
        Err(CudaError::Driver {
            op: call.to_string(),
            message: format!("{status:?}"),
        })
    }
}
