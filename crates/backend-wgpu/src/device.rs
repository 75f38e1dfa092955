//! The [`Device`] half of the contract: activation buffers, weights (packed GGUF bytes in
//! storage buffers, split by rows where a tensor is larger than one binding) and KV caches.

use runit_backend::{
    BackendError, Buffer, Device, KvCache, KvRole, KvType, Op, OpResult, StepInputs, Weight,
    WeightRole, WeightSource,
};
use runit_quant::GgmlType;

use crate::kernels;
use crate::WgpuBackend;

/// An f32 activation buffer (at least one word, so that it can always be bound).
pub(crate) struct GpuBuffer(pub wgpu::Buffer);

/// Rows `first_row .. first_row + rows` of a weight in one storage buffer.
pub(crate) struct Chunk {
    pub buffer: wgpu::Buffer,
    pub first_row: usize,
    pub rows: usize,
}

/// A weight: its rows in chunks of at most one binding, and for an F32 vector its values
/// on the host too (RoPE frequency factors are read there, with the angles).
pub(crate) struct GpuWeight {
    pub chunks: Vec<Chunk>,
    pub host: Option<Vec<f32>>,
}

/// A KV cache in the word layout of its type (`shaders/attention_cache.wgsl`).
pub(crate) struct GpuKv {
    pub buffer: wgpu::Buffer,
}

pub(crate) fn buffer<'a>(
    b: &'a Buffer,
    op: &'static str,
    what: &'static str,
) -> Result<&'a wgpu::Buffer, BackendError> {
    b.payload::<GpuBuffer>()
        .map(|buffer| &buffer.0)
        .ok_or(BackendError::ForeignBuffer { op, what })
}

pub(crate) fn weight<'a>(
    w: &'a Weight,
    op: &'static str,
    what: &'static str,
) -> Result<&'a GpuWeight, BackendError> {
    w.payload::<GpuWeight>()
        .ok_or(BackendError::ForeignBuffer { op, what })
}

pub(crate) fn kv<'a>(
    cache: &'a KvCache,
    op: &'static str,
    what: &'static str,
) -> Result<&'a GpuKv, BackendError> {
    cache
        .payload::<GpuKv>()
        .ok_or(BackendError::ForeignBuffer { op, what })
}

impl WgpuBackend {
    pub(crate) fn unsupported(&self, op: &'static str, w: &Weight) -> BackendError {
        BackendError::Unsupported {
            backend: self.name(),
            op,
            ty: w.ty,
            tensor: w.name.clone(),
        }
    }

    /// An F32 vector weight's one buffer (norm weights and biases), or an error naming
    /// what this backend does not read.
    pub(crate) fn f32_vector<'a>(
        &self,
        w: &'a Weight,
        op: &'static str,
    ) -> Result<&'a wgpu::Buffer, BackendError> {
        let gpu = weight(w, op, "weight")?;
        if w.ty != GgmlType::F32 || gpu.chunks.len() != 1 || w.byte_offset != 0 {
            return Err(self.unsupported(op, w));
        }
        Ok(&gpu.chunks[0].buffer)
    }

    pub(crate) fn new_buffer(
        &self,
        op: &'static str,
        bytes: u64,
    ) -> Result<wgpu::Buffer, BackendError> {
        let bytes = bytes.next_multiple_of(4).max(4);
        // A buffer may outgrow one binding (the logits of a long batch over a large
        // vocabulary): the ops that meet one bind ranges of it (`dispatch_ranges`).
        if bytes > self.max_buffer {
            return Err(self.device_error(
                op,
                format!(
                    "a buffer of {bytes} bytes exceeds the adapter's buffer size limit of {} \
                     bytes",
                    self.max_buffer
                ),
            ));
        }
        let scope = self.device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
        let buffer = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some(op),
            size: bytes,
            usage: wgpu::BufferUsages::STORAGE
                | wgpu::BufferUsages::COPY_SRC
                | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        match pollster::block_on(scope.pop()) {
            Some(error) => Err(self.device_error(op, error.to_string())),
            None => Ok(buffer),
        }
    }
}

impl Device for WgpuBackend {
    fn name(&self) -> String {
        format!("wgpu:{}", self.ordinal)
    }

    fn supports(&self, op: Op, ty: GgmlType) -> bool {
        match op {
            Op::Embedding | Op::MatMul => kernels::weight_suffix(ty).is_some(),
            _ => false,
        }
    }

    fn alloc(&self, len: usize) -> Result<Buffer, BackendError> {
        let buffer = self.new_buffer("alloc", len as u64 * 4)?;
        Ok(Buffer::new(len, Box::new(GpuBuffer(buffer))))
    }

    fn upload(&self, target: &mut Buffer, data: &[f32]) -> OpResult {
        at_least("upload", "buffer elements", data.len(), target.len())?;
        if !data.is_empty() {
            let target = buffer(target, "upload", "buffer")?;
            // Queue writes land before the next submit: earlier recorded commands go first.
            self.flush();
            self.epoch
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            self.queue
                .write_buffer(target, 0, bytemuck::cast_slice(data));
        }
        Ok(())
    }

    fn download(&self, source: &Buffer, out: &mut [f32]) -> OpResult {
        at_least("download", "buffer elements", out.len(), source.len())?;
        let source = buffer(source, "download", "buffer")?;
        let bytes = self.read_bytes("download", source, out.len() as u64 * 4)?;
        out.copy_from_slice(bytemuck::cast_slice(&bytes));
        Ok(())
    }

