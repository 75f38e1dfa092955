//! The CUDA backend: every op of [`runit_backend::Backend`] as NVRTC-compiled kernels on
//! weights kept in their packed GGUF formats, with whole decode steps captured as CUDA graphs.
//!
//! The build needs no CUDA installation: `cudarc` loads the driver and NVRTC at run time, and
//! a missing library or device is a [`CudaError`], never a panic. Kernels are the `.cu` files
//! of `kernels/`, embedded in the binary and compiled at first use for the device's compute
//! capability (cached on disk, see [`compile`]). One stream orders all work; activations are
//! f32, the KV cache f16 (or f32).

mod backend;
pub mod compile;
mod error;
mod exact;
mod kernels;
mod library;
mod matmul;
mod memory;
mod ops;
mod profile;
mod step;

use std::sync::{Arc, Mutex};

use cudarc::driver::{CudaContext, CudaSlice, CudaStream, DevicePtr, LaunchConfig};
use runit_backend::{BackendError, Device, KvRole, KvType, SequenceSpan};

pub use compile::{compile_all, KernelSource, Target};
pub use error::CudaError;
pub use kernels::{HEADERS, SOURCES};

use step::StepState;

/// Launches `$file`'s kernel `$name` on the backend's stream with the given arguments
/// (device addresses as `u64`, scalars as `i32`/`u32`/`u64`/`f32`), mapping failures to a
/// [`BackendError`] that names `$op`.
macro_rules! launch {
    ($backend:expr, $op:expr, $file:expr, $name:expr, $cfg:expr, $($arg:expr),* $(,)?) => {{
        let backend: &$crate::CudaBackend = $backend;
        let function = backend.kernel($op, $file, $name)?;
        // Each argument boxed, so that its address stays put while the parameter list
        // (addresses of the values, as cuLaunchKernelEx takes them) is in use.
        let mut values: Vec<Box<dyn std::any::Any>> = Vec::new();
        let mut params: Vec<*mut std::ffi::c_void> = Vec::new();
        $(
            let value = Box::new($arg);
            params.push(&*value as *const _ as *mut std::ffi::c_void);
            values.push(value);
        )*
        // SAFETY: the kernel's parameter list matches these arguments (same order and
        // types, checked by the kernel's author against kernels/*.cu); every address points
        // to live device memory owned by a handle the caller holds, which is freed, if at
        // all, on the backend's one stream and so after the kernel; the sizes passed keep
        // the kernel inside those buffers (the op checked its shapes); `values` outlives
        // the call, which copies the parameters.
        unsafe { backend.launch_raw($op, $name, &function, $cfg, &mut params) }?;
        drop(values);
        backend.after_launch($op)
    }};
}
pub(crate) use launch;

/// The kernels that decode rows (a few query rows a sequence) over TurboQuant caches outside
/// exact numerics; prefill spans take [`TurboPrefill`]'s. All three work in the caches'
/// rotated basis and rotate the merged rows back once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TurboDecode {
    /// `attention_decode_tq_mma_*` (heads of 64 and 128 values): each 16-key sub-tile's codes
    /// decoded once into f16 tiles, scores and values on the tensor cores, queries and
    /// probabilities rounded to f16 as over an f16 cache. Other head sizes take [`Self::Codes`].
    TensorCores,
    /// `attention_decode_tq_codes`: scores and values summed from the codes in f32.
    Codes,
    /// `attention_decode_tq`: each tile decoded to f32 in shared memory, then the float
    /// cache's flash-decoding.
    Tiles,
}

impl TurboDecode {
    /// [`Self::TensorCores`] unless `RUNIT_CUDA_TQ_DECODE` names `codes` or `tiles` (for
    /// comparisons); another value keeps the default with a warning.
    pub fn from_env() -> TurboDecode {
        match std::env::var("RUNIT_CUDA_TQ_DECODE").as_deref() {
            Ok("codes") => TurboDecode::Codes,
            Ok("tiles") => TurboDecode::Tiles,
            Ok("mma") | Err(_) => TurboDecode::TensorCores,
            Ok(other) => {
                tracing::warn!(
                    "RUNIT_CUDA_TQ_DECODE={other:?} is not mma, codes or tiles: the tensor cores' decode is used"
                );
                TurboDecode::TensorCores
            }
        }
    }
}

/// The kernels that run prefill spans over TurboQuant caches outside exact numerics, in the
/// caches' rotated basis.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TurboPrefill {
    /// `attention_prefill_tq`: each tile of keys and values decoded to f32 in shared memory,
    /// then the float caches' tiled prefill.
    Tiles,
    /// `attention_prefill_tq_mma_*` (heads of 64 and 128 values; others take [`Self::Tiles`]):
    /// 64 query rows a block, each 64-key tile decoded once into f16 tiles, scores and values on
    /// the tensor cores. The default.
    TensorCores,
}

