//! The CUDA backend: every op of [`runit_backend::Backend`] as NVRTC-compiled kernels on
//! weights kept in their packed GGUF formats, with whole decode steps captured as CUDA graphs.
//!
//! The build needs no CUDA installation: `cudarc` loads the driver and NVRTC at run time, and
//! a missing library or device is a [`CudaError`], never a panic. Kernels are the `.cu` files
//! of `kernels/`, embedded in the binary and compiled at first use for the device's compute
//! capability (cached on disk, see [`compile`]). One stream orders all work; activations are
//! f32, the KV cache f16 (or f32).

pub mod compile;
mod error;
mod kernels;
mod library;
mod matmul;
mod memory;
mod ops;
mod step;

use std::sync::{Arc, Mutex};

use cudarc::driver::{CudaContext, CudaSlice, CudaStream, DevicePtr, LaunchConfig};
use runit_backend::{
    AttentionParams, Backend, BackendError, Buffer, HostMemory, KvCache, KvType, Op, RopeParams,
    SequenceSpan, StepInputs, StepKey, Weight,
};
use runit_quant::GgmlType;

pub use compile::{compile_all, KernelSource, Target};
pub use error::CudaError;
pub use kernels::{HEADERS, SOURCES};

use memory::{buffer_ptr, check_len, DeviceBuffer, DeviceKv, DeviceWeight};
use step::{HostIdentity, StepState};