    fn load_weight(&self, source: WeightSource<'_>) -> Result<Weight, BackendError> {
        const OP: &str = "load_weight";
        let (ty, shape) = (source.ty, source.shape);
        let row_len = shape.first().copied().unwrap_or(0);
        let row_bytes =
            ty.row_bytes(row_len as u64)
                .filter(|_| row_len > 0)
                .ok_or(BackendError::Shape {
                    op: OP,
                    what: "row length (whole blocks of the type)",
                    expected: ty.block_size(),
                    found: row_len,
                })? as usize;
        let rows: usize = shape.iter().skip(1).product();
        let range = source.range.clone();
        if range.len() != rows * row_bytes {
            return Err(BackendError::Shape {
                op: OP,
                what: "tensor bytes",
                expected: rows * row_bytes,
                found: range.len(),
            });
        }
        let memory = source.memory.bytes();
        at_least(OP, "host memory bytes (range end)", range.end, memory.len())?;
        let bytes = &memory[range];
        // Each chunk ends with a spare word (below).
        let room = self.max_binding.saturating_sub(8) as usize;
        let rows_per_chunk = (room / row_bytes).max(1);
        if row_bytes > room {
            return Err(self.device_error(
                OP,
                format!(
                    "tensor {}: a row of {row_bytes} bytes exceeds the adapter's storage binding limit of {} bytes",
                    source.name, self.max_binding
                ),
            ));
        }
        let mut chunks = Vec::new();
        let mut first_row = 0;
        while first_row < rows {
            let count = rows_per_chunk.min(rows - first_row);
            let data = &bytes[first_row * row_bytes..(first_row + count) * row_bytes];
            // A spare word past the data: `word_at` (shaders/bytes.wgsl) reads the word after
            // the one it needs.
            let padded_len = data.len().next_multiple_of(4) + 4;
            let buffer = self.new_buffer(OP, padded_len as u64)?;
            let mut padded = data.to_vec();
            padded.resize(padded_len, 0);
            self.queue.write_buffer(&buffer, 0, &padded);
            chunks.push(Chunk {
                buffer,
                first_row,
                rows: count,
            });
            first_row += count;
        }
        let host = (ty == GgmlType::F32 && source.role == WeightRole::Vector)
            .then(|| bytemuck::pod_collect_to_vec::<u8, f32>(bytes));
        Ok(Weight::new(
            &source,
            std::sync::Arc::new(GpuWeight { chunks, host }),
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
        let unsupported = |what: String| BackendError::UnsupportedKv {
            backend: self.name(),
            ty,
            what,
            supported: "f16, f32, q8_0, q4_0",
        };
        // Bytes of `width` values.
        let row_bytes = match ty {
            KvType::F32 => Some(width * 4),
            KvType::F16 if width.is_multiple_of(2) => Some(width * 2),
            KvType::Q8_0 if width.is_multiple_of(32) => Some(width / 32 * 36),
            KvType::Q4_0 if width.is_multiple_of(32) => Some(width / 32 * 20),
            KvType::F16 | KvType::Q8_0 | KvType::Q4_0 => None,
            KvType::Tq4 | KvType::Tq3 => {
                return Err(unsupported(
                    "this backend (TurboQuant is CPU-only)".to_string(),
                ))
            }
        };
        let row_bytes = row_bytes.ok_or_else(|| unsupported(format!("rows of {width} values")))?;
        if let Err(error) = ty.check_head_dim(head_dim) {
            return Err(unsupported(error.to_string()));
        }
        if let Some(n) = runit_backend::hadamard::llama_rotation(ty, role, head_dim) {
            if n > 256 {
                return Err(unsupported(format!(
                    "heads of {head_dim} (rotation chunks of {n}; at most 256)"
                )));
            }
        }
        if !width.is_multiple_of(head_dim) {
            return Err(BackendError::Shape {
                op: "alloc_kv",
                what: "width (a multiple of head_dim)",
                expected: head_dim,
                found: width,
            });
        }
        let bytes = (n_cells as u64).saturating_mul(row_bytes as u64);
        if bytes > self.max_binding {
            // Attention binds a layer's cache whole.
            return Err(self.device_error(
                "alloc_kv",
                format!(
                    "a cache of {n_cells} cells × {row_bytes} bytes ({bytes} bytes) exceeds the \
                     adapter's storage binding limit of {} bytes: use a smaller context or a \
                     smaller cache type",
                    self.max_binding
                ),
            ));
        }
        let buffer = self.new_buffer("alloc_kv", bytes)?;
        Ok(KvCache::new(
            n_cells,
            width,
            head_dim,
            ty,
            role,
            Box::new(GpuKv { buffer }),
        ))
    }

    fn synchronize(&self) -> OpResult {
        self.wait("synchronize")
    }

    fn begin_step(&self, inputs: &StepInputs<'_>) -> OpResult {
        self.rows_alone
            .store(inputs.rows_alone, std::sync::atomic::Ordering::Relaxed);
        // A decode step: one row a sequence.
        if !inputs.tokens.is_empty() && inputs.tokens.len() == inputs.spans.len() {
            let counts = self.counts();
            let mut clock = self.step_clock.lock().unwrap_or_else(|p| p.into_inner());
            clock.begin(counts);
        }
        Ok(())
    }

    fn end_step(&self) -> OpResult {
        self.rows_alone
            .store(false, std::sync::atomic::Ordering::Relaxed);
        let mut clock = self.step_clock.lock().unwrap_or_else(|p| p.into_inner());
        clock.end();
        Ok(())
    }
}

pub(crate) use runit_backend::at_least;
