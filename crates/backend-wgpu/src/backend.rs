//! [`WgpuBackend`]: an adapter opened as a device and queue, the compute pipelines made on
//! first use, and the dispatch of one kernel.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use runit_backend::{BackendError, OpResult};
use wgpu::util::DeviceExt;

use crate::batch::{self, Pending};
use crate::bind_groups::FxBuild;
use crate::clock::{StepClock, StepCosts};
use crate::kernels::{self, Dot4, KernelSource, Reduction};

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
    /// The alignment of a storage binding's offset in bytes.
    pub(crate) binding_alignment: u64,
    pipelines: Mutex<HashMap<KernelSource, Arc<wgpu::ComputePipeline>, FxBuild>>,
    /// The first error the device reported outside an error scope (a lost device, a
    /// validation error in a submission), returned by the next transfer.
    errors: Arc<Mutex<Option<String>>>,
    /// ggml's GELU table (`runit_backend::gelu`), two f16 entries a word.
    pub(crate) gelu_table: wgpu::Buffer,
    /// How the matrix-vector kernels sum a row.
    pub(crate) reduction: Reduction,
    /// Whether matmul runs the generic value-by-value kernel for every type.
    pub(crate) generic_matmul: bool,
    /// Whether matmul of the types with an exact kernel (Q8_0, Q5_0) runs it: the CPU's
    /// arithmetic, bit for bit (`RUNIT_WGPU_EXACT=1`, [`WgpuBackend::with_exact_matmul`]).
    pub(crate) exact_matmul: bool,
    /// Whether attention spans of fewer than 64 rows take the split path (attention.rs)
    /// rather than ggml's one-chunk path where matmul is not exact: the split path is many
    /// workgroups a head instead of one, the one-chunk path repeats ggml's f16 rounding of
    /// the value accumulator at every key (synthetic goldens with the fast kernels on
    /// lavapipe, session 36: 15 of 72 prompts fully matched with the split path, 30 with
    /// the one-chunk path). `RUNIT_WGPU_SPLIT_ATTENTION=0` turns it off, as does
    /// [`WgpuBackend::without_split_attention`].
    pub(crate) split_attention: bool,
    /// Decode attention whose keys are one chunk a query takes one dispatch
    /// (attention_split_final.wgsl) instead of the first pass and the merge
    /// (`RUNIT_WGPU_SPLIT_FINAL=0` keeps the two, for measuring).
    pub(crate) split_final: bool,
    /// Whether the Q/K/V dispatch adds Qwen2's three biases in its epilogue
    /// (`kernels::matvec_parts`' `biased`) instead of a dispatch of its own (`add_bias3`):
    /// `RUNIT_WGPU_BIAS_EPILOGUE=0` turns it off.
    pub(crate) bias_epilogue: bool,
    /// The Q/K/V biases joined into one buffer, by the bias buffers (fused.rs).
    pub(crate) joined_biases: Mutex<Vec<([wgpu::Buffer; 3], wgpu::Buffer)>>,
    /// Whether the norms of rows of at most 8,192 values hold each row in registers
    /// (rms_norm.wgsl's `normalize_held`: every load of a row in flight at once) rather than
    /// loop over it (`normalize_row`, a load waited on at every step: 40 µs a 3,584-value row
    /// on an H100, session 36). `RUNIT_WGPU_HELD_NORM=0` turns it off, as does
    /// [`WgpuBackend::without_held_norms`].
    pub(crate) held_norms: bool,
    /// The widest rows whose norm a matrix-vector dispatch takes in its prologue
    /// ([`WgpuBackend::prologue_fits`]), 0 for none: `RUNIT_WGPU_NORM_PROLOGUE_MAX`, by
    /// default [`NORM_PROLOGUE_MAX`].
    pub(crate) norm_prologue_max: usize,
    /// The widest FFN rows whose gated activation the down projection's dispatch makes in
    /// its prologue (`matvec_gated.wgsl`), 0 for none: `RUNIT_WGPU_GATED_PROLOGUE_MAX`, by
    /// default [`GATED_PROLOGUE_MAX`].
    pub(crate) gated_prologue_max: usize,
    /// Whether one token's Q/K/V dispatch takes RoPE and the f16/f32 cache write in its
    /// epilogue (`matvec_rope.wgsl`): `RUNIT_WGPU_ROPE_EPILOGUE=1`, off until a GPU has
    /// measured it ([`WgpuBackend::with_rope_epilogue`]).
    pub(crate) rope_epilogue: bool,
    /// Commands in the first batch submitted early after a flush, or 0 where batches are
    /// submitted only when the host needs their results or they are full (batch.rs,
    /// `submits_early`): by default 16 on every adapter but a CPU one (on lavapipe the
    /// device's threads would compete with the recording for the cores).
    /// `RUNIT_WGPU_EARLY_SUBMIT=N` sets it (0: off), as does [`WgpuBackend::with_early_submit`].
    pub(crate) early_submit: usize,
    /// Commands recorded since the last submit (batch.rs).
    pub(crate) pending: Mutex<Pending>,
    /// Every dispatch's parameters (a slot each) and tables, written once per batch
    /// (batch.rs).
    pub(crate) ring: wgpu::Buffer,
    /// Bytes of a parameter slot (at least the adapter's uniform offset alignment).
    pub(crate) params_slot: u64,
    /// Bind groups kept for reuse (batch.rs), when `reuse_bind_groups`.
    pub(crate) bind_groups: Mutex<crate::bind_groups::BindGroups>,
    /// Whether the fused ops run their kernels (fused.rs) rather than the primitive sequences
    /// ([`WgpuBackend::without_fused_ops`]).
    pub(crate) fused_ops: bool,
    /// Whether matrix-vector products of several weights of one input (Q, K and V; gate and
    /// up) run as one dispatch (`kernels::matvec_parts`): by default on every adapter but a
    /// CPU one. On lavapipe the kernel's choice of weight at every load costs more device time
    /// than the dispatches save host time (tg16 of SmolLM2 Q8_0: 1.32 and 1.39 tok/s with it,
    /// 1.60 and 1.74 without); on a GPU the choice is one uniform branch.
    /// `RUNIT_WGPU_MATVEC_PARTS=1` or `0` overrides the default, as does
    /// [`WgpuBackend::with_matvec_parts`].
    pub(crate) matvec_parts: bool,
    /// Whether dispatches reuse bind groups ([`WgpuBackend::without_bind_group_reuse`]).
    pub(crate) reuse_bind_groups: bool,
    /// Whether matrix-vector products of the types in `kernels::MATVEC_INT8_TYPES` read
    /// their activations as int8 with a scale a block (`matvec_int8.wgsl`: a quarter of the
    /// f32 activations' cache traffic, four products an instruction), and with which dot
    /// product; `None`: f32 activations (`matvec_dot.wgsl`). `RUNIT_WGPU_MATVEC_INT8=0` turns
    /// it off, `=plain` takes the plain arithmetic's dot product, as does
    /// [`WgpuBackend::with_matvec_int8`].
    pub(crate) matvec_int8: Option<Dot4>,
    /// Whether the matrix-vector kernels of Q6_K weights stage each workgroup's rows through
    /// workgroup memory, read in consecutive words by all its invocations, rather than read
    /// each piece's runs where they lie (`matvec_staged.wgsl`: its 210-byte blocks start on
    /// 2-byte boundaries). Off by default: on an H100 through Vulkan the staging made the 7B
    /// Q4_K_M decode 23% slower (131 against 170 tok/s, session 41); `RUNIT_WGPU_Q6K_ALIGNED=1`
    /// turns it on, as does [`WgpuBackend::with_q6_k_staged`].
    pub(crate) q6_k_staged: bool,
    /// The staging buffer of the last read-back, reused by the next (`read_bytes`).
    staging: Mutex<Option<wgpu::Buffer>>,
    /// A matmul's activations rounded as the CPU sees them, grown as needed (matmul.rs).
    pub(crate) rounded_x: Mutex<crate::rounding::RoundedX>,
    /// The split attention's chunk records, grown as needed (attention.rs).
    pub(crate) attention_partials: Mutex<Option<wgpu::Buffer>>,
    /// Counts recorded commands and uploads: data may have changed when it moves.
    pub(crate) epoch: AtomicU64,
    /// Whether the pass under way computes every row as if alone (`StepInputs::rows_alone`).
    pub(crate) rows_alone: AtomicBool,
    /// Dispatches recorded and submits made since the backend opened.
    pub(crate) counts: Counts,
    /// The host's cost of the decode steps (clock.rs).
    pub(crate) step_clock: Mutex<StepClock>,
    /// Whether the CPU time of recording and submitting is measured (`RUNIT_WGPU_COUNTS=1`).
    pub(crate) timed: bool,
    /// Whether WGSL's `fma` rounds once on this adapter ([`WgpuBackend::fma_is_fused`]).
    pub(crate) fused_fma: bool,
    /// The norm kernels' invocations a workgroup (rms_norm.wgsl's THREADS): 1,024 where the
    /// adapter grants that many and their workgroup memory ([`norm_threads`]) and is not a
    /// CPU adapter, else 256; `RUNIT_WGPU_NORM_THREADS=256` or `=1024` (where granted) or
    /// [`WgpuBackend::with_norm_threads`] sets it.
    pub(crate) norm_threads: u32,
    /// Rows of at most this many values take the norm kernels at 256 invocations even where
    /// [`WgpuBackend::norm_threads`] is more ([`WgpuBackend::norm_kernel`]): [`NARROW_NORM_ROWS`]
    /// by default, 0 where `RUNIT_WGPU_NORM_THREADS` or [`WgpuBackend::with_norm_threads`] sets
    /// the count for every row.
    pub(crate) narrow_norm_rows: usize,
    /// Whether the norms' sums and the roundings' block reductions run on subgroups
    /// (`norm_sum_subgroup.wgsl`, `coop_reduce_subgroup.wgsl`: a barrier each) rather than in
    /// workgroup memory (a barrier at each level of a tree): only where the matrix-vector
    /// kernels take subgroups ([`Reduction::Subgroup`]), with `RUNIT_WGPU_SUBGROUP_REDUCE=1` or
    /// [`WgpuBackend::with_subgroup_reductions`]; off by default until measured on a GPU.
    pub(crate) subgroup_reductions: bool,
    /// `RUNIT_WGPU_PROFILE=1`: device time per kernel (profile.rs).
    pub(crate) profiler: Option<crate::profile::Profiler>,
}