impl TurboPrefill {
    /// [`Self::TensorCores`] unless `RUNIT_CUDA_TQ_PREFILL=tiles`; another value keeps the
    /// default with a warning.
    pub fn from_env() -> TurboPrefill {
        match std::env::var("RUNIT_CUDA_TQ_PREFILL").as_deref() {
            Ok("tiles") => TurboPrefill::Tiles,
            Ok("mma") | Err(_) => TurboPrefill::TensorCores,
            Ok(other) => {
                tracing::warn!(
                    "RUNIT_CUDA_TQ_PREFILL={other:?} is not mma or tiles: the tensor-core prefill is used"
                );
                TurboPrefill::TensorCores
            }
        }
    }
}

/// A CUDA device with its context, stream, compiled kernels and step state.
pub struct CudaBackend {
    ordinal: usize,
    device_name: String,
    target: Target,
    context: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    kernels: kernels::Kernels,
    step: Mutex<StepState>,
    /// `RUNIT_CUDA_SYNC=1`: wait after every launch so a fault names its op.
    sync_each_launch: bool,
    /// `RUNIT_CUDA_PLANT_FAULT=<op>` (a testing hook): the first launch of that op outside a
    /// capture is followed by a kernel that stores through an invalid address.
    planted_fault: Option<String>,
    /// Set once the planted fault has been launched.
    fault_launched: std::sync::atomic::AtomicBool,
    matmul: matmul::MatmulState,
    /// Counts launches and uploads that may write activations (every one but a matmul's), so
    /// the matmul knows when its quantized copy of an input is still current.
    writes: std::sync::atomic::AtomicU64,
    /// Attention's decode partials, kept between calls (one stream orders all work).
    attention_scratch: Mutex<Option<CudaSlice<f32>>>,
    /// Arrival counters of the kernels whose last block merges partials, zero at rest.
    arrival_counters: Mutex<Option<CudaSlice<u32>>>,
    /// Page-locked host memory that large downloads (logits) land in: a DMA straight from
    /// the device instead of the driver staging a pageable copy; grown as needed.
    download_staging: Mutex<Option<cudarc::driver::PinnedHostSlice<f32>>>,
    /// The greedy picks' and the device sampling's work and output, kept between calls.
    pick_scratch: Mutex<Option<CudaSlice<u32>>>,
    /// The MoE routing table (expert ids, then weights as f32 bits; ops/moe.rs).
    moe_routes: Mutex<Option<CudaSlice<u32>>>,
    /// The MoE decode path's per-(token, expert) activations (ops/moe.rs).
    moe_activations: Mutex<Option<CudaSlice<f32>>>,
    /// Launch with programmatic stream serialization (sm_90+, `RUNIT_CUDA_PDL` not `0`).
    programmatic_launch: bool,
    /// Exact numerics (see [`CudaBackend::with_exact_numerics`]).
    exact: bool,
    /// Which kernel decodes rows over TurboQuant caches ([`CudaBackend::with_turbo_decode`]).
    turbo_decode: TurboDecode,
    /// Which kernel runs prefill spans over TurboQuant caches ([`CudaBackend::with_turbo_prefill`]).
    turbo_prefill: TurboPrefill,
    /// Exact mode's RoPE angles, computed on the host (exact/ops.rs).
    exact_angles: exact::ops::AngleTable,
    /// The pass under way computes every row as if alone (`StepInputs::rows_alone`, set
    /// between `begin_step` and `end_step`): exact mode then takes a one-row call's order.
    rows_alone: std::sync::atomic::AtomicBool,
    /// ggml's f16 GELU table (`runit_backend::gelu::table`), uploaded when the backend opens
    /// so that a captured pass can read it.
    gelu_table: CudaSlice<u16>,
    /// TurboQuant's codebooks (`ops::turbo::tables`), uploaded with the first TurboQuant
    /// cache.
    turbo_tables: Mutex<Option<CudaSlice<f32>>>,
    /// `RUNIT_CUDA_PROFILE=1`: device time per kernel (profile.rs).
    profiler: Option<profile::Profiler>,
}

