//! The backend contract on [`CudaBackend`]: buffers and weights in device memory, each op
//! delegating to its module under `ops/` or `matmul/`, and the step/graph hooks (see
//! [`crate::step`]).

use std::sync::Arc;

use runit_backend::{
    unfused, Activation, AddRmsNorm, Attention, BackendError, Buffer, BufferCopy, Device, FusedOps,
    GatedFfnRun, KvCache, KvRole, KvType, KvWrite, MoeFfnRun, Op, OpResult, PrimitiveOps,
    Projection, RmsNorm, RopeKvWrite, RopeParams, ScatterAddRows, StepInputs, StepKey, Weight,
    WeightSource,
};
use runit_quant::GgmlType;

use crate::memory::{buffer_ptr, check_len, DeviceBuffer, DeviceKv, DeviceWeight};

/// Downloads of at least this many values go through page-locked staging memory.
const PINNED_DOWNLOAD_MIN: usize = 1 << 14;
use crate::step::{self, HostIdentity};
use crate::{device_address, exact, grid_for, launch, matmul, ops, CudaBackend};

impl Device for CudaBackend {
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

    fn upload(&self, buffer: &mut Buffer, data: &[f32]) -> OpResult {
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

    fn download(&self, buffer: &Buffer, out: &mut [f32]) -> OpResult {
        check_len("download", "buffer", buffer, out.len())?;
        let device = buffer
            .payload::<DeviceBuffer>()
            .ok_or(BackendError::ForeignBuffer {
                op: "download",
                what: "buffer",
            })?;
        let view = device.slice.slice(..out.len());
        if out.len() >= PINNED_DOWNLOAD_MIN {
            return self.download_pinned(&view, out);
        }
        self.stream
            .memcpy_dtoh(&view, out)
            .map_err(|e| self.driver_error("download", e))?;
        self.stream
            .synchronize()
            .map_err(|e| self.driver_error("download", e))
    }

    fn load_weight(&self, source: WeightSource<'_>) -> Result<Weight, BackendError> {
        let memory = source.memory.bytes();
        let bytes = memory
            .get(source.range.clone())
            .ok_or(BackendError::Shape {
                op: "load_weight",
                what: "tensor byte range",
                expected: source.range.end,
                found: memory.len(),
            })?;
        let slice = self
            .stream
            .clone_htod(bytes)
            .map_err(|e| self.oom_or(e, "load_weight", bytes.len()))?;
        let ptr = device_address(&slice, &self.stream);
        Ok(Weight::new(
            &source,
            Arc::new(DeviceWeight { bytes: slice, ptr }),
        ))
    }

    fn alloc_kv(
        &self,
        n_cells: usize,
        width: usize,
        head_dim: usize,
        ty: KvType,
        role: KvRole,
    ) -> Result<KvCache, BackendError> {
        // TurboQuant's kernels are twins of the CPU's scalar code in both modes; ggml's
        // blocks have no exact kernels.
        if self.exact_numerics() && !(matches!(ty, KvType::F32 | KvType::F16) || ty.is_turbo()) {
            return Err(crate::exact_kv_refused(ty));
        }
        if ty.is_turbo() {
            ops::turbo::check_shape(ty, width, head_dim)?;
            // The codebooks, uploaded before any pass so that a captured one can read them.
            self.turbo_tables()?;
        }
        let len = n_cells * Self::kv_row_bytes(ty, width, role)?;
        let bytes = self
            .stream
            .alloc_zeros::<u8>(len.max(1))
            .map_err(|e| self.oom_or(e, "alloc_kv", len))?;
        let ptr = device_address(&bytes, &self.stream);
        Ok(KvCache::new(
            n_cells,
            width,
            head_dim,
            ty,
            role,
            Box::new(DeviceKv {
                bytes,
                ptr,
                mean: None,
            }),
        ))
    }

    fn center_keys(&self, cache: &mut KvCache, mean: &[f32]) -> OpResult {
        ops::turbo::center_keys(self, cache, mean)
    }

    fn synchronize(&self) -> OpResult {
        self.stream
            .synchronize()
            .map_err(|e| self.driver_error("synchronize", e))
    }

    fn memory_available(&self) -> Option<usize> {
        self.context.mem_get_info().ok().map(|(free, _total)| free)
    }

    fn begin_step(&self, inputs: &StepInputs<'_>) -> OpResult {
        let pack = |spans| {
            step::pack(
                Some(inputs.tokens),
                Some(inputs.positions),
                Some(spans),
                Some(inputs.logit_rows),
            )
        };
        let packed = pack(inputs.spans);
        let window = inputs.window_spans.map(pack);
        // A pass (and a captured graph) never starts from a quantized input of the last one.
        self.note_write();
        let mut state = self.step.lock().expect("step lock");
        state
            .upload(&self.stream, &packed, window.as_ref())
            .map_err(|e| self.driver_error("begin_step", e))?;
        state.active = Some(HostIdentity::of(inputs));
        self.rows_alone
            .store(inputs.rows_alone, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }

    fn end_step(&self) -> OpResult {
        self.step.lock().expect("step lock").active = None;
        self.rows_alone
            .store(false, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }

    fn captures_steps(&self) -> bool {
        !self.exact_numerics()
            && !self.profiling()
            && std::env::var("RUNIT_CUDA_GRAPHS").map_or(true, |v| v != "0")
    }

    /// The window spans of a step are packed into a buffer of their own (`step.rs`).
    fn takes_window_spans(&self) -> bool {
        true
    }

    fn run_captured(&self, key: StepKey, body: &mut dyn FnMut() -> OpResult) -> OpResult {
        let graph_key = {
            let mut state = self.step.lock().expect("step lock");
            let full_key = state.graph_key(key);
            if let Some(graph) = state.graphs.get(&full_key) {
                graph
                    .0
                    .launch()
                    .map_err(|e| self.driver_error("graph replay", e))?;
                drop(state);
                return self.after_launch("graph replay");
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
        self.after_launch("graph replay")?;
        self.step
            .lock()
            .expect("step lock")
            .graphs
            .insert(graph_key, step::Graph(graph));
        Ok(())
    }
}

impl PrimitiveOps for CudaBackend {
    fn embedding(&self, table: &Weight, ids: &[u32], out: &mut Buffer) -> OpResult {
        ops::embedding::embedding(self, table, ids, out)
    }

    fn matmul(&self, weight: &Weight, x: &Buffer, tokens: usize, out: &mut Buffer) -> OpResult {
        if self.exact_numerics() {
            return exact::matmul::matmul(self, weight, x, tokens, out);
        }
        matmul::matmul(self, weight, x, tokens, out)
    }

    fn add_bias(&self, x: &mut Buffer, bias: &Weight, tokens: usize) -> OpResult {
        ops::elementwise::add_bias(self, x, bias, tokens)
    }

    fn rms_norm(&self, x: &Buffer, norm: RmsNorm<'_>, rows: usize, out: &mut Buffer) -> OpResult {
        let out_ptr = buffer_ptr("rms_norm", "out", out)?;
        check_len("rms_norm", "out", out, rows * norm.weight.row_len())?;
        ops::norm::rms_norm(self, x, norm, rows, out_ptr)
    }

    fn rms_norm_in_place(&self, x: &mut Buffer, norm: RmsNorm<'_>, rows: usize) -> OpResult {
        let ptr = buffer_ptr("rms_norm", "x", x)?;
        ops::norm::rms_norm(self, x, norm, rows, ptr)
    }

    fn rope(
        &self,
        x: &mut Buffer,
        positions: &[u32],
        params: &RopeParams,
        freq_factors: Option<&Weight>,
    ) -> OpResult {
        ops::rope::rope(self, x, positions, params, freq_factors)
    }

    fn scale(&self, x: &mut Buffer, factor: f32, len: usize) -> OpResult {
        ops::elementwise::scale(self, x, factor, len)
    }

    fn add(&self, dst: &mut Buffer, src: &Buffer, len: usize) -> OpResult {
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

    fn gated_activation(
        &self,
        activation: Activation,
        gate: &mut Buffer,
        up: &Buffer,
        len: usize,
    ) -> OpResult {
        ops::elementwise::gated_activation(self, activation, gate, up, len)
    }

    fn kv_write(&self, write: KvWrite<'_>) -> OpResult {
        ops::kv::kv_write(self, write)
    }

    fn attention(&self, attention: &Attention<'_>, out: &mut Buffer) -> OpResult {
        ops::attention::attention(self, attention, out)
    }

    fn gather_rows(&self, src: &Buffer, rows: &[u32], width: usize, out: &mut Buffer) -> OpResult {
        ops::rows::gather_rows(self, src, rows, width, out)
    }

    fn scatter_add_rows(&self, scatter: ScatterAddRows<'_>) -> OpResult {
        ops::rows::scatter_add_rows(self, scatter)
    }

    fn copy(&self, copy: BufferCopy<'_>) -> OpResult {
        let BufferCopy {
            src,
            src_offset,
            dst,
            dst_offset,
            len,
        } = copy;
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

    fn greedy_pick(
        &self,
        logits: &Buffer,
        rows: usize,
        width: usize,
        _log_probabilities: bool,
    ) -> Result<Vec<runit_backend::Pick>, BackendError> {
        // The device computes the log-probability with the argmax (the same pass over the
        // row); only the eight bytes per row cross to the host either way.
        ops::pick::greedy_pick(self, logits, rows, width)
    }

    /// Samples on the device (ops/sample.rs), handing the rows it does not sample to the
    /// host's `sample_row`; exact numerics sample on the host (the device's f64 `exp` may
    /// differ by an ulp).
    fn sample_pick(
        &self,
        logits: &mut Buffer,
        rows: usize,
        width: usize,
        sampling: &[runit_backend::RowSampling<'_>],
    ) -> Result<Vec<runit_backend::Sampled>, BackendError> {
        if !ops::sample::enabled() || self.exact_numerics() {
            return runit_backend::sample_pick_on_host(self, logits, rows, width, sampling);
        }
        ops::sample::sample_pick(self, logits, rows, width, sampling)
    }
}

/// The fused kernels, each switched off (its default primitive sequence) by
/// `RUNIT_CUDA_FUSED=0` or the exact mode; `attention_output` and `gated_ffn` keep the
/// default sequences.
impl FusedOps for CudaBackend {
    fn matmul_bias(
        &self,
        projection: Projection<'_>,
        x: &Buffer,
        tokens: usize,
        out: &mut Buffer,
    ) -> OpResult {
        if !self.fused_ops() {
            return unfused::matmul_bias(self, projection, x, tokens, out);
        }
        matmul::matmul_bias(self, projection, x, tokens, out)
    }

    fn matmul_qkv(
        &self,
        projections: [Projection<'_>; 3],
        x: &Buffer,
        tokens: usize,
        outs: [&mut Buffer; 3],
    ) -> OpResult {
        if !self.fused_ops() {
            return unfused::matmul_qkv(self, projections, x, tokens, outs);
        }
        matmul::matmul_qkv(self, projections, x, tokens, outs)
    }

    fn add_rms_norm(&self, op: AddRmsNorm<'_>) -> OpResult {
        if !self.fused_ops() {
            return unfused::add_rms_norm(self, op);
        }
        ops::fused::add_rms_norm(self, op)
    }

    fn rope_kv_write(&self, op: RopeKvWrite<'_>) -> OpResult {
        if !self.fused_ops() {
            return unfused::rope_kv_write(self, op);
        }
        ops::fused::rope_kv_write(self, op)
    }

    fn gated_ffn_hidden(&self, run: GatedFfnRun<'_>) -> OpResult {
        if !self.fused_ops() {
            return unfused::gated_ffn_hidden(self, run);
        }
        matmul::gated_ffn_hidden(self, run)
    }

    fn moe_ffn(&self, run: MoeFfnRun<'_>, out: &mut Buffer) -> OpResult {
        if !self.fused_ops() {
            return unfused::moe_ffn(self, run, out);
        }
        ops::moe::moe_ffn(self, run, out)
    }

    fn moe_ffn_on_device(&self, tokens: usize) -> bool {
        self.fused_ops() && tokens <= ops::moe::DEVICE_MAX_TOKENS
    }
}

impl CudaBackend {
    /// An allocation failure, reported as out of memory with what is free.
    pub(crate) fn oom_or(
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