/// Launches `$file`'s kernel `$name` on the backend's stream with the given arguments
/// (device addresses as `u64`, scalars as `i32`/`u32`/`u64`/`f32`), mapping failures to a
/// [`BackendError`] that names `$op`.
macro_rules! launch {
    ($backend:expr, $op:expr, $file:literal, $name:literal, $cfg:expr, $($arg:expr),* $(,)?) => {{
        let backend: &$crate::CudaBackend = $backend;
        let function = backend.kernel($op, $file, $name)?;
        let mut builder = backend.stream().launch_builder(&function);
        #[allow(unused_imports)]
        use cudarc::driver::PushKernelArg as _;
        $( let arg = $arg; builder.arg(&arg); )*
        // SAFETY: the kernel's parameter list matches these arguments (same order and
        // types, checked by the kernel's author against kernels/*.cu), and every address
        // points to live device memory owned by a handle the caller holds.
        let launched = unsafe { builder.launch($cfg) };
        launched.map_err(|e| backend.driver_error($op, e))?;
        backend.after_launch($op)
    }};
}
pub(crate) use launch;

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
    matmul: matmul::MatmulState,
    /// Counts launches and uploads that may write activations (every one but a matmul's), so
    /// the matmul knows when its quantized copy of an input is still current.
    writes: std::sync::atomic::AtomicU64,
    /// Attention's decode partials, kept between calls (one stream orders all work).
    attention_scratch: Mutex<Option<CudaSlice<f32>>>,
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
        // SAFETY: called before any allocation or launch on this context.
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
        let sync_each_launch = std::env::var("RUNIT_CUDA_SYNC").is_ok_and(|v| v == "1");
        Ok(CudaBackend {
            ordinal,
            device_name,
            target,
            context,
            stream,
            kernels,
            step: Mutex::new(StepState::default()),
            sync_each_launch,
            matmul: matmul::MatmulState::default(),
            writes: std::sync::atomic::AtomicU64::new(0),
            attention_scratch: Mutex::new(None),
        })
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

    /// Kernel `name` of `file`, as a backend error naming `op` on failure.
    pub(crate) fn kernel(
        &self,
        op: &'static str,
        file: &'static str,
        name: &'static str,
    ) -> Result<cudarc::driver::CudaFunction, BackendError> {
        self.kernels
            .function(file, name)
            .map_err(|e| e.into_backend(&self.name(), op))
    }

    /// A driver failure as a backend error naming `op`.
    pub(crate) fn driver_error(
        &self,
        op: &'static str,
        error: cudarc::driver::DriverError,
    ) -> BackendError {
        BackendError::Device {
            backend: self.name(),
            op,
            message: error.to_string(),
        }
    }

    /// Called after every launch: in `RUNIT_CUDA_SYNC=1` mode waits, so that an asynchronous
    /// fault is reported by the op that caused it.
    pub(crate) fn after_launch(&self, op: &'static str) -> Result<(), BackendError> {
        if op != "matmul" {
            self.note_write();
        }
        if self.sync_each_launch && !self.capturing() {
            self.stream
                .synchronize()
                .map_err(|e| self.driver_error(op, e))?;
        }
        Ok(())
    }

    /// The address of attention's scratch of at least `len` f32 values, grown (outside a
    /// capture only) when too small. Its contents are whatever the last call left.
    pub(crate) fn attention_scratch(
        &self,
        op: &'static str,
        len: usize,
    ) -> Result<u64, BackendError> {
        let mut slot = self
            .attention_scratch
            .lock()
            .expect("attention scratch lock");
        if let Some(slice) = slot.as_ref().filter(|s| s.len() >= len) {
            return Ok(device_address(slice, &self.stream));
        }
        if self.capturing() {
            return Err(BackendError::Device {
                backend: self.name(),
                op,
                message: format!("attention scratch must grow to {len} values during a capture"),
            });
        }
        let slice = self
            .stream
            .alloc_zeros::<f32>(len.max(1).next_power_of_two())
            .map_err(|e| self.oom_or(e, op, len * 4))?;
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
                if same(
                    tokens.map(|t| ident(t.as_ptr().cast(), t.len())),
                    active.tokens,
                ) && same(
                    positions.map(|p| ident(p.as_ptr().cast(), p.len())),
                    active.positions,
                ) && same(
                    spans.map(|s| ident(s.as_ptr().cast(), s.len())),
                    active.spans,
                ) && same(
                    logit_rows.map(|r| ident(r.as_ptr().cast(), r.len())),
                    active.logit_rows,
                ) {
                    return Ok(StepView {
                        ptr: state.buffer_ptr,
                        table_stride: state.table_stride,
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

    fn kv_element_bytes(ty: KvType) -> usize {
        match ty {
            KvType::F32 => 4,
            KvType::F16 => 2,
        }
    }
}

/// `RUNIT_CUDA_FUSED=0` runs the fused ops as their primitive sequences (for comparing).
fn fused_ops() -> bool {
    static FUSED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *FUSED.get_or_init(|| std::env::var("RUNIT_CUDA_FUSED").map_or(true, |v| v != "0"))
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

/// A 1-D launch covering `n` elements with 256-thread blocks (grid capped; kernels loop).
pub(crate) fn grid_for(n: usize) -> LaunchConfig {
    let blocks = n.div_ceil(256).clamp(1, 65_535 * 8) as u32;
    LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    }
}

impl Backend for CudaBackend {
    fn name(&self) -> String {
        format!("cuda:{}", self.ordinal)
    }

    fn supports(&self, op: Op, ty: GgmlType) -> bool {
        match op {
            Op::Embedding => ops::embedding::supports(ty),
            Op::MatMul => matmul::supports(ty),
            _ => false,
        }
    }

    fn alloc(&self, len: usize) -> Result<Buffer, BackendError> {
        let slice = self
            .stream
            .alloc_zeros::<f32>(len.max(1))
            .map_err(|e| self.oom_or(e, "alloc", len * 4))?;
        let ptr = device_address(&slice, &self.stream);
        Ok(Buffer::new(len, Box::new(DeviceBuffer { slice, ptr })))
    }

    fn upload(&self, buffer: &mut Buffer, data: &[f32]) -> Result<(), BackendError> {
        check_len("upload", "buffer", buffer, data.len())?;
        let device = buffer
            .payload_mut::<DeviceBuffer>()
            .ok_or(BackendError::ForeignBuffer {
                op: "upload",
                what: "buffer",
            })?;
        let mut view = device.slice.slice_mut(..data.len());
        self.note_write();
        self.stream
            .memcpy_htod(data, &mut view)
            .map_err(|e| self.driver_error("upload", e))
    }

    fn download(&self, buffer: &Buffer, out: &mut [f32]) -> Result<(), BackendError> {
        check_len("download", "buffer", buffer, out.len())?;
        let device = buffer
            .payload::<DeviceBuffer>()
            .ok_or(BackendError::ForeignBuffer {
                op: "download",
                what: "buffer",
            })?;
        let view = device.slice.slice(..out.len());
        self.stream
            .memcpy_dtoh(&view, out)
            .map_err(|e| self.driver_error("download", e))?;
        self.stream
            .synchronize()
            .map_err(|e| self.driver_error("download", e))
    }

    fn load_weight(
        &self,
        name: &str,
        ty: GgmlType,
        shape: &[usize],
        memory: Arc<dyn HostMemory>,
        range: std::ops::Range<usize>,
    ) -> Result<Weight, BackendError> {
        let bytes = memory
            .bytes()
            .get(range.clone())
            .ok_or(BackendError::Shape {
                op: "load_weight",
                what: "tensor byte range",
                expected: range.end,
                found: memory.bytes().len(),
            })?;
        let slice = self
            .stream
            .clone_htod(bytes)
            .map_err(|e| self.oom_or(e, "load_weight", bytes.len()))?;
        let ptr = device_address(&slice, &self.stream);
        Ok(Weight::new(
            name.to_string(),
            ty,
            shape.to_vec(),
            Arc::new(DeviceWeight { bytes: slice, ptr }),
        ))
    }

    fn alloc_kv(&self, n_cells: usize, width: usize, ty: KvType) -> Result<KvCache, BackendError> {
        let len = n_cells * width * Self::kv_element_bytes(ty);
        let bytes = self
            .stream
            .alloc_zeros::<u8>(len.max(1))
            .map_err(|e| self.oom_or(e, "alloc_kv", len))?;
        let ptr = device_address(&bytes, &self.stream);
        Ok(KvCache::new(
            n_cells,
            width,
            ty,
            Box::new(DeviceKv { bytes, ptr }),
        ))
    }

    fn embedding(&self, table: &Weight, ids: &[u32], out: &mut Buffer) -> Result<(), BackendError> {
        ops::embedding::embedding(self, table, ids, out)
    }

    fn matmul(
        &self,
        weight: &Weight,
        x: &Buffer,
        tokens: usize,
        out: &mut Buffer,
    ) -> Result<(), BackendError> {
        matmul::matmul(self, weight, x, tokens, out)
    }

    fn add_bias(&self, x: &mut Buffer, bias: &Weight, tokens: usize) -> Result<(), BackendError> {
        ops::elementwise::add_bias(self, x, bias, tokens)
    }

    fn rms_norm(
        &self,
        x: &Buffer,
        weight: &Weight,
        eps: f32,
        rows: usize,
        out: &mut Buffer,
    ) -> Result<(), BackendError> {
        let out_ptr = buffer_ptr("rms_norm", "out", out)?;
        check_len("rms_norm", "out", out, rows * weight.row_len())?;
        ops::norm::rms_norm(self, x, weight, eps, rows, out_ptr)
    }

    fn rms_norm_in_place(
        &self,
        x: &mut Buffer,
        weight: &Weight,
        eps: f32,
        rows: usize,
    ) -> Result<(), BackendError> {
        let ptr = buffer_ptr("rms_norm", "x", x)?;
        ops::norm::rms_norm(self, x, weight, eps, rows, ptr)
    }

    fn rope(
        &self,
        x: &mut Buffer,
        positions: &[u32],
        params: &RopeParams,
        freq_factors: Option<&Weight>,
    ) -> Result<(), BackendError> {
        ops::rope::rope(self, x, positions, params, freq_factors)
    }

    fn add(&self, dst: &mut Buffer, src: &Buffer, len: usize) -> Result<(), BackendError> {
        check_len("add", "dst", dst, len)?;
        check_len("add", "src", src, len)?;
        let d = buffer_ptr("add", "dst", dst)?;
        let s = buffer_ptr("add", "src", src)?;
        launch!(
            self,
            "add",
            "elementwise.cu",
            "add_f32",
            grid_for(len),
            d,
            s,
            len as u64
        )
    }

    fn silu_mul(&self, gate: &mut Buffer, up: &Buffer, len: usize) -> Result<(), BackendError> {
        ops::elementwise::silu_mul(self, gate, up, len)
    }

    fn kv_write(
        &self,
        k: &Buffer,
        v: &Buffer,
        k_cache: &mut KvCache,
        v_cache: &mut KvCache,
        spans: &[SequenceSpan],
    ) -> Result<(), BackendError> {
        ops::kv::kv_write(self, k, v, k_cache, v_cache, spans)
    }

    fn attention(
        &self,
        q: &Buffer,
        k_cache: &KvCache,
        v_cache: &KvCache,
        spans: &[SequenceSpan],
        params: &AttentionParams,
        out: &mut Buffer,
    ) -> Result<(), BackendError> {
        ops::attention::attention(self, q, k_cache, v_cache, spans, params, out)
    }

    fn gather_rows(
        &self,
        src: &Buffer,
        rows: &[u32],
        width: usize,
        out: &mut Buffer,
    ) -> Result<(), BackendError> {
        ops::rows::gather_rows(self, src, rows, width, out)
    }

    fn scatter_add_rows(
        &self,
        src: &Buffer,
        rows: &[u32],
        scales: &[f32],
        width: usize,
        dst: &mut Buffer,
    ) -> Result<(), BackendError> {
        ops::rows::scatter_add_rows(self, src, rows, scales, width, dst)
    }

    fn copy(
        &self,
        src: &Buffer,
        src_offset: usize,
        dst: &mut Buffer,
        dst_offset: usize,
        len: usize,
    ) -> Result<(), BackendError> {
        check_len("copy", "src", src, src_offset + len)?;
        check_len("copy", "dst", dst, dst_offset + len)?;
        let s = buffer_ptr("copy", "src", src)? + 4 * src_offset as u64;
        let d = buffer_ptr("copy", "dst", dst)? + 4 * dst_offset as u64;
        launch!(
            self,
            "copy",
            "elementwise.cu",
            "copy_f32",
            grid_for(len),
            d,
            s,
            len as u64
        )
    }

    fn matmul_bias(
        &self,
        weight: &Weight,
        bias: Option<&Weight>,
        x: &Buffer,
        tokens: usize,
        out: &mut Buffer,
    ) -> Result<(), BackendError> {
        if !fused_ops() {
            self.matmul(weight, x, tokens, out)?;
            return match bias {
                Some(bias) => self.add_bias(out, bias, tokens),
                None => Ok(()),
            };
        }
        matmul::matmul_bias(self, weight, bias, x, tokens, out)
    }

    fn add_rms_norm(
        &self,
        x: &mut Buffer,
        delta: &Buffer,
        weight: &Weight,
        eps: f32,
        rows: usize,
        out: &mut Buffer,
    ) -> Result<(), BackendError> {
        if !fused_ops() {
            self.add(x, delta, rows * weight.row_len())?;
            return self.rms_norm(x, weight, eps, rows, out);
        }
        ops::fused::add_rms_norm(self, x, delta, weight, eps, rows, out)
    }

    fn rope_kv_write(
        &self,
        q: &mut Buffer,
        k: &mut Buffer,
        v: &Buffer,
        positions: &[u32],
        q_params: &RopeParams,
        k_params: &RopeParams,
        freq_factors: Option<&Weight>,
        k_cache: &mut KvCache,
        v_cache: &mut KvCache,
        spans: &[SequenceSpan],
    ) -> Result<(), BackendError> {
        if !fused_ops() {
            self.rope(q, positions, q_params, freq_factors)?;
            self.rope(k, positions, k_params, freq_factors)?;
            return self.kv_write(k, v, k_cache, v_cache, spans);
        }
        ops::fused::rope_kv_write(
            self,
            q,
            k,
            v,
            positions,
            q_params,
            k_params,
            freq_factors,
            k_cache,
            v_cache,
            spans,
        )
    }

    fn matmul_swiglu(
        &self,
        gate: &Weight,
        up: &Weight,
        x: &Buffer,
        tokens: usize,
        up_out: &mut Buffer,
        out: &mut Buffer,
    ) -> Result<(), BackendError> {
        if !fused_ops() {
            self.matmul(gate, x, tokens, out)?;
            self.matmul(up, x, tokens, up_out)?;
            return self.silu_mul(out, up_out, tokens * gate.rows());
        }
        matmul::matmul_swiglu(self, gate, up, x, tokens, up_out, out)
    }

    fn synchronize(&self) -> Result<(), BackendError> {
        self.stream
            .synchronize()
            .map_err(|e| self.driver_error("synchronize", e))
    }

    fn memory_available(&self) -> Option<usize> {
        self.context.mem_get_info().ok().map(|(free, _total)| free)
    }

    fn begin_step(&self, inputs: &StepInputs<'_>) -> Result<(), BackendError> {
        let packed = step::pack(
            Some(inputs.tokens),
            Some(inputs.positions),
            Some(inputs.spans),
            Some(inputs.logit_rows),
        );
        // A pass (and a captured graph) never starts from a quantized input of the last one.
        self.note_write();
        let mut state = self.step.lock().expect("step lock");
        state
            .upload(&self.stream, &packed)
            .map_err(|e| self.driver_error("begin_step", e))?;
        state.active = Some(HostIdentity::of(inputs));
        Ok(())
    }

    fn end_step(&self) -> Result<(), BackendError> {
        self.step.lock().expect("step lock").active = None;
        Ok(())
    }

    fn captures_steps(&self) -> bool {
        std::env::var("RUNIT_CUDA_GRAPHS").map_or(true, |v| v != "0")
    }

    fn run_captured(
        &self,
        key: StepKey,
        body: &mut dyn FnMut() -> Result<(), BackendError>,
    ) -> Result<(), BackendError> {
        let graph_key = {
            let mut state = self.step.lock().expect("step lock");
            let full_key = (key, state.table_stride);
            if let Some(graph) = state.graphs.get(&full_key) {
                return graph
                    .0
                    .launch()
                    .map_err(|e| self.driver_error("graph replay", e));
            }
            // The first pass of a key runs op by op: kernels get compiled and lazily sized
            // scratch buffers allocated outside the capture. The next one is captured.
            if state.seen.insert(full_key) {
                drop(state);
                return body();
            }
            full_key
        };
        let mode = cudarc::driver::sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL;
        self.stream
            .begin_capture(mode)
            .map_err(|e| self.driver_error("graph capture", e))?;
        self.step.lock().expect("step lock").capturing = true;
        let result = body();
        self.step.lock().expect("step lock").capturing = false;
        let flags = cudarc::driver::sys::CUgraphInstantiate_flags(0);
        let graph = self.stream.end_capture(flags);
        result?;
        let graph = graph
            .map_err(|e| self.driver_error("graph capture", e))?
            .ok_or_else(|| BackendError::Device {
                backend: self.name(),
                op: "graph capture",
                message: "the capture recorded nothing".into(),
            })?;
        if std::env::var_os("RUNIT_CUDA_DEBUG").is_some() {
            let mut nodes = 0usize;
            // SAFETY: querying the node count of a live graph (null array = count only).
            unsafe {
                cudarc::driver::sys::cuGraphGetNodes(
                    graph.cu_graph(),
                    std::ptr::null_mut(),
                    &mut nodes,
                )
            };
            eprintln!("runit-cuda: captured {key:?} as a graph of {nodes} nodes");
        }
        graph
            .launch()
            .map_err(|e| self.driver_error("graph replay", e))?;
        self.step
            .lock()
            .expect("step lock")
            .graphs
            .insert(graph_key, step::Graph(graph));
        Ok(())
    }
}

impl CudaBackend {
    /// An allocation failure, reported as out of memory with what is free.
    fn oom_or(
        &self,
        error: cudarc::driver::DriverError,
        op: &'static str,
        bytes: usize,
    ) -> BackendError {
        if error.0 == cudarc::driver::sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY {
            BackendError::OutOfMemory {
                backend: self.name(),
                bytes,
                available: self.memory_available().unwrap_or(0),
            }
        } else {
            self.driver_error(op, error)
        }
    }
}
