//! [`WgpuBackend`]: an adapter opened as a device and queue, the compute pipelines made on
//! first use, and the dispatch of one kernel.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use runit_backend::{BackendError, OpResult};
use wgpu::util::DeviceExt;

use crate::kernels::{self, KernelSource};

/// Why a backend could not be opened.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WgpuError {
    /// No adapter (no Vulkan, Metal or DX12 driver, or none with a GPU) was found.
    #[error("wgpu: no GPU adapter found (Vulkan, Metal or DX12); on Linux install a Vulkan driver (for a CPU one, Mesa's lavapipe: mesa-vulkan-drivers libvulkan1)")]
    NoAdapter,
    /// The ordinal names no adapter.
    #[error("wgpu: adapter {ordinal} does not exist ({count} found)")]
    NoSuchAdapter { ordinal: usize, count: usize },
    /// The adapter refused the device.
    #[error("wgpu: adapter {adapter} refused a device: {message}")]
    RequestDevice { adapter: String, message: String },
    /// Setting up the device failed.
    #[error("wgpu: {0}")]
    Setup(#[from] BackendError),
}

/// One adapter as `runit devices` would list it.
#[derive(Debug, Clone)]
pub struct AdapterSummary {
    pub ordinal: usize,
    pub name: String,
    /// Vulkan, Metal, DX12, ...
    pub api: String,
    /// Discrete, integrated, CPU, ...
    pub kind: String,
    pub driver: String,
    pub shader_f16: bool,
    pub subgroups: bool,
    /// Largest storage binding in bytes (tensors larger than this are split by rows).
    pub max_binding: u64,
}

impl std::fmt::Display for AdapterSummary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "wgpu:{} {} ({}, {}, driver {}), f16 {}, subgroups {}, max binding {} MiB",
            self.ordinal,
            self.name,
            self.api,
            self.kind,
            self.driver,
            self.shader_f16,
            self.subgroups,
            self.max_binding >> 20
        )
    }
}

fn instance() -> wgpu::Instance {
    let mut descriptor = wgpu::InstanceDescriptor::new_without_display_handle();
    descriptor.backends = wgpu::Backends::PRIMARY;
    wgpu::Instance::new(descriptor)
}

fn enumerate() -> Vec<wgpu::Adapter> {
    pollster::block_on(instance().enumerate_adapters(wgpu::Backends::PRIMARY))
}

fn summary(ordinal: usize, adapter: &wgpu::Adapter) -> AdapterSummary {
    let info = adapter.get_info();
    let features = adapter.features();
    AdapterSummary {
        ordinal,
        name: info.name,
        api: format!("{:?}", info.backend),
        kind: format!("{:?}", info.device_type),
        driver: format!("{} {}", info.driver, info.driver_info),
        shader_f16: features.contains(wgpu::Features::SHADER_F16),
        subgroups: features.contains(wgpu::Features::SUBGROUP),
        max_binding: adapter.limits().max_storage_buffer_binding_size,
    }
}

/// Every adapter wgpu finds, in the order `WgpuBackend::new` numbers them.
pub fn adapters() -> Vec<AdapterSummary> {
    enumerate()
        .iter()
        .enumerate()
        .map(|(ordinal, adapter)| summary(ordinal, adapter))
        .collect()
}

/// The portable GPU backend on one adapter.
pub struct WgpuBackend {
    pub(crate) ordinal: usize,
    pub(crate) adapter: AdapterSummary,
    pub(crate) device: wgpu::Device,
    pub(crate) queue: wgpu::Queue,
    /// Largest storage binding in bytes.
    pub(crate) max_binding: u64,
    /// Largest buffer in bytes.
    pub(crate) max_buffer: u64,
    pipelines: Mutex<HashMap<String, Arc<wgpu::ComputePipeline>>>,
    /// The first error the device reported outside an error scope (a lost device, a
    /// validation error in a submission), returned by the next transfer.
    errors: Arc<Mutex<Option<String>>>,
    /// ggml's GELU table (`runit_backend::gelu`), two f16 entries a word.
    pub(crate) gelu_table: wgpu::Buffer,
}

/// Workgroups of a one-dimensional kernel of `threads` invocations in groups of 64, folded
/// into two dimensions (at most 65 535 groups a dimension).
pub(crate) fn grid(threads: usize) -> [u32; 3] {
    rows_grid(threads.div_ceil(64))
}