impl CudaBackend {
    /// Opens device `ordinal`. Fails with a clear error when there is no driver, no such
    /// device, or the device is older than compute capability 8.0.
    pub fn new(ordinal: usize) -> Result<CudaBackend, CudaError> {
        library::ensure_driver()?;
        let driver = |op: &str| {
            let op = op.to_string();
            move |e: cudarc::driver::DriverError| CudaError::Driver {
                op,
                message: e.to_string(),
            }
        };
        let count = CudaContext::device_count().map_err(driver("cuInit / device count"))? as usize;
        if ordinal >= count {
            return Err(CudaError::NoDevice { ordinal, count });
        }
        let context = CudaContext::new(ordinal).map_err(driver("creating a context"))?;
        // One stream orders everything; cudarc's per-slice event tracking would only add
        // work to every launch (and events inside graph captures).
        // SAFETY: cudarc then leaves the ordering of each slice's uses across streams to
        // us; this backend creates one stream (below) and allocates, uses and frees every
        // slice on it, so stream order alone keeps each use before its free. It is called
        // before any allocation, so no slice tracks events.
        unsafe { context.disable_event_tracking() };
        let device_name = context.name().map_err(driver("reading the device name"))?;
        let (major, minor) = context
            .compute_capability()
            .map_err(driver("reading the compute capability"))?;
        if major < 8 {
            return Err(CudaError::TooOld {
                ordinal,
                name: device_name,
                major,
                minor,
            });
        }
        let target = Target { major, minor };
        let stream = context.new_stream().map_err(driver("creating a stream"))?;
        let kernels = kernels::Kernels::new(Arc::clone(&context), target.clone());
        let gelu_table = stream
            .clone_htod(runit_backend::gelu::table())
            .map_err(driver("uploading the GELU table"))?;
        let sync_each_launch = std::env::var("RUNIT_CUDA_SYNC").is_ok_and(|v| v == "1");
        let profiler = profile::Profiler::from_env(&context);
        let planted_fault = std::env::var("RUNIT_CUDA_PLANT_FAULT")
            .ok()
            .filter(|op| !op.is_empty());
        Ok(CudaBackend {
            ordinal,
            device_name,
            target,
            context,
            stream,
            kernels,
            step: Mutex::new(StepState::default()),
            sync_each_launch,
            planted_fault,
            fault_launched: std::sync::atomic::AtomicBool::new(false),
            matmul: matmul::MatmulState::default(),
            writes: std::sync::atomic::AtomicU64::new(0),
            attention_scratch: Mutex::new(None),
            download_staging: Mutex::new(None),
            pick_scratch: Mutex::new(None),
            moe_routes: Mutex::new(None),
            moe_activations: Mutex::new(None),
            arrival_counters: Mutex::new(None),
            programmatic_launch: major >= 9
                && profiler.is_none()
                && std::env::var("RUNIT_CUDA_PDL").map_or(true, |v| v != "0"),
            exact: std::env::var("RUNIT_CUDA_EXACT").is_ok_and(|v| v == "1"),
            turbo_decode: TurboDecode::from_env(),
            turbo_prefill: TurboPrefill::from_env(),
            exact_angles: exact::ops::AngleTable::default(),
            rows_alone: std::sync::atomic::AtomicBool::new(false),
            gelu_table,
            turbo_tables: Mutex::new(None),
            profiler,
        })
    }

    /// Turns exact numerics on or off (`RUNIT_CUDA_EXACT=1` turns it on when the backend is
    /// opened). In exact mode every op computes the CPU backend's float operations, which
    /// are llama.cpp's CPU ones, in the same order and with the same roundings, so results
    /// equal the CPU's bit for bit: for checking greedy outputs against llama.cpp token for
    /// token. Its kernels give one thread to each output and the fused ops and graph capture
    /// are off, so it is much slower than the default mode.
    pub fn with_exact_numerics(mut self, exact: bool) -> CudaBackend {
        self.exact = exact;
        self
    }

    /// Chooses the kernel that decodes rows over TurboQuant caches outside exact numerics
    /// ([`TurboDecode`]; [`TurboDecode::from_env`] when the backend is opened).
    pub fn with_turbo_decode(mut self, decode: TurboDecode) -> CudaBackend {
        self.turbo_decode = decode;
        self
    }

    /// The kernel that decodes rows over TurboQuant caches ([`CudaBackend::with_turbo_decode`]).
    pub fn turbo_decode(&self) -> TurboDecode {
        self.turbo_decode
    }

    /// Chooses the kernel that runs prefill spans over TurboQuant caches outside exact
    /// numerics ([`TurboPrefill`]; [`TurboPrefill::from_env`] when the backend is opened).
    pub fn with_turbo_prefill(mut self, prefill: TurboPrefill) -> CudaBackend {
        self.turbo_prefill = prefill;
        self
    }

    /// The kernel that runs prefill spans over TurboQuant caches
    /// ([`CudaBackend::with_turbo_prefill`]).
    pub fn turbo_prefill(&self) -> TurboPrefill {
        self.turbo_prefill
    }

    /// True in exact-numerics mode ([`CudaBackend::with_exact_numerics`]).
    pub fn exact_numerics(&self) -> bool {
        self.exact
    }

