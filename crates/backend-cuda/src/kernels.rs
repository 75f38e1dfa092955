//! The embedded kernel sources and the registry of compiled kernel functions.
//!
//! Each `.cu` file under `kernels/` is one module, compiled by NVRTC the first time one of its
//! functions is asked for (see [`crate::compile`]); the headers are handed to NVRTC by name,
//! so sources say `#include "common.cuh"`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use cudarc::driver::{CudaContext, CudaFunction, CudaModule};
use cudarc::nvrtc::Ptx;

use crate::compile::{self, KernelSource, Target};
use crate::error::CudaError;

macro_rules! source {
    ($file:literal) => {
        source!($file, [])
    };
    ($file:literal, [$($option:literal),*]) => {
        KernelSource {
            file: $file,
            text: include_str!(concat!("../kernels/", $file)),
            options: &[$($option),*],
        }
    };
}

/// Headers every source may include.
pub const HEADERS: &[KernelSource] = &[
    source!("common.cuh"),
    source!("quant_blocks.cuh"),
    source!("dequant.cuh"),
    source!("quantize.cuh"),
    source!("matvec.cuh"),
    source!("mma.cuh"),
    source!("flash_mma.cuh"),
    source!("mmqp_slots.cuh"),
    source!("mmq.cuh"),
    source!("exact_dot.cuh"),
    source!("exact_gemm.cuh"),
    source!("exact_math.cuh"),
    source!("turbo.cuh"),
    source!("rope.cuh"),
];

/// Every kernel module, in the order CI compiles them.
pub const SOURCES: &[KernelSource] = &[
    source!("elementwise.cu"),
    source!("norm.cu"),
    source!("rope.cu"),
    source!("kv.cu"),
    source!("attention.cu"),
    source!("attention_mma.cu"),
    source!("rows.cu"),
    source!("pick.cu"),
    source!("sample.cu"),
    source!("embedding.cu"),
    source!("convert.cu"),
    source!("matvec_float.cu"),
    source!("matvec_legacy.cu"),
    source!("matvec_kquants.cu"),
    source!("mmq.cu"),
    source!("mmq8.cu"),
    source!("mmqp.cu"),
    source!("fused.cu"),
    source!("moe.cu"),
    source!("fault.cu"),
    // Written as the CPU's scalar twins: no multiply and add fused unless written as fmaf.
    source!("turbo.cu", ["--fmad=false"]),
    // Exact numerics: no multiply and add fused unless the source writes an FMA.
    source!("exact_matmul.cu", ["--fmad=false"]),
    source!("exact_gemm.cu", ["--fmad=false"]),
    source!("exact_ops.cu", ["--fmad=false"]),
    // ops (norm, rope, embedding, kv, attention) and matmul sources are listed here too.
];

/// Compiled modules and their functions, loaded on first use.
pub struct Kernels {
    context: Arc<CudaContext>,
    target: Target,
    modules: Mutex<HashMap<&'static str, Arc<CudaModule>>>,
    functions: Mutex<HashMap<(&'static str, &'static str), CudaFunction>>,
}

impl Kernels {
    /// A registry compiling for `target` and loading into `context`.
    pub fn new(context: Arc<CudaContext>, target: Target) -> Kernels {
        Kernels {
            context,
            target,
            modules: Mutex::new(HashMap::new()),
            functions: Mutex::new(HashMap::new()),
        }
    }

    /// The function `name` of module `file`, compiling and loading the module if needed.
    pub fn function(
        &self,
        file: &'static str,
        name: &'static str,
    ) -> Result<CudaFunction, CudaError> {
        let mut functions = self.functions.lock().expect("kernel registry lock");
        if let Some(function) = functions.get(&(file, name)) {
            return Ok(function.clone());
        }
        let module = self.module(file)?;
        let function = module.load_function(name).map_err(|e| CudaError::Driver {
            op: format!("loading kernel {name} of kernels/{file}"),
            message: e.to_string(),
        })?;
        // Every function may take all the shared memory a block can opt into, less its static
        // share, as dynamic shared memory (a permission: a launch asks for what it uses), so
        // that no launcher has to raise the 48 KiB default first.
        use cudarc::driver::sys::{CUdevice_attribute, CUfunction_attribute_enum as Attribute};
        let raise = || -> Result<(), cudarc::driver::DriverError> {
            let optin = self.context.attribute(
                CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
            )?;
            let fixed = function.shared_size_bytes()?;
            function.set_attribute(
                Attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                optin - fixed,
            )
        };
        raise().map_err(|e| CudaError::Driver {
            op: format!("raising the shared memory of kernel {name} of kernels/{file}"),
            message: e.to_string(),
        })?;
        functions.insert((file, name), function.clone());
        Ok(function)
    }

    /// Compiles (or takes from the disk cache) and loads every module now, so the first
    /// forward pass does not pay for it.
    pub fn load_all(&self) -> Result<(), CudaError> {
        for source in SOURCES {
            self.module(source.file)?;
        }
        Ok(())
    }

    fn module(&self, file: &'static str) -> Result<Arc<CudaModule>, CudaError> {
        let mut modules = self.modules.lock().expect("kernel module lock");
        if let Some(module) = modules.get(file) {
            return Ok(Arc::clone(module));
        }
        let source = SOURCES
            .iter()
            .find(|s| s.file == file)
            .ok_or_else(|| CudaError::Driver {
                op: "kernel lookup".into(),
                message: format!("no kernel source named {file}"),
            })?;
        let cubin = compile::compile(source, &self.target)?;
        let module = self
            .context
            .load_module(Ptx::from_binary(cubin))
            .map_err(|e| CudaError::Driver {
                op: format!("loading kernels/{file}"),
                message: e.to_string(),
            })?;
        modules.insert(file, Arc::clone(&module));
        Ok(module)
    }
}