/// `groups` workgroups folded into two dimensions: `[x, y, 1]` with `x * y >= groups`.
pub(crate) fn rows_grid(groups: usize) -> [u32; 3] {
    let x = groups.clamp(1, 65_535);
    [x as u32, groups.div_ceil(x).max(1) as u32, 1]
}

impl WgpuBackend {
    /// Opens adapter `ordinal` (see [`adapters`]) with shader f16 and subgroups when it has
    /// them and its own limits.
    pub fn new(ordinal: usize) -> Result<WgpuBackend, WgpuError> {
        let mut all = enumerate();
        if all.is_empty() {
            return Err(WgpuError::NoAdapter);
        }
        let count = all.len();
        if ordinal >= count {
            return Err(WgpuError::NoSuchAdapter { ordinal, count });
        }
        let adapter = all.swap_remove(ordinal);
        let summary = summary(ordinal, &adapter);
        let wanted = wgpu::Features::SHADER_F16 | wgpu::Features::SUBGROUP;
        let limits = adapter.limits();
        let descriptor = wgpu::DeviceDescriptor {
            label: Some("runit"),
            required_features: adapter.features() & wanted,
            required_limits: limits.clone(),
            ..Default::default()
        };
        let (device, queue) =
            pollster::block_on(adapter.request_device(&descriptor)).map_err(|error| {
                WgpuError::RequestDevice {
                    adapter: summary.name.clone(),
                    message: error.to_string(),
                }
            })?;
        let errors: Arc<Mutex<Option<String>>> = Arc::default();
        let sink = Arc::clone(&errors);
        device.on_uncaptured_error(Arc::new(move |error: wgpu::Error| {
            let mut slot = sink.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            slot.get_or_insert_with(|| error.to_string());
        }));
        let lost = Arc::clone(&errors);
        device.set_device_lost_callback(move |reason, message| {
            let mut slot = lost.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            slot.get_or_insert_with(|| format!("device lost ({reason:?}): {message}"));
        });
        let table = runit_backend::gelu::table();
        let gelu_table = device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
            label: Some("gelu table"),
            contents: bytemuck::cast_slice(table),
            usage: wgpu::BufferUsages::STORAGE,
        });
        Ok(WgpuBackend {
            ordinal,
            adapter: summary,
            device,
            queue,
            max_binding: limits.max_storage_buffer_binding_size,
            max_buffer: limits.max_buffer_size,
            pipelines: Mutex::default(),
            errors,
            gelu_table,
        })
    }

    /// The adapter this backend runs on.
    pub fn adapter(&self) -> &AdapterSummary {
        &self.adapter
    }

    pub(crate) fn device_error(
        &self,
        op: &'static str,
        message: impl Into<String>,
    ) -> BackendError {
        BackendError::Device {
            backend: format!("wgpu:{}", self.ordinal),
            op,
            message: message.into(),
        }
    }

    /// Fails with the first error the device reported since the last check.
    pub(crate) fn check_errors(&self, op: &'static str) -> OpResult {
        let mut slot = self.errors.lock().unwrap_or_else(|p| p.into_inner());
        match slot.take() {
            Some(message) => Err(self.device_error(op, message)),
            None => Ok(()),
        }
    }

    /// The pipeline of `kernel`, compiled on first use; a shader the device rejects is an
    /// error naming the kernel.
    fn pipeline(
        &self,
        op: &'static str,
        kernel: KernelSource,
    ) -> Result<Arc<wgpu::ComputePipeline>, BackendError> {
        let mut pipelines = self.pipelines.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(pipeline) = pipelines.get(&kernel.name) {
            return Ok(Arc::clone(pipeline));
        }
        let scope = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let module = self
            .device
            .create_shader_module(wgpu::ShaderModuleDescriptor {
                label: Some(&kernel.name),
                source: wgpu::ShaderSource::Wgsl(kernel.source.as_str().into()),
            });
        let pipeline = self
            .device
            .create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                label: Some(&kernel.name),
                layout: None,
                module: &module,
                entry_point: Some("main"),
                compilation_options: Default::default(),
                cache: None,
            });
        if let Some(error) = pollster::block_on(scope.pop()) {
            return Err(self.device_error(op, format!("kernel {}: {error}", kernel.name)));
        }
        let pipeline = Arc::new(pipeline);
        pipelines.insert(kernel.name, Arc::clone(&pipeline));
        Ok(pipeline)
    }

    /// A storage buffer holding `data` (at least one word, so that it can be bound).
    pub(crate) fn storage<T: bytemuck::Pod>(&self, label: &str, data: &[T]) -> wgpu::Buffer {
        let bytes: &[u8] = bytemuck::cast_slice(data);
        let mut padded = bytes.to_vec();
        padded.resize(bytes.len().next_multiple_of(4).max(4), 0);
        self.device
            .create_buffer_init(&wgpu::util::BufferInitDescriptor {
                label: Some(label),
                contents: &padded,
                usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC,
            })
    }

    /// Runs `kernel` over `groups` workgroups with `params` (words, f32 bit-cast) at binding
    /// 0 and `buffers` at bindings 1, 2, ...
    pub(crate) fn dispatch(
        &self,
        op: &'static str,
        kernel: KernelSource,
        params: &[u32],
        buffers: &[&wgpu::Buffer],
        groups: [u32; 3],
    ) -> OpResult {
        let pipeline = self.pipeline(op, kernel)?;
        let mut words = params.to_vec();
        words.resize(params.len().next_multiple_of(4).max(4), 0);
        let uniform = self
            .device
            .create_buffer_init(&wgpu::util::BufferInitDescriptor {
                label: Some("params"),
                contents: bytemuck::cast_slice(&words),
                usage: wgpu::BufferUsages::UNIFORM,
            });
        let mut entries = vec![wgpu::BindGroupEntry {
            binding: 0,
            resource: uniform.as_entire_binding(),
        }];
        for (index, buffer) in buffers.iter().enumerate() {
            entries.push(wgpu::BindGroupEntry {
                binding: index as u32 + 1,
                resource: buffer.as_entire_binding(),
            });
        }
        let bind_group = self.device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some(op),
            layout: &pipeline.get_bind_group_layout(0),
            entries: &entries,
        });
        let mut encoder = self
            .device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some(op) });
        {
            let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
                label: Some(op),
                timestamp_writes: None,
            });
            pass.set_pipeline(&pipeline);
            pass.set_bind_group(0, &bind_group, &[]);
            pass.dispatch_workgroups(groups[0], groups[1], groups[2]);
        }
        self.queue.submit([encoder.finish()]);
        Ok(())
    }

    /// Copies `bytes` bytes between buffers (offsets and length multiples of 4).
    pub(crate) fn copy_bytes(
        &self,
        src: &wgpu::Buffer,
        src_offset: u64,
        dst: &wgpu::Buffer,
        dst_offset: u64,
        bytes: u64,
    ) {
        if bytes == 0 {
            return;
        }
        let mut encoder = self
            .device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                label: Some("copy"),
            });
        encoder.copy_buffer_to_buffer(src, src_offset, dst, dst_offset, bytes);
        self.queue.submit([encoder.finish()]);
    }

    /// Waits for the queue; a device error reported meanwhile is returned.
    pub(crate) fn wait(&self, op: &'static str) -> OpResult {
        self.device
            .poll(wgpu::PollType::wait_indefinitely())
            .map_err(|error| self.device_error(op, error.to_string()))?;
        self.check_errors(op)
    }

    /// The first `bytes` bytes of `buffer`, read back to the host.
    pub(crate) fn read_bytes(
        &self,
        op: &'static str,
        buffer: &wgpu::Buffer,
        bytes: u64,
    ) -> Result<Vec<u8>, BackendError> {
        if bytes == 0 {
            return Ok(Vec::new());
        }
        let staging = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("download"),
            size: bytes,
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        self.copy_bytes(buffer, 0, &staging, 0, bytes);
        let (sender, receiver) = std::sync::mpsc::channel();
        staging.map_async(wgpu::MapMode::Read, .., move |result| {
            // The receiver waits below; a send can fail only if it is gone.
            let _ = sender.send(result);
        });
        self.wait(op)?;
        receiver
            .recv()
            .map_err(|_| self.device_error(op, "the buffer map never completed"))?
            .map_err(|error| self.device_error(op, format!("mapping the buffer: {error}")))?;
        let view = staging
            .get_mapped_range(..)
            .map_err(|error| self.device_error(op, format!("mapping the buffer: {error:?}")))?;
        let data = view.to_vec();
        drop(view);
        staging.unmap();
        Ok(data)
    }

    /// The compiled-on-demand kernel sources, for the pipeline cache.
    pub(crate) fn plain(name: &str) -> KernelSource {
        kernels::plain(name)
    }
}