/// The widest rows whose norm a matrix-vector dispatch takes in its prologue by default: none.
/// On an H100's Vulkan driver (session 49, 0.5B Q8_0) the prologues made the decode step 12%
/// slower although it recorded 149 dispatches instead of 222: every workgroup waits through
/// the norm's chain of barriers and exact divisions, which a dispatch of its own paid once
/// (docs/perf-wgpu.md). `RUNIT_WGPU_NORM_PROLOGUE_MAX=2048` turns them on.
pub const NORM_PROLOGUE_MAX: usize = 0;

/// The widest FFN rows whose gated activation the down projection makes in its prologue by
/// default: none (each workgroup makes the whole row, serially a block of 32 an invocation:
/// another 15% slower on the H100 above). `RUNIT_WGPU_GATED_PROLOGUE_MAX=8960` turns it on.
pub const GATED_PROLOGUE_MAX: usize = 0;

/// Commands in the first batch a GPU adapter submits early after a flush (batch.rs).
const EARLY_SUBMIT: usize = 16;

/// The kernel of [`WgpuBackend::fma_is_fused`].
const FMA_PROBE: &str = "
struct Params { unused: u32, _pad0: u32, _pad1: u32, _pad2: u32 }
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> inputs: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;
@compute @workgroup_size(1)
fn main() {
    // `p` is bound by every dispatch; adding its zero keeps it in the layout.
    out[0] = fma(inputs[0], inputs[1], inputs[2]) + f32(p.unused);
}
";