    pub(crate) fn exact_angles(&self) -> &exact::ops::AngleTable {
        &self.exact_angles
    }

    /// True while a pass whose every row must get the numbers of a pass of its own is under
    /// way (`StepInputs::rows_alone`: speculative verification). Exact mode then gives each
    /// row the CPU's one-row order (the CPU does the same: no repacked gemm order, no
    /// tinyBLAS, one-chunk attention); the fast kernels do not follow it.
    pub(crate) fn rows_alone(&self) -> bool {
        self.rows_alone.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Copies `view` into `out` through the page-locked staging buffer (one DMA, then a host
    /// copy), growing the buffer when `out` is larger than any download before.
    fn download_pinned(
        &self,
        view: &cudarc::driver::CudaView<'_, f32>,
        out: &mut [f32],
    ) -> Result<(), runit_backend::BackendError> {
        let error = |e| self.driver_error("download", e);
        let mut staging = self
            .download_staging
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if staging
            .as_ref()
            .is_none_or(|pinned| pinned.len() < out.len())
        {
            *staging = None;
            // Flags 0: cached page-locked memory (write-combined memory is slow to read).
            // SAFETY: the memory starts uninitialised: it is only read through `host`, the
            // first `out.len()` values, after `memcpy_dtoh` has written all of them.
            let pinned = unsafe { self.context.alloc_pinned_with_flags::<f32>(out.len(), 0) }
                .map_err(error)?;
            *staging = Some(pinned);
        }
        let pinned = staging
            .as_mut()
            .expect("allocated above")
            .as_mut_slice()
            .map_err(error)?;
        // Only the view's length: a copy into the whole (possibly longer) staging buffer
        // would read past the view.
        let host = &mut pinned[..out.len()];
        self.stream.memcpy_dtoh(view, host).map_err(error)?;
        self.stream.synchronize().map_err(error)?;
        parallel_copy(out, host);
        Ok(())
    }

    /// The greedy picks' and the device sampling's scratch (ops/pick.rs, ops/sample.rs).
    pub(crate) fn pick_scratch(&self) -> &Mutex<Option<CudaSlice<u32>>> {
        &self.pick_scratch
    }

    /// The device's marketing name (e.g. "NVIDIA H200").
    pub fn device_name(&self) -> &str {
        &self.device_name
    }

    /// The architecture kernels are compiled for.
    pub fn target(&self) -> &Target {
        &self.target
    }

    /// Compiles (or loads from the cache) every kernel now.
    pub fn warm_up(&self) -> Result<(), CudaError> {
        self.kernels.load_all()
    }

    /// The stream all work is ordered on.
    pub(crate) fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// The multiprocessors of the backend's device.
    pub(crate) fn multiprocessors(&self, op: &'static str) -> Result<usize, BackendError> {
        use cudarc::driver::sys::CUdevice_attribute;
        let count = self
            .context
            .attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .map_err(|e| self.driver_error(op, e))?;
        Ok(count.max(1) as usize)
    }

    /// Kernel `name` of `file`, as a backend error naming `op` on failure.
    pub(crate) fn kernel(
        &self,
        op: &'static str,
        file: &'static str,
        name: &'static str,
    ) -> Result<cudarc::driver::CudaFunction, BackendError> {
        self.kernels
            .function(file, name)
            .map_err(|e| self.fault_or(op, e.into_backend(&self.name(), op)))
    }

    /// `error`, unless the context holds a kernel fault (which makes every later call fail
    /// too): then the fault, reported as [`CudaBackend::driver_error`] reports it. (Not
    /// checked during a capture, where the stream cannot be waited for.)
    pub(crate) fn fault_or(&self, op: &'static str, error: BackendError) -> BackendError {
        if self.capturing() {
            return error;
        }
        match self.stream.synchronize() {
            Err(fault) if is_kernel_fault(&fault) => self.driver_error(op, fault),
            _ => error,
        }
    }

    /// A driver failure as a backend error naming `op`. A kernel fault found here (the
    /// context's sticky error) may come from any kernel launched before: the message says so
    /// and how to find the one that faulted.
    pub(crate) fn driver_error(
        &self,
        op: &'static str,
        error: cudarc::driver::DriverError,
    ) -> BackendError {
        let message = if is_kernel_fault(&error) {
            format!(
                "{error}: a kernel fault was detected at {op}; kernels run asynchronously, so it \
                 may come from an earlier op: rerun with RUNIT_CUDA_SYNC=1 to name the op whose \
                 kernel faulted"
            )
        } else {
            error.to_string()
        };
        BackendError::Device {
            backend: self.name(),
            op,
            message,
        }
    }

    /// Launches `function` on the stream with cuLaunchKernelEx. On sm_90 and newer (unless
    /// `RUNIT_CUDA_PDL=0`) with programmatic stream serialization: the kernel may begin
    /// launching while its predecessor runs, and waits in `pdl_start()` (every kernel's first
    /// statement, kernels/common.cuh) until the predecessor has finished. Under
    /// `RUNIT_CUDA_PROFILE=1` the launch is timed as kernel `name`.
    ///
    /// # Safety
    /// `params` holds the addresses of values matching the kernel's parameter list, alive
    /// until the call returns; device addresses among them point to live memory.
    pub(crate) unsafe fn launch_raw(
        &self,
        op: &'static str,
        name: &str,
        function: &cudarc::driver::CudaFunction,
        cfg: cudarc::driver::LaunchConfig,
        params: &mut [*mut std::ffi::c_void],
    ) -> Result<(), BackendError> {
        use cudarc::driver::sys;
        self.context
            .bind_to_thread()
            .map_err(|e| self.driver_error(op, e))?;
        // SAFETY: a zeroed attribute is a valid value of this plain C struct; the union field
        // written is the one the attribute id selects.
        let mut attribute: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
        attribute.id =
            sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
        attribute.value.programmaticStreamSerializationAllowed = 1;
        let config = sys::CUlaunchConfig {
            gridDimX: cfg.grid_dim.0,
            gridDimY: cfg.grid_dim.1,
            gridDimZ: cfg.grid_dim.2,
            blockDimX: cfg.block_dim.0,
            blockDimY: cfg.block_dim.1,
            blockDimZ: cfg.block_dim.2,
            sharedMemBytes: cfg.shared_mem_bytes,
            hStream: self.stream.cu_stream(),
            attrs: &mut attribute,
            numAttrs: u32::from(self.programmatic_launch),
        };
        let profiled = self.profiler.as_ref().filter(|_| !self.capturing());
        let start = profiled.and_then(|p| p.mark(&self.stream));
        // SAFETY: the caller promises that `params` matches the kernel's parameter list and
        // that the device memory it names stays live for the kernel; `config` and
        // `attribute` live across the call, which copies them; the context was bound to this
        // thread above.
        unsafe {
            sys::cuLaunchKernelEx(
                &config,
                function.cu_function(),
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        }
        .result()
        .map_err(|e| self.driver_error(op, e))?;
        if let (Some(profiler), Some(start)) = (profiled, start) {
            if let Some(end) = profiler.mark(&self.stream) {
                profiler.record(name, cfg.grid_dim, start, end);
            }
        }
        Ok(())
    }

    /// True under `RUNIT_CUDA_PROFILE=1` (profile.rs): steps are then not captured.
    pub(crate) fn profiling(&self) -> bool {
        self.profiler.is_some()
    }

    /// Called after every launch: plants the fault of `RUNIT_CUDA_PLANT_FAULT` after the
    /// first launch of its op, and in `RUNIT_CUDA_SYNC=1` mode waits, so that an asynchronous
    /// fault is reported by the op that caused it.
    pub(crate) fn after_launch(&self, op: &'static str) -> Result<(), BackendError> {
        if op != "matmul" {
            self.note_write();
        }
        if self.planted_fault.as_deref() == Some(op)
            && !self.capturing()
            && !self
                .fault_launched
                .swap(true, std::sync::atomic::Ordering::Relaxed)
        {
            // Reported as `op`'s own launch (this macro calls after_launch again, which then
            // finds the fault already planted).
            launch!(self, op, "fault.cu", "plant_fault", grid_for(1), 0u64)?;
        }
        if self.sync_each_launch && !self.capturing() {
            self.stream.synchronize().map_err(|e| {
                if is_kernel_fault(&e) {
                    BackendError::Device {
                        backend: self.name(),
                        op,
                        message: format!("a kernel of {op} faulted: {e}"),
                    }
                } else {
                    self.driver_error(op, e)
                }
            })?;
        }
        Ok(())
    }

    /// The device address of ggml's f16 GELU table (ops/elementwise.rs).
    pub(crate) fn gelu_table(&self) -> u64 {
        device_address(&self.gelu_table, &self.stream)
    }

    /// [`PrimitiveOps::sample_pick`](runit_backend::PrimitiveOps::sample_pick) through the
    /// device kernels (kernels/sample.cu) whatever `RUNIT_CUDA_SAMPLE` says (the primitive
    /// takes them unless `RUNIT_CUDA_SAMPLE=0`), for testing them against the host.
    pub fn sample_pick_on_device(
        &self,
        logits: &mut runit_backend::Buffer,
        rows: usize,
        width: usize,
        sampling: &[runit_backend::RowSampling<'_>],
    ) -> Result<Vec<runit_backend::Sampled>, BackendError> {
        ops::sample::sample_pick(self, logits, rows, width, sampling)
    }

    /// The bytes of a KV cache of this backend (`n_cells` rows of `KvType::row_bytes`), for
    /// comparing what the kernels stored with the CPU's rows (waits for the stream).
    pub fn kv_bytes(&self, cache: &runit_backend::KvCache) -> Result<Vec<u8>, BackendError> {
        const OP: &str = "kv_bytes";
        let device = cache
            .payload::<memory::DeviceKv>()
            .ok_or(BackendError::ForeignBuffer {
                op: OP,
                what: "cache",
            })?;
        let len = cache
            .ty
            .row_bytes(cache.width, cache.role)
            .map_or(0, |row| row * cache.n_cells);
        let mut bytes = vec![0u8; len];
        self.stream
            .memcpy_dtoh(&device.bytes.slice(..len), &mut bytes)
            .map_err(|e| self.driver_error(OP, e))?;
        self.stream
            .synchronize()
            .map_err(|e| self.driver_error(OP, e))?;
        Ok(bytes)
    }

    /// The address of TurboQuant's codebooks (`ops::turbo::tables`), uploaded on first use
    /// (by `alloc_kv`, outside any capture).
    pub(crate) fn turbo_tables(&self) -> Result<u64, BackendError> {
        let mut slot = self
            .turbo_tables
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(tables) = slot.as_ref() {
            return Ok(device_address(tables, &self.stream));
        }
        let tables = self
            .stream
            .clone_htod(&ops::turbo::tables())
            .map_err(|e| self.driver_error("turbo tables", e))?;
        let ptr = device_address(&tables, &self.stream);
        *slot = Some(tables);
        Ok(ptr)
    }

    /// The address of the MoE routing table of at least `len` u32 values (ops/moe.rs).
    pub(crate) fn moe_routes(&self, op: &'static str, len: usize) -> Result<u64, BackendError> {
        self.persistent(&self.moe_routes, op, "MoE routing table", len)
    }

    /// The address of the MoE decode activations of at least `len` f32 values (ops/moe.rs).
    pub(crate) fn moe_activations(
        &self,
        op: &'static str,
        len: usize,
    ) -> Result<u64, BackendError> {
        self.persistent(&self.moe_activations, op, "MoE activations", len)
    }

    /// The first `out.len()` values of the MoE routing table (waits for the stream).
    pub(crate) fn read_moe_routes(
        &self,
        op: &'static str,
        out: &mut [u32],
    ) -> Result<(), BackendError> {
        let slot = self
            .moe_routes
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let table = slot
            .as_ref()
            .filter(|table| table.len() >= out.len())
            .ok_or_else(|| BackendError::Device {
                backend: self.name(),
                op,
                message: format!("the routing table holds fewer than {} values", out.len()),
            })?;
        self.stream
            .memcpy_dtoh(&table.slice(..out.len()), out)
            .map_err(|e| self.driver_error(op, e))?;
        self.stream
            .synchronize()
            .map_err(|e| self.driver_error(op, e))
    }

    /// Drops every captured graph (and the record of keys seen), because a buffer whose
    /// address they hold is being replaced; the next passes are captured anew.
    pub(crate) fn forget_graphs(&self) {
        let mut state = self
            .step
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        state.graphs.clear();
        state.seen.clear();
    }

    /// The address of attention's scratch of at least `len` f32 values, grown (outside a
    /// capture only) when too small. Its contents are whatever the last call left.
    pub(crate) fn attention_scratch(
        &self,
        op: &'static str,
        len: usize,
    ) -> Result<u64, BackendError> {
        self.persistent(&self.attention_scratch, op, "attention scratch", len)
    }

    /// The address of at least `len` arrival counters, all zero between calls (the last block
    /// of each group resets its counter), shared by the kernels whose last block merges
    /// partials (tensor-core decode attention, split batched matmuls); grown, zeroed, outside
    /// a capture only.
    pub(crate) fn arrival_counters(
        &self,
        op: &'static str,
        len: usize,
    ) -> Result<u64, BackendError> {
        self.persistent(&self.arrival_counters, op, "arrival counters", len)
    }

    /// The address of the buffer in `slot`, replaced by a zeroed one of at least `len`
    /// elements (a power of two) when missing or too small; growing inside a capture is an
    /// error (no allocation nodes in a graph).
    fn persistent<T: cudarc::driver::DeviceRepr + cudarc::driver::ValidAsZeroBits>(
        &self,
        slot: &Mutex<Option<CudaSlice<T>>>,
        op: &'static str,
        what: &str,
        len: usize,
    ) -> Result<u64, BackendError> {
        let mut slot = slot.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(slice) = slot.as_ref().filter(|s| s.len() >= len) {
            return Ok(device_address(slice, &self.stream));
        }
        if self.capturing() {
            return Err(BackendError::Device {
                backend: self.name(),
                op,
                message: format!("{what} must grow to {len} values during a capture"),
            });
        }
        if slot.take().is_some() {
            // Captured graphs hold the old address, which is freed now.
            self.forget_graphs();
        }
        let slice = self
            .stream
            .alloc_zeros::<T>(len.max(1).next_power_of_two())
            .map_err(|e| self.oom_or(e, op, len * std::mem::size_of::<T>()))?;
        let ptr = device_address(&slice, &self.stream);
        *slot = Some(slice);
        Ok(ptr)
    }

    /// Records that activations may have changed (see `writes`).
    pub(crate) fn note_write(&self) {
        self.writes
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    /// The write counter (see `writes`).
    pub(crate) fn write_generation(&self) -> u64 {
        self.writes.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// True while a forward pass is being captured into a graph.
    pub(crate) fn capturing(&self) -> bool {
        self.step.lock().map(|s| s.capturing).unwrap_or(false)
    }

    /// A device copy of small host data for one op (freed, stream-ordered, when dropped).
    /// Refused while capturing: a captured pass must read its inputs from the step buffer.
    pub(crate) fn upload_small<T: cudarc::driver::DeviceRepr>(
        &self,
        op: &'static str,
        data: &[T],
    ) -> Result<(CudaSlice<T>, u64), BackendError> {
        if self.capturing() {
            return Err(BackendError::Device {
                backend: self.name(),
                op,
                message: "host inputs that are not the step's cannot be captured".into(),
            });
        }
        let slice = self
            .stream
            .clone_htod(data)
            .map_err(|e| self.driver_error(op, e))?;
        let ptr = device_address(&slice, &self.stream);
        Ok((slice, ptr))
    }

    /// The device address of the packed step inputs for an op: the active step's when the
    /// host slices given are the active step's own, else a private upload (kept alive by the
    /// returned guard).
    pub(crate) fn step_inputs(
        &self,
        op: &'static str,
        tokens: Option<&[u32]>,
        positions: Option<&[u32]>,
        spans: Option<&[SequenceSpan]>,
        logit_rows: Option<&[u32]>,
    ) -> Result<StepView, BackendError> {
        {
            let state = self.step.lock().expect("step lock");
            if let Some(active) = &state.active {
                let same = |given: Option<(usize, usize)>, have: (usize, usize)| {
                    given.is_none_or(|g| g == have)
                };
                let ident = |p: *const u8, len: usize| (p as usize, len);
                let spans = spans.map(|s| ident(s.as_ptr().cast(), s.len()));
                // The step's spans, or its windowed layers' (the same rows and positions).
                let buffer = if same(spans, active.spans) {
                    Some(&state.step)
                } else if spans.is_some() && spans == active.window_spans {
                    Some(&state.window)
                } else {
                    None
                };
                if let Some(buffer) = buffer.filter(|_| {
                    same(
                        tokens.map(|t| ident(t.as_ptr().cast(), t.len())),
                        active.tokens,
                    ) && same(
                        positions.map(|p| ident(p.as_ptr().cast(), p.len())),
                        active.positions,
                    ) && same(
                        logit_rows.map(|r| ident(r.as_ptr().cast(), r.len())),
                        active.logit_rows,
                    )
                }) {
                    return Ok(StepView {
                        ptr: buffer.ptr,
                        table_stride: buffer.table_stride,
                        _owned: None,
                    });
                }
            }
        }
        let packed = step::pack(tokens, positions, spans, logit_rows);
        let (slice, ptr) = self.upload_small(op, &packed.data)?;
        Ok(StepView {
            ptr,
            table_stride: packed.table_stride,
            _owned: Some(slice),
        })
    }

    /// The matmul kernels' state (f16 staging for tensor-core GEMMs, cuBLAS handle).
    pub(crate) fn matmul_state(&self) -> &matmul::MatmulState {
        &self.matmul
    }

    /// The KV cache types this backend stores.
    const KV_TYPES: &'static str = "f16, f32, q8_0, q4_0, tq4, tq3";

    /// Bytes of one cache row of `width` values of `ty`; refuses a width that is not a whole
    /// number of the type's blocks.
    fn kv_row_bytes(ty: KvType, width: usize, role: KvRole) -> Result<usize, BackendError> {
        ty.row_bytes(width, role)
            .ok_or_else(|| kv_type_refused(ty, &format!("rows of {width} values")))
    }
}

/// The error for a KV cache type this backend does not store (for `what`).
pub(crate) fn kv_type_refused(ty: KvType, what: &str) -> BackendError {
    BackendError::UnsupportedKv {
        backend: "cuda".to_string(),
        ty,
        what: what.to_string(),
        supported: CudaBackend::KV_TYPES,
    }
}

/// `dst.copy_from_slice(src)` on up to eight threads when it is large: a decode step of 64
/// rows downloads 39 MB of logits (64 × 152,064 floats), whose copy out of the pinned staging
/// buffer took milliseconds on one thread while the GPU waited for the next step.
fn parallel_copy(dst: &mut [f32], src: &[f32]) {
    // 4 MB a thread at least: below that a thread's start costs more than it saves.
    const PER_THREAD_MIN: usize = 1 << 20;
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(8)
        .min(dst.len() / PER_THREAD_MIN)
        .max(1);
    if threads == 1 {
        dst.copy_from_slice(src);
        return;
    }
    let chunk = dst.len().div_ceil(threads);
    std::thread::scope(|scope| {
        for (d, s) in dst.chunks_mut(chunk).zip(src.chunks(chunk)) {
            scope.spawn(move || d.copy_from_slice(s));
        }
    });
}

/// The error for a cache of ggml's blocks under `--exact` numerics, whose kernels follow the
/// CPU's order for f16, f32 and TurboQuant caches only.
pub(crate) fn exact_kv_refused(ty: KvType) -> BackendError {
    kv_type_refused(ty, "--exact numerics (f16, f32, tq4 and tq3 caches only)")
}

/// True for the errors of a kernel that faulted (the context's sticky errors).
fn is_kernel_fault(error: &cudarc::driver::DriverError) -> bool {
    use cudarc::driver::sys::CUresult::*;
    matches!(
        error.0,
        CUDA_ERROR_ILLEGAL_ADDRESS
            | CUDA_ERROR_LAUNCH_FAILED
            | CUDA_ERROR_MISALIGNED_ADDRESS
            | CUDA_ERROR_ILLEGAL_INSTRUCTION
            | CUDA_ERROR_INVALID_ADDRESS_SPACE
            | CUDA_ERROR_INVALID_PC
            | CUDA_ERROR_HARDWARE_STACK_ERROR
            | CUDA_ERROR_ASSERT
            | CUDA_ERROR_LAUNCH_TIMEOUT
    )
}

/// `RUNIT_CUDA_FUSED=0` runs the fused ops as their primitive sequences (for comparing).
fn fused_ops_enabled() -> bool {
    static FUSED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *FUSED.get_or_init(|| std::env::var("RUNIT_CUDA_FUSED").map_or(true, |v| v != "0"))
}

impl CudaBackend {
    /// True when the fused ops run their fused kernels: not with `RUNIT_CUDA_FUSED=0`, and
    /// not in exact-numerics mode, whose twins are those of the CPU's primitive ops (the
    /// CPU's fused ops give the same bits as its primitive sequences).
    pub(crate) fn fused_ops(&self) -> bool {
        !self.exact && fused_ops_enabled()
    }
}

/// Packed step inputs on the device, as handed to kernels (`const i32* step`).
pub(crate) struct StepView {
    pub ptr: u64,
    /// Block-table entries reserved per span.
    pub table_stride: usize,
    _owned: Option<CudaSlice<i32>>,
}

/// The raw device address of a slice (event tracking is off, so nothing is recorded).
pub(crate) fn device_address<T>(slice: &CudaSlice<T>, stream: &Arc<CudaStream>) -> u64 {
    let (ptr, _guard) = slice.device_ptr(stream);
    ptr
}

/// The number in environment variable `name` (a measuring knob), else `default`; read once
/// into `cell`.
pub(crate) fn env_count(
    cell: &'static std::sync::OnceLock<usize>,
    name: &str,
    default: usize,
) -> usize {
    *cell.get_or_init(|| {
        std::env::var(name)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    })
}

/// A 1-D launch covering `n` elements with 256-thread blocks (grid capped; kernels loop).
pub(crate) fn grid_for(n: usize) -> LaunchConfig {
    let blocks = n.div_ceil(256).clamp(1, 65_535 * 8) as u32;
    LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    }
}

#[cfg(test)]
mod copy_tests {
    #[test]
    fn parallel_copy_equals_a_plain_copy() {
        for len in [0, 5, (1 << 20) - 1, 3 << 20, (9 << 20) + 7] {
            let src: Vec<f32> = (0..len).map(|i| i as f32 * 0.5 - 3.0).collect();
            let mut dst = vec![f32::NAN; len];
            super::parallel_copy(&mut dst, &src);
            assert!(
                dst.iter()
                    .zip(&src)
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "len {len}"
            );
        }
    }
}