/// The parameters, bindings and entry point of the probes over many inputs (`expf_on_device`,
/// `rounded_on_device`): item `i` of `p.count` is `probe(i)`, which the probe's source defines.
const PROBE_ENTRY: &str = "
struct Params { count: u32, zero: u32, shift: i32, _pad0: u32 }
@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> inputs: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;
@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let i = gid.x + gid.y * groups.x * 64u;
    if i < p.count {
        probe(i);
    }
}
";

/// The probe of [`WgpuBackend::expf_on_device`]: `expf.wgsl` on each input.
const EXPF_PROBE: &str = "
fn probe(i: u32) {
    out[i] = expf(inputs[i]);
}
";

/// The probe of [`WgpuBackend::rounded_on_device`]: `div_from` and `sqrt_from` (precise.wgsl)
/// of each pair, started `p.shift` ulps off the driver's quotient and root.
const ROUNDED_PROBE: &str = "
fn probe(i: u32) {
    let a = inputs[2u * i];
    let b = inputs[2u * i + 1u];
    let q = bitcast<f32>(bitcast<i32>(opaque(a / b)) + p.shift);
    out[2u * i] = div_from(q, a, b);
    let x = abs(a);
    let s = bitcast<f32>(bitcast<i32>(opaque(sqrt(x))) + p.shift);
    out[2u * i + 1u] = sqrt_from(s, x);
}
";

/// The probe of [`WgpuBackend::f16_rounded_on_device`]: `f16_bits_rn` (precise.wgsl) and the
/// driver's own `pack2x16float` of each input.
const F16_PROBE: &str = "
fn probe(i: u32) {
    out[2u * i] = bitcast<f32>(f16_bits_rn(inputs[i]));
    out[2u * i + 1u] = bitcast<f32>(pack2x16float(vec2<f32>(inputs[i], 0.0)) & 0xffffu);
}
";

/// Whether `RUNIT_WGPU_COUNTS=1` asks for the host's costs.
fn counting() -> bool {
    std::env::var("RUNIT_WGPU_COUNTS").is_ok_and(|v| v == "1")
}

/// How much work the backend has handed the device.
#[derive(Default)]
pub(crate) struct Counts {
    pub dispatches: AtomicU64,
    pub submits: AtomicU64,
    pub bind_groups_made: AtomicU64,
    pub pipelines_made: AtomicU64,
    pub recording_ns: AtomicU64,
    pub submitting_ns: AtomicU64,
}

/// Kernel dispatches recorded and command submits made by one backend, and the host's time
/// in them, for measuring host overhead (`RUNIT_WGPU_COUNTS=1` prints them when the backend
/// is dropped).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DispatchCounts {
    pub dispatches: u64,
    pub submits: u64,
    /// Bind groups made; the other dispatches reused one.
    pub bind_groups_made: u64,
    /// Pipelines compiled.
    pub pipelines_made: u64,
    /// The recording thread's CPU time inside the recording of dispatches and copies, in
    /// nanoseconds (measured only under `RUNIT_WGPU_COUNTS=1`).
    pub recording_ns: u64,
    /// The recording thread's CPU time inside submits, in nanoseconds (likewise).
    pub submitting_ns: u64,
}

/// Workgroups of a one-dimensional kernel of `threads` invocations in groups of 64, folded
/// into two dimensions (at most 65 535 groups a dimension).
pub(crate) fn grid(threads: usize) -> [u32; 3] {
    rows_grid(threads.div_ceil(64))
}

/// The norm kernels' invocations a workgroup on every adapter (WebGPU's least limit).
pub(crate) const PORTABLE_NORM_THREADS: u32 = 256;

/// The widest rows the norms take at [`PORTABLE_NORM_THREADS`] invocations where the adapter
/// grants more (a vec4 an invocation at most): on an H100 (NVIDIA Vulkan, session 44) the
/// 0.5B's rows of 896 values decoded 4% faster at 256 invocations than at 1,024 (475.9 /
/// 476.7 against 458.7 / 456.6 tok/s), where the 7B's rows of 3,584 took the add + norm +
/// rounding in 26.2 µs at 1,024 against 52.9 at 256 (session 42).
pub(crate) const NARROW_NORM_ROWS: usize = 1024;

/// The norm kernels' invocations a workgroup on an adapter of `limits`: 1,024 where it
/// grants that many and the workgroup memory they take (the add + norm + rounding kernel's
/// float-float partials and four quantize_coop.wgsl arrays, 24 bytes an invocation), else
/// [`PORTABLE_NORM_THREADS`]. A row of up to 4,096 values is then a vec4 an invocation: one
/// pass of adds and one rounding call, where 256 invocations took four of each for 3,584.
fn norm_threads(limits: &wgpu::Limits) -> u32 {
    const WIDE: u32 = 1024;
    let fits = limits.max_compute_invocations_per_workgroup >= WIDE
        && limits.max_compute_workgroup_size_x >= WIDE
        && limits.max_compute_workgroup_storage_size >= 24 * WIDE;
    if fits {
        WIDE
    } else {
        PORTABLE_NORM_THREADS
    }
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
        let info = adapter.get_info();
        // Subgroup sums are taken where subgroups hold at most 32 invocations, as on the
        // adapters the subgroup path was checked on (reduce_subgroup.wgsl divides a workgroup
        // of 128 into its subgroups).
        let reduction = if summary.subgroups && (1..=32).contains(&info.subgroup_max_size) {
            Reduction::Subgroup
        } else {
            Reduction::Shared
        };
        let profiling = crate::profile::wanted();
        let mut wanted = wgpu::Features::SHADER_F16 | wgpu::Features::SUBGROUP;
        if profiling {
            wanted |= wgpu::Features::TIMESTAMP_QUERY;
        }
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
        let profiler = match profiling {
            true if device.features().contains(wgpu::Features::TIMESTAMP_QUERY) => {
                Some(crate::profile::Profiler::new(&device, &queue))
            }
            true => {
                eprintln!(
                    "RUNIT_WGPU_PROFILE: adapter {} has no timestamp queries; not profiling",
                    summary.name
                );
                None
            }
            false => None,
        };
        let params_slot = u64::from(limits.min_uniform_buffer_offset_alignment).max(256);
        let ring = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("parameter and table ring"),
            size: crate::batch::ring_bytes(params_slot),
            usage: wgpu::BufferUsages::UNIFORM
                | wgpu::BufferUsages::STORAGE
                | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let table = runit_backend::gelu::table();
        let gelu_table = device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
            label: Some("gelu table"),
            contents: bytemuck::cast_slice(table),
            usage: wgpu::BufferUsages::STORAGE,
        });
        let norm_env = std::env::var("RUNIT_WGPU_NORM_THREADS").ok();
        let mut backend = WgpuBackend {
            ordinal,
            adapter: summary,
            device,
            queue,
            max_binding: limits.max_storage_buffer_binding_size,
            max_buffer: limits.max_buffer_size,
            binding_alignment: u64::from(limits.min_storage_buffer_offset_alignment),
            pipelines: Mutex::default(),
            errors,
            gelu_table,
            reduction,
            generic_matmul: false,
            exact_matmul: std::env::var("RUNIT_WGPU_EXACT").is_ok_and(|v| v == "1"),
            split_attention: !std::env::var("RUNIT_WGPU_SPLIT_ATTENTION").is_ok_and(|v| v == "0"),
            split_final: !std::env::var("RUNIT_WGPU_SPLIT_FINAL").is_ok_and(|v| v == "0"),
            held_norms: !std::env::var("RUNIT_WGPU_HELD_NORM").is_ok_and(|v| v == "0"),
            norm_prologue_max: match std::env::var("RUNIT_WGPU_NORM_PROLOGUE_MAX")
                .map(|v| v.parse())
            {
                Ok(Ok(max)) => max,
                _ => NORM_PROLOGUE_MAX,
            },
            rope_epilogue: std::env::var("RUNIT_WGPU_ROPE_EPILOGUE").is_ok_and(|v| v == "1"),
            gated_prologue_max: match std::env::var("RUNIT_WGPU_GATED_PROLOGUE_MAX")
                .map(|v| v.parse())
            {
                Ok(Ok(max)) => max,
                _ => GATED_PROLOGUE_MAX,
            },
            bias_epilogue: !std::env::var("RUNIT_WGPU_BIAS_EPILOGUE").is_ok_and(|v| v == "0"),
            joined_biases: Mutex::default(),
            early_submit: match std::env::var("RUNIT_WGPU_EARLY_SUBMIT").map(|v| v.parse()) {
                Ok(Ok(first)) => first,
                _ if info.device_type == wgpu::DeviceType::Cpu => 0,
                _ => EARLY_SUBMIT,
            },
            pending: Mutex::default(),
            ring,
            params_slot,
            bind_groups: Mutex::default(),
            fused_ops: !std::env::var("RUNIT_WGPU_FUSED").is_ok_and(|v| v == "0"),
            matvec_parts: match std::env::var("RUNIT_WGPU_MATVEC_PARTS").as_deref() {
                Ok("1") => true,
                Ok("0") => false,
                _ => info.device_type != wgpu::DeviceType::Cpu,
            },
            reuse_bind_groups: !std::env::var("RUNIT_WGPU_BIND_REUSE").is_ok_and(|v| v == "0"),
            matvec_int8: match std::env::var("RUNIT_WGPU_MATVEC_INT8").as_deref() {
                Ok("0") => None,
                Ok("plain") => Some(Dot4::Plain),
                _ => Some(Dot4::Builtin),
            },
            q6_k_staged: std::env::var("RUNIT_WGPU_Q6K_ALIGNED").is_ok_and(|v| v == "1"),
            rounded_x: Mutex::default(),
            attention_partials: Mutex::default(),
            epoch: AtomicU64::new(0),
            rows_alone: AtomicBool::new(false),
            staging: Mutex::default(),
            counts: Counts::default(),
            step_clock: Mutex::default(),
            timed: counting(),
            fused_fma: false,
            // A count set for the norms holds for every row.
            narrow_norm_rows: match norm_env {
                Some(_) => 0,
                None => NARROW_NORM_ROWS,
            },
            norm_threads: match norm_env.as_deref() {
                Some("256") => PORTABLE_NORM_THREADS,
                Some("1024") => norm_threads(&limits),
                // lavapipe keeps each invocation's live values in memory across barriers:
                // 1,024 invocations made its add + norm + rounding of 3,584 values about
                // twice as slow as 256.
                _ if info.device_type == wgpu::DeviceType::Cpu => PORTABLE_NORM_THREADS,
                _ => norm_threads(&limits),
            },
            profiler,
            subgroup_reductions: false,
        };
        backend.subgroup_reductions = backend.reduction == Reduction::Subgroup
            && std::env::var("RUNIT_WGPU_SUBGROUP_REDUCE").is_ok_and(|v| v == "1");
        backend.fused_fma = backend.fma_is_fused()?;
        Ok(backend)
    }

    /// Whether the adapter's WGSL `fma` rounds once: `fma(1 + 2^-12, 1 + 2^-12,
    /// -(1 + 2^-11))` is 2^-24 fused and 0 when the product is rounded first (lavapipe).
    /// Where it rounds once, `fma_exact` (precise.wgsl) is the builtin.
    fn fma_is_fused(&self) -> Result<bool, BackendError> {
        const OP: &str = "fma probe";
        let a = 1.0f32 + 2f32.powi(-12);
        let inputs = [a, a, -(1.0 + 2f32.powi(-11))];
        let out = self.new_buffer(OP, 4)?;
        let kernel = KernelSource::Probe("fma_probe", &[FMA_PROBE]);
        let bindings = [batch::table(&inputs), (&out).into()];
        self.dispatch_ranges(OP, kernel, &[0], &bindings, [1, 1, 1])?;
        let bytes = self.read_bytes(OP, &out, 4)?;
        let value = f32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
        Ok(value == 2f32.powi(-24))
    }

    /// Runs probe kernel `kernel` (PROBE_ENTRY's `probe(i)` for i below `count`, with
    /// `shift` in its parameters) over `inputs` and returns the `words` 32-bit words a probe
    /// writes per i.
    fn run_probe(
        &self,
        op: &'static str,
        kernel: KernelSource,
        inputs: &[f32],
        count: usize,
        shift: i32,
        words: usize,
    ) -> Result<Vec<u32>, BackendError> {
        if count == 0 {
            return Ok(Vec::new());
        }
        let bytes = (count * words * 4) as u64;
        let out = self.new_buffer(op, bytes)?;
        let params = [count as u32, 0, shift as u32];
        let bindings = [batch::table(inputs), (&out).into()];
        self.dispatch_ranges(op, kernel, &params, &bindings, grid(count))?;
        let read = self.read_bytes(op, &out, bytes)?;
        Ok(bytemuck::cast_slice(&read).to_vec())
    }

    /// `expf.wgsl` (the exponential of attention's softmax and of SiLU's last values, which
    /// repeats glibc's `expf`) on each of `inputs`, for tests that compare it with libm's.
    #[doc(hidden)]
    pub fn expf_on_device(&self, inputs: &[f32]) -> Result<Vec<f32>, BackendError> {
        let kernel = KernelSource::Probe("expf_probe", &[PROBE_ENTRY, EXPF_PROBE, kernels::EXPF]);
        let words = self.run_probe("expf probe", kernel, inputs, inputs.len(), 0, 1)?;
        Ok(words.into_iter().map(f32::from_bits).collect())
    }

    /// `div_rn` and `sqrt_rn` (precise.wgsl: a / b and sqrt(|a|) rounded to nearest whatever
    /// the driver's `/` and `sqrt`) of each pair, their corrections started `shift` ulps off
    /// the driver's results, as `[quotient, root]` per pair: for tests that compare them with
    /// the CPU's correctly rounded ones.
    #[doc(hidden)]
    pub fn rounded_on_device(
        &self,
        pairs: &[(f32, f32)],
        shift: i32,
    ) -> Result<Vec<[f32; 2]>, BackendError> {
        let inputs: Vec<f32> = pairs.iter().flat_map(|&(a, b)| [a, b]).collect();
        let kernel = KernelSource::Probe(
            "rounded_probe",
            &[PROBE_ENTRY, ROUNDED_PROBE, kernels::PRECISE],
        );
        let words = self.run_probe("rounding probe", kernel, &inputs, pairs.len(), shift, 2)?;
        Ok(words
            .chunks_exact(2)
            .map(|pair| [f32::from_bits(pair[0]), f32::from_bits(pair[1])])
            .collect())
    }

    /// `[f16_bits_rn(x), pack2x16float(x)]` on the device for each input: the f16 bits of
    /// precise.wgsl's round-to-nearest conversion and of the driver's (whose rounding WGSL
    /// leaves to the implementation), for tests that compare them with the CPU's.
    #[doc(hidden)]
    pub fn f16_rounded_on_device(&self, inputs: &[f32]) -> Result<Vec<[u16; 2]>, BackendError> {
        let kernel = KernelSource::Probe("f16_probe", &[PROBE_ENTRY, F16_PROBE, kernels::PRECISE]);
        let words = self.run_probe("f16 probe", kernel, inputs, inputs.len(), 0, 2)?;
        Ok(words
            .chunks_exact(2)
            .map(|pair| [pair[0] as u16, pair[1] as u16])
            .collect())
    }

    /// This backend making a bind group for every dispatch instead of reusing those of
    /// earlier batches that bound the same (the old way, which `examples/matmul_speed.rs`
    /// times against the new; `RUNIT_WGPU_BIND_REUSE=0` sets it when the backend opens).
    pub fn without_bind_group_reuse(mut self) -> WgpuBackend {
        self.reuse_bind_groups = false;
        self
    }

    /// This backend running each fused op as its sequence of primitive ops
    /// (`runit_backend::unfused`) instead of its kernels (`RUNIT_WGPU_FUSED=0` sets it when
    /// the backend opens); the results are the same bit for bit, with more dispatches.
    pub fn without_fused_ops(mut self) -> WgpuBackend {
        self.fused_ops = false;
        self
    }

    /// This backend taking norms of rows of at most `max` values into the prologue of the
    /// matrix-vector dispatch that reads them (0: never), as `RUNIT_WGPU_NORM_PROLOGUE_MAX`
    /// sets it when the backend opens.
    pub fn with_norm_prologue_max(mut self, max: usize) -> WgpuBackend {
        self.norm_prologue_max = max;
        self
    }

    /// This backend taking RoPE and the cache write into one token's Q/K/V dispatch where
    /// they fit, as `RUNIT_WGPU_ROPE_EPILOGUE=1` sets it.
    pub fn with_rope_epilogue(mut self, on: bool) -> WgpuBackend {
        self.rope_epilogue = on;
        self
    }

    /// This backend making the gated activation of FFN rows of at most `max` values in the
    /// down projection's prologue (0: never), as `RUNIT_WGPU_GATED_PROLOGUE_MAX` sets it.
    pub fn with_gated_prologue_max(mut self, max: usize) -> WgpuBackend {
        self.gated_prologue_max = max;
        self
    }

    /// This backend running the matrix-vector products of several weights of one input as
    /// one dispatch where they apply, whatever the adapter (tests, and measuring the host's
    /// cost on a CPU adapter, where it is off by default).
    pub fn with_matvec_parts(mut self) -> WgpuBackend {
        self.matvec_parts = true;
        self
    }

    /// This backend with its matrix-vector kernels on int8 activations with the dot product
    /// `dot` (`Some`), or on f32 activations (`None`), as `RUNIT_WGPU_MATVEC_INT8` sets it
    /// when the backend opens (`0`: `None`; `plain`: [`Dot4::Plain`]; by default
    /// [`Dot4::Builtin`]).
    pub fn with_matvec_int8(mut self, dot: Option<Dot4>) -> WgpuBackend {
        self.matvec_int8 = dot;
        self
    }

    /// This backend with its Q6_K matrix-vector kernels staging their rows through workgroup
    /// memory (`true`) or reading each piece in place (`false`), as `RUNIT_WGPU_Q6K_ALIGNED`
    /// sets it when the backend opens (`1`: `true`; by default `false`).
    pub fn with_q6_k_staged(mut self, staged: bool) -> WgpuBackend {
        self.q6_k_staged = staged;
        self
    }

    /// This backend with its matrix-vector kernels summing in shared memory even where the
    /// adapter has subgroups (the portable variant, which tests compare with the other).
    pub fn without_subgroups(mut self) -> WgpuBackend {
        self.reduction = Reduction::Shared;
        self
    }

    /// This backend with matmul on the exact kernels (one invocation per output, the CPU's
    /// order of operations for every type and layout: `matmul_q0.wgsl`, `matmul_qk.wgsl`,
    /// `matmul_repack.wgsl`, `matmul_float.wgsl`), as `RUNIT_WGPU_EXACT=1` sets it when the
    /// backend opens.
    pub fn with_exact_matmul(mut self) -> WgpuBackend {
        self.exact_matmul = true;
        self
    }

    /// This backend with attention spans of fewer than 64 rows on ggml's one-chunk path even
    /// where matmul is not exact, as `RUNIT_WGPU_SPLIT_ATTENTION=0` sets it when the backend
    /// opens (for comparisons: one workgroup a head, ggml's roundings).
    pub fn without_split_attention(mut self) -> WgpuBackend {
        self.split_attention = false;
        self
    }

    /// This backend running one-chunk decode attention as the split path's two passes (the
    /// first pass's records, then the merge) instead of one (`RUNIT_WGPU_SPLIT_FINAL=0` sets
    /// it when the backend opens).
    pub fn without_split_final(mut self) -> WgpuBackend {
        self.split_final = false;
        self
    }

    /// This backend submitting its batches early, the first after `first` commands (0:
    /// only when the host needs their results or they are full), whatever the adapter
    /// (tests; on a CPU adapter it is off by default).
    pub fn with_early_submit(mut self, first: usize) -> WgpuBackend {
        self.early_submit = first;
        self
    }

    /// This backend adding the Q/K/V biases in a dispatch of their own (`add_bias3`) rather
    /// than in the Q/K/V dispatch's epilogue, as `RUNIT_WGPU_BIAS_EPILOGUE=0` sets it.
    pub fn without_bias_epilogue(mut self) -> WgpuBackend {
        self.bias_epilogue = false;
        self
    }

    /// This backend with its norms looping over each row (rms_norm.wgsl's `normalize_row`)
    /// at every width, as `RUNIT_WGPU_HELD_NORM=0` sets it when the backend opens (for
    /// comparisons, and the tests of the loop).
    pub fn without_held_norms(mut self) -> WgpuBackend {
        self.held_norms = false;
        self
    }

    /// This backend with norm kernels of `threads` invocations a workgroup (256, or 1,024
    /// where the adapter grants it, else 256) for every row, as `RUNIT_WGPU_NORM_THREADS`
    /// sets it when the backend opens (by default the most the adapter grants of the two, 256
    /// on a CPU adapter and for rows of at most [`NARROW_NORM_ROWS`] values). The two sum a
    /// row's squares in different orders; both round the mean as the CPU does
    /// (tests/parity.rs).
    pub fn with_norm_threads(mut self, threads: u32) -> WgpuBackend {
        let limits = self.device.limits();
        self.norm_threads = match threads {
            1024 => norm_threads(&limits),
            _ => PORTABLE_NORM_THREADS,
        };
        self.narrow_norm_rows = 0;
        // Pipelines made before were made with the other count.
        self.pipelines
            .get_mut()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
        self
    }

    /// This backend with the norms' sums and the roundings' block reductions on subgroups
    /// (`true`: a barrier each instead of one a level of a tree; only where the adapter's
    /// subgroups serve the matrix-vector kernels, else it stays `false`) or in workgroup memory
    /// (`false`), as `RUNIT_WGPU_SUBGROUP_REDUCE=1` sets it when the backend opens. The
    /// roundings are the same bit for bit; the norms sum in another order and round the mean as
    /// the CPU does (tests/parity.rs).
    pub fn with_subgroup_reductions(mut self, subgroups: bool) -> WgpuBackend {
        self.subgroup_reductions = subgroups && self.reduction == Reduction::Subgroup;
        self.pipelines
            .get_mut()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
        self
    }

    /// Whether the reductions run on subgroups ([`WgpuBackend::with_subgroup_reductions`]).
    pub fn subgroup_reductions(&self) -> bool {
        self.subgroup_reductions
    }

    /// This backend taking the norm kernels at 256 invocations for rows of at most `rows`
    /// values where [`WgpuBackend::norm_threads`] is more (the default on a GPU adapter, with
    /// [`NARROW_NORM_ROWS`]; 0: every row at `norm_threads`, as after
    /// [`WgpuBackend::with_norm_threads`]).
    pub fn with_narrow_norm_rows(mut self, rows: usize) -> WgpuBackend {
        self.narrow_norm_rows = rows;
        self
    }

    /// The norm kernels' invocations a workgroup ([`WgpuBackend::with_norm_threads`]).
    pub fn norm_threads(&self) -> u32 {
        self.norm_threads
    }

    /// This backend with matmul on the generic kernel for every type (`matmul.wgsl`, one
    /// workgroup per output row and token, values read one by one): the slow twin the
    /// per-type kernels are timed against.
    pub fn with_generic_matmul(mut self) -> WgpuBackend {
        self.generic_matmul = true;
        self
    }

    /// Whether the matrix-vector kernels sum rows with subgroup operations.
    pub fn uses_subgroups(&self) -> bool {
        self.reduction == Reduction::Subgroup
    }

    /// Kernel dispatches recorded and command submits made since the backend opened.
    pub fn counts(&self) -> DispatchCounts {
        let counts = &self.counts;
        DispatchCounts {
            dispatches: counts.dispatches.load(Ordering::Relaxed),
            submits: counts.submits.load(Ordering::Relaxed),
            bind_groups_made: counts.bind_groups_made.load(Ordering::Relaxed),
            pipelines_made: counts.pipelines_made.load(Ordering::Relaxed),
            recording_ns: counts.recording_ns.load(Ordering::Relaxed),
            submitting_ns: counts.submitting_ns.load(Ordering::Relaxed),
        }
    }

    /// The host's cost of the decode steps (passes of one row a sequence) since the backend
    /// opened, each from `begin_step` to the submit of its read-back (`RUNIT_WGPU_COUNTS=1`
    /// prints them when the backend is dropped).
    pub fn step_costs(&self) -> StepCosts {
        self.step_clock
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .totals
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
    pub(crate) fn pipeline(
        &self,
        op: &'static str,
        kernel: KernelSource,
    ) -> Result<Arc<wgpu::ComputePipeline>, BackendError> {
        let mut pipelines = self.pipelines.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(pipeline) = pipelines.get(&kernel) {
            return Ok(Arc::clone(pipeline));
        }
        let name = kernel.name();
        let scope = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let mut source = kernel.source();
        if self.fused_fma {
            source = source.replace(kernels::FMA_UNFUSED, kernels::FMA_FUSED);
        }
        if self.norm_threads != PORTABLE_NORM_THREADS && !matches!(kernel, KernelSource::Narrow(_))
        {
            let threads = kernels::norm_threads(self.norm_threads);
            source = source.replace(kernels::NORM_THREADS_PORTABLE, &threads);
        }
        if self.subgroup_reductions {
            source = kernels::on_subgroups(&source);
        }
        // Without naga's loop bounding (a counter and a branch added to every loop, which
        // keeps drivers from unrolling the kernels' fixed loops); bounds checks stay.
        let checks = wgpu::ShaderRuntimeChecks {
            force_loop_bounding: false,
            ..wgpu::ShaderRuntimeChecks::checked()
        };
        let descriptor = wgpu::ShaderModuleDescriptor {
            label: Some(&name),
            source: wgpu::ShaderSource::Wgsl(source.into()),
        };
        // SAFETY: `force_loop_bounding: false` requires that no kernel loops forever. Every
        // loop in `shaders/` runs a counter up to a bound from the parameters or a constant
        // (spans, rows, values and key positions of at most a binding's size, so no counter
        // wraps) or halves a nonzero counter down to zero.
        let module = unsafe { self.device.create_shader_module_trusted(descriptor, checks) };
        let pipeline = self
            .device
            .create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                label: Some(&name),
                layout: None,
                module: &module,
                entry_point: Some("main"),
                compilation_options: Default::default(),
                cache: None,
            });
        if let Some(error) = pollster::block_on(scope.pop()) {
            return Err(self.device_error(op, format!("kernel {name}: {error}")));
        }
        self.counts.pipelines_made.fetch_add(1, Ordering::Relaxed);
        let pipeline = Arc::new(pipeline);
        pipelines.insert(kernel, Arc::clone(&pipeline));
        Ok(pipeline)
    }

    /// Waits for the queue; a device error reported meanwhile is returned.
    pub(crate) fn wait(&self, op: &'static str) -> OpResult {
        self.flush();
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
        // The last read-back's staging buffer where it is large enough: a decode step reads
        // its logits back, and making a mappable buffer each time costs the host an
        // allocation of device memory. A read that fails drops it (it may be left mapped).
        let mut kept = self.staging.lock().unwrap_or_else(|p| p.into_inner());
        let staging = match kept.take() {
            Some(staging) if staging.size() >= bytes => staging,
            _ => self.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("download"),
                size: bytes,
                usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            }),
        };
        self.copy_bytes(buffer, 0, &staging, 0, bytes);
        // A buffer may not be mapped while an unsubmitted command uses it.
        self.flush();
        let (sender, receiver) = std::sync::mpsc::channel();
        staging.map_async(wgpu::MapMode::Read, 0..bytes, move |result| {
            // The receiver waits below; a send can fail only if it is gone.
            let _ = sender.send(result);
        });
        self.wait(op)?;
        receiver
            .recv()
            .map_err(|_| self.device_error(op, "the buffer map never completed"))?
            .map_err(|error| self.device_error(op, format!("mapping the buffer: {error}")))?;
        let view = staging
            .get_mapped_range(0..bytes)
            .map_err(|error| self.device_error(op, format!("mapping the buffer: {error:?}")))?;
        let data = view.to_vec();
        drop(view);
        staging.unmap();
        *kept = Some(staging);
        Ok(data)
    }

    /// The compiled-on-demand kernel sources, for the pipeline cache.
    pub(crate) fn plain(name: &'static str) -> KernelSource {
        kernels::plain(name)
    }

    /// The norm kernel `name` (rms_norm.wgsl's) for rows of `width` values: at 256
    /// invocations for rows of at most [`WgpuBackend::narrow_norm_rows`] values, else at
    /// [`WgpuBackend::norm_threads`]. Every norm of one width takes the same count, so the
    /// plain and fused norms sum a row in the same order.
    pub(crate) fn norm_kernel(&self, name: &'static str, width: usize) -> KernelSource {
        match self.narrow_norm(width) {
            true => KernelSource::Narrow(name),
            false => kernels::plain(name),
        }
    }

    /// Whether the norms of rows of `width` values take the narrow kernel (256 invocations
    /// where the adapter's norms have more).
    fn narrow_norm(&self, width: usize) -> bool {
        width <= self.narrow_norm_rows && self.norm_threads != PORTABLE_NORM_THREADS
    }

    /// Invocations of the norm workgroup for rows of `width` values ([`Self::norm_kernel`]'s),
    /// whose order of additions a norm prologue repeats (`matvec_norm.wgsl`).
    pub(crate) fn norm_lanes(&self, width: usize) -> u32 {
        match self.narrow_norm(width) {
            true => PORTABLE_NORM_THREADS,
            false => self.norm_threads,
        }
    }

    /// Whether a matrix-vector dispatch may take the norm of rows of `width` values in its
    /// prologue (`FusedOps::norm_matmul_qkv`): at most `RUNIT_WGPU_NORM_PROLOGUE_MAX` values
    /// ([`Self::with_norm_prologue_max`]), each workgroup then summing the whole row, and the
    /// workgroup memory it needs (the rounded row, the norm's `lanes` partial sums, the
    /// rounding's and the products' reductions) within the adapter's.
    pub(crate) fn prologue_fits(&self, width: usize, lanes: u32) -> bool {
        let bytes = kernels::rounded_words(width) * 4 + lanes as usize * 8 + 4 * 128 * 4 + 128 * 16;
        width <= self.norm_prologue_max && self.workgroup_memory_fits(bytes)
    }

    /// Whether a kernel's `bytes` of workgroup memory are within the adapter's limit.
    pub(crate) fn workgroup_memory_fits(&self, bytes: usize) -> bool {
        bytes as u64 <= u64::from(self.device.limits().max_compute_workgroup_storage_size)
    }
}

impl Drop for WgpuBackend {
    fn drop(&mut self) {
        if let Some(profiler) = &self.profiler {
            eprint!("{}", profiler.report());
        }
        if counting() {
            let counts = self.counts();
            eprintln!(
                "wgpu:{}: {} dispatches, {} submits",
                self.ordinal, counts.dispatches, counts.submits
            );
            let steps = self.step_costs();
            if steps.steps > 0 {
                eprintln!("wgpu:{}: {steps}", self.ordinal);
            }
        }
    }
}
