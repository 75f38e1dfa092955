//! Causal grouped-query attention over the paged KV cache: a flash-decoding pair of kernels
//! (chunk partials, then a combine) for batches of few rows per sequence, and a tiled
//! flash-attention kernel for prefill. f16 caches with head_dim 64 or 128 take the
//! tensor-core kernels of kernels/attention_mma.cu; the others kernels/attention.cu's, and
//! so do TurboQuant caches outside exact numerics (in the rotated basis, [`super::turbo::fast`]:
//! their codes decoded into f16 tiles for the tensor cores, [`TurboDecode`] and
//! [`TurboPrefill`], or scored in f32); in exact numerics and for heads over 128 values
//! TurboQuant takes [`super::turbo`]'s kernels (kernels/turbo.cu). Positions,
//! spans and block tables are read from the step buffer; see [`plan`] for the launch shapes.

mod plan;

use cudarc::driver::LaunchConfig;
use runit_backend::{hadamard, Attention, AttentionParams, BackendError, Buffer, Device, KvType};

use super::elementwise::{product, to_u32};
use super::kv::attended_end_row;
use crate::memory::{buffer_ptr, check_len, kv_ptr};
use crate::{launch, CudaBackend, StepView, TurboDecode, TurboPrefill};
use plan::{
    mma_prefill_tiles, round_queries, use_mma, use_prefill, DecodePlan, PrefillPlan,
    DECODE_THREADS, MAX_HEAD_DIM, MMA_THREADS, TURBO_MMA_SHARED_BYTES, TURBO_MMA_THREADS,
    TURBO_PREFILL_SHARED_BYTES, TURBO_QUERY_FLOATS, TURBO_QUERY_THREADS, TURBO_SHARED_BYTES,
    TURBO_THREADS,
};

const OP: &str = "attention";

/// The checked arguments shared by both paths (kernel argument types).
struct Call {
    q: u64,
    k: u64,
    v: u64,
    out: u64,
    heads: u32,
    kv_heads: u32,
    head_dim: u32,
    scale: f32,
    /// Sliding window, 0 for none (at most `i32::MAX`).
    window: u32,
    round_q: u32,
    f16: bool,
    /// Caches of ggml or TurboQuant blocks: their kernels and rotations.
    blocks: Option<BlockKernels>,
    /// TurboQuant's codebooks (device address; 0 for other caches).
    tables: u64,
}

/// The kernels of a pair of Q8_0 / Q4_0 or TurboQuant caches (kernels/attention.cu's
/// `attention_decode_q*`/`_tq` and `attention_prefill_q*`/`_tq`) and their rows' rotations:
/// ggml's chunk lengths (0: none), or TurboQuant's word ([`super::turbo::rotation_word`]).
#[derive(Clone, Copy)]
struct BlockKernels {
    decode: &'static str,
    prefill: &'static str,
    k_rotation: u32,
    v_rotation: u32,
}

impl Call {
    /// The kernel arguments of `attention` into `out`.
    fn new(
        attention: &Attention<'_>,
        out: &mut Buffer,
        round_q: bool,
        f16: bool,
        blocks: Option<BlockKernels>,
        tables: u64,
    ) -> Result<Call, BackendError> {
        let params = attention.params;
        Ok(Call {
            q: buffer_ptr(OP, "q", attention.q)?,
            k: kv_ptr(OP, "k cache", attention.k_cache)?,
            v: kv_ptr(OP, "v cache", attention.v_cache)?,
            out: buffer_ptr(OP, "out", out)?,
            heads: to_u32(OP, "heads", params.heads)?,
            kv_heads: to_u32(OP, "kv_heads", params.kv_heads)?,
            head_dim: params.head_dim as u32,
            scale: params.scale,
            window: params
                .sliding_window
                .map_or(0, |w| w.min(i32::MAX as usize) as u32),
            round_q: u32::from(round_q),
            f16,
            blocks,
            tables,
        })
    }
}

/// Positions a sequence's block table reaches in the step buffer (the decode grid's reach).
fn capacity(step: &StepView, spans: &[runit_backend::SequenceSpan]) -> Result<usize, BackendError> {
    let block_size = spans.first().map_or(1, |s| s.block_size);
    product(
        OP,
        "table stride × block size",
        step.table_stride,
        block_size,
    )
}

/// Attention of every span's query rows; see [`runit_backend::PrimitiveOps::attention`].
pub fn attention(
    backend: &CudaBackend,
    attention: &Attention<'_>,
    out: &mut Buffer,
) -> Result<(), BackendError> {
    let &Attention {
        q,
        k_cache,
        v_cache,
        spans,
        params,
    } = attention;
    check_params(params)?;
    let &AttentionParams {
        heads,
        kv_heads,
        head_dim,
        ..
    } = params;
    let kv_width = product(OP, "kv_heads × head_dim", kv_heads, head_dim)?;
    let q_width = product(OP, "heads × head_dim", heads, head_dim)?;
    for (cache, what) in [(k_cache, "k cache width"), (v_cache, "v cache width")] {
        if cache.width != kv_width {
            return Err(BackendError::Shape {
                op: OP,
                what,
                expected: kv_width,
                found: cache.width,
            });
        }
    }
    if k_cache.ty.is_turbo() || v_cache.ty.is_turbo() {
        if super::turbo::fast(backend, k_cache, v_cache, head_dim) {
            return attention_blocks(backend, attention, out);
        }
        // Refuses TurboQuant for only one of keys and values.
        return super::turbo::attention(backend, attention, out);
    }
    let blocks = |ty| matches!(ty, KvType::Q8_0 | KvType::Q4_0);
    if blocks(k_cache.ty) && blocks(v_cache.ty) {
        return attention_blocks(backend, attention, out);
    }
    if k_cache.ty != v_cache.ty {
        return Err(BackendError::Device {
            backend: backend.name(),
            op: OP,
            message: format!(
                "the k cache is {:?} and the v cache {:?}; both must have one type",
                k_cache.ty, v_cache.ty
            ),
        });
    }
    let end_row = attended_end_row(OP, spans, k_cache, v_cache)?;
    let total_rows = spans
        .iter()
        .fold(0usize, |total, span| total.saturating_add(span.rows));
    let needed = product(OP, "rows × heads × head_dim", end_row, q_width)?;
    check_len(OP, "q", q, needed)?;
    check_len(OP, "out", out, needed)?;
    for cache in [k_cache, v_cache] {
        if !matches!(cache.ty, KvType::F16 | KvType::F32) || cache.ty != k_cache.ty {
            return Err(crate::kv_type_refused(cache.ty, OP));
        }
    }
    let f16 = k_cache.ty == KvType::F16;
    let round_q = round_queries(f16, total_rows, head_dim);
    let call = Call::new(attention, out, round_q, f16, None, 0)?;
    if total_rows == 0 {
        return Ok(());
    }
    let step = backend.step_inputs(OP, None, None, Some(spans), None)?;
    if backend.exact_numerics() {
        return crate::exact::ops::attention(
            backend,
            f16,
            call.q,
            call.k,
            call.v,
            &step,
            call.out,
            end_row,
            call.heads,
            call.kv_heads,
            call.head_dim,
            call.scale,
            call.window,
        );
    }
    let mma = use_mma(f16, head_dim);
    if use_prefill(total_rows, end_row, spans.len()) {
        if mma {
            prefill_mma(
                backend,
                &call,
                &step,
                mma_prefill_tiles(total_rows, spans.len()),
            )
        } else {
            let plan = PrefillPlan::new(head_dim, total_rows, spans.len());
            prefill(backend, &call, &step, &plan)
        }
    } else {
        let capacity = capacity(&step, spans)?;
        let plan = if mma {
            DecodePlan::mma(
                capacity,
                heads / kv_heads,
                end_row,
                kv_heads,
                backend.multiprocessors(OP)?,
            )
        } else {
            DecodePlan::new(capacity, heads / kv_heads, end_row)
        };
        decode(backend, &call, &step, &plan, end_row, mma)
    }
}

/// Attention over Q8_0 / Q4_0 caches, queries and output rotated as the caches' rows were
/// (`runit_backend::hadamard`), or over TurboQuant caches in their rotated basis: decode rows
/// by flash-decoding over the blocks (`attention_decode_q*`/`_tq` and the combine), prefill by
/// the float caches' tiled kernel over tiles of decoded rows (`attention_prefill_q*`/`_tq`).
/// Not in `--exact` numerics (ggml blocks are refused as an unsupported cache type;
/// TurboQuant takes kernels/turbo.cu there).
fn attention_blocks(
    backend: &CudaBackend,
    attention: &Attention<'_>,
    out: &mut Buffer,
) -> Result<(), BackendError> {
    let &Attention {
        q,
        k_cache,
        v_cache,
        spans,
        params,
    } = attention;
    let turbo = k_cache.ty.is_turbo();
    if backend.exact_numerics() && !turbo {
        // alloc_kv refuses these caches under --exact; a cache made before the switch is too.
        return Err(crate::exact_kv_refused(k_cache.ty));
    }
    let head_dim = params.head_dim;
    for cache in [k_cache, v_cache] {
        if cache.head_dim != head_dim || !head_dim.is_multiple_of(32) {
            return Err(BackendError::Shape {
                op: OP,
                what: "cache head_dim (a multiple of 32)",
                expected: head_dim,
                found: cache.head_dim,
            });
        }
    }
    let end_row = attended_end_row(OP, spans, k_cache, v_cache)?;
    if end_row == 0 {
        return Ok(());
    }
    let q_width = product(OP, "heads × head_dim", params.heads, head_dim)?;
    let needed = product(OP, "rows × heads × head_dim", end_row, q_width)?;
    check_len(OP, "q", q, needed)?;
    check_len(OP, "out", out, needed)?;
    let step = backend.step_inputs(OP, None, None, Some(spans), None)?;
    let (prefill_name, decode_name) = match (k_cache.ty, v_cache.ty) {
        (KvType::Q8_0, KvType::Q8_0) => {
            ("attention_prefill_q8_0_q8_0", "attention_decode_q8_0_q8_0")
        }
        (KvType::Q8_0, KvType::Q4_0) => {
            ("attention_prefill_q8_0_q4_0", "attention_decode_q8_0_q4_0")
        }
        (KvType::Q4_0, KvType::Q8_0) => {
            ("attention_prefill_q4_0_q8_0", "attention_decode_q4_0_q8_0")
        }
        (KvType::Q4_0, KvType::Q4_0) => {
            ("attention_prefill_q4_0_q4_0", "attention_decode_q4_0_q4_0")
        }
        (k, v) if k.is_turbo() && v.is_turbo() => ("attention_prefill_tq", "attention_decode_tq"),
        (other, _) => return Err(crate::kv_type_refused(other, OP)),
    };
    let group = params.heads / params.kv_heads;
    let rotation = |cache: &runit_backend::KvCache| {
        if turbo {
            super::turbo::rotation_word(k_cache.ty, v_cache.ty, group)
        } else {
            hadamard::llama_rotation(cache.ty, cache.role, head_dim).unwrap_or(0) as u32
        }
    };
    let total_rows = spans
        .iter()
        .fold(0usize, |total, span| total.saturating_add(span.rows));
    if total_rows == 0 {
        return Ok(());
    }
    let kernels = BlockKernels {
        decode: decode_name,
        prefill: prefill_name,
        k_rotation: rotation(k_cache),
        v_rotation: rotation(v_cache),
    };
    let tables = if turbo { backend.turbo_tables()? } else { 0 };
    let call = Call::new(attention, out, false, false, Some(kernels), tables)?;
    // The tensor cores take TurboQuant heads of 64 and 128 values.
    let mma_shape = turbo && matches!(head_dim, 64 | 128);
    let decoder = backend.turbo_decode();
    let tensor_cores = mma_shape && decoder == TurboDecode::TensorCores;
    if use_prefill(total_rows, end_row, spans.len()) {
        if mma_shape && backend.turbo_prefill() == TurboPrefill::TensorCores {
            let tiles = mma_prefill_tiles(total_rows, spans.len());
            return prefill_turbo_mma(backend, &call, &step, tiles);
        }
        let plan = PrefillPlan::new(head_dim, total_rows, spans.len());
        return prefill(backend, &call, &step, &plan);
    }
    if turbo && decoder != TurboDecode::Tiles {
        let plan = DecodePlan::turbo(
            capacity(&step, spans)?,
            group,
            end_row,
            params.kv_heads,
            backend.multiprocessors(OP)?,
            tensor_cores,
        );
        return decode_turbo(backend, &call, &step, &plan, end_row, tensor_cores);
    }
    let plan = DecodePlan::new(capacity(&step, spans)?, group, end_row);
    decode(backend, &call, &step, &plan, end_row, false)
}

/// The shape checks of the CPU reference, plus the kernels' head_dim limit.
fn check_params(params: &AttentionParams) -> Result<(), BackendError> {
    let shape = |what, expected, found| {
        Err(BackendError::Shape {
            op: OP,
            what,
            expected,
            found,
        })
    };
    if params.kv_heads == 0 || !params.heads.is_multiple_of(params.kv_heads) {
        return shape(
            "kv_heads (a non-zero divisor of heads)",
            params.heads,
            params.kv_heads,
        );
    }
    if params.head_dim == 0 || params.head_dim > MAX_HEAD_DIM {
        return shape(
            "head_dim (1 ..= 256 on CUDA)",
            MAX_HEAD_DIM,
            params.head_dim,
        );
    }
    if params.sliding_window == Some(0) {
        return shape("sliding_window (non-zero)", 1, 0);
    }
    Ok(())
}

/// Flash-decoding: chunk partials into scratch memory, then the combine into `out` (with
/// `mma`, the tensor-core kernel writes rows whose range is one chunk to `out` itself and
/// merges the others in the last block of each head group: no combine kernel).
fn decode(
    backend: &CudaBackend,
    call: &Call,
    step: &StepView,
    plan: &DecodePlan,
    rows: usize,
    mma: bool,
) -> Result<(), BackendError> {
    let heads = call.heads as usize;
    let head_dim = call.head_dim as usize;
    // One persistent scratch (no allocation nodes in a captured step): the partials, then
    // the statistics. attention_combine reads only the partials that attention_decode_*
    // wrote before it in stream order (the chunks meeting each row's visible range, which
    // the decode kernel never skips; with `direct`, rows of one chunk are skipped by both).
    let partial_values = plan
        .partial_values(rows, heads, head_dim)
        .next_multiple_of(64);
    let base = backend.attention_scratch(OP, partial_values + plan.stat_values(rows, heads))?;
    let (partials_ptr, stats_ptr) = (base, base + 4 * partial_values as u64);
    let rows = rows as u32; // at most 65 535 (plan::use_prefill)
    let chunk_len = to_u32(OP, "chunk length", plan.chunk_len)?;
    let chunks = plan.chunks as u32;
    let config = LaunchConfig {
        grid_dim: (
            chunks,
            to_u32(
                OP,
                "kv_heads × head slices",
                call.kv_heads as usize * plan.slices,
            )?,
            rows,
        ),
        block_dim: (DECODE_THREADS, 1, 1),
        shared_mem_bytes: plan.shared_bytes(head_dim),
    };
    let heads_per_block = plan.heads_per_block as u32;
    if mma {
        // The tensor-core kernel merges the chunks itself (its last block per head group).
        return decode_mma(
            backend,
            call,
            step,
            (partials_ptr, stats_ptr),
            plan,
            config.grid_dim,
        );
    }
    // The kernels of the float caches take the query rounding last, those of block caches
    // the keys' rotation; the combine rotates the values back.
    let (name, last, v_rotation) = match call.blocks {
        Some(kernels) => (kernels.decode, kernels.k_rotation, kernels.v_rotation),
        None if call.f16 => ("attention_decode_f16", call.round_q, 0),
        None => ("attention_decode_f32", call.round_q, 0),
    };
    launch!(
        backend,
        OP,
        "attention.cu",
        name,
        config,
        call.q,
        call.k,
        call.v,
        step.ptr,
        partials_ptr,
        stats_ptr,
        call.heads,
        call.kv_heads,
        call.head_dim,
        call.scale,
        call.window,
        chunk_len,
        chunks,
        heads_per_block,
        last,
        call.tables
    )?;
    combine(
        backend,
        call,
        step,
        (partials_ptr, stats_ptr),
        plan,
        rows,
        (u32::from(mma), v_rotation),
    )
}

/// attention_combine: merges each (row, head)'s chunk partials into `out`, rotating the
/// merged rows back by `v_rotation` (`direct`: rows of one chunk are in `out` already).
fn combine(
    backend: &CudaBackend,
    call: &Call,
    step: &StepView,
    (partials, stats): (u64, u64),
    plan: &DecodePlan,
    rows: u32,
    (direct, v_rotation): (u32, u32),
) -> Result<(), BackendError> {
    let config = LaunchConfig {
        grid_dim: (call.heads, rows, 1),
        block_dim: (DECODE_THREADS, 1, 1),
        shared_mem_bytes: 0,
    };
    launch!(
        backend,
        OP,
        "attention.cu",
        "attention_combine",
        config,
        call.out,
        partials,
        stats,
        step.ptr,
        call.heads,
        call.head_dim,
        call.window,
        plan.chunk_len as u32,
        plan.chunks as u32,
        direct,
        v_rotation
    )
}

/// TurboQuant decode from the codes ([`TurboDecode`]): attention_decode_tq_mma_* (`mma`),
/// whose last block of each (row, head slice) merges the chunk partials into `out` and rotates
/// them back; or the chunk partials of attention_decode_tq_codes after attention_tq_query
/// prepared the query side once per (row, KV head, slice of its query heads), then the
/// combine, which rotates the merged rows back.
fn decode_turbo(
    backend: &CudaBackend,
    call: &Call,
    step: &StepView,
    plan: &DecodePlan,
    rows: usize,
    mma: bool,
) -> Result<(), BackendError> {
    let Some(kernels) = call.blocks else {
        return Err(crate::kv_type_refused(KvType::Tq4, OP));
    };
    let (heads, head_dim) = (call.heads as usize, call.head_dim as usize);
    let slices = to_u32(
        OP,
        "kv_heads × head slices",
        call.kv_heads as usize * plan.slices,
    )?;
    let partial_values = plan
        .partial_values(rows, heads, head_dim)
        .next_multiple_of(64);
    let stat_values = plan.stat_values(rows, heads).next_multiple_of(64);
    // `RUNIT_CUDA_TQ_FUSED_QUERY=1` (a measuring knob): the decode blocks prepare the query
    // side themselves, without attention_tq_query's launch and scratch.
    static FUSED: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    let fused = crate::env_count(&FUSED, "RUNIT_CUDA_TQ_FUSED_QUERY", 0) == 1;
    let query_values = if fused || mma {
        0
    } else {
        rows * slices as usize * TURBO_QUERY_FLOATS
    };
    let base = backend.attention_scratch(OP, partial_values + stat_values + query_values)?;
    let partials = base;
    let stats = partials + 4 * partial_values as u64;
    let queries = stats + 4 * stat_values as u64;
    let rows = rows as u32; // at most 65 535 (plan::use_prefill)
    let heads_per_block = plan.heads_per_block as u32;
    let word = kernels.k_rotation;
    if mma {
        // The last block of each (row, head slice) merges its chunks: no combine kernel.
        let config = LaunchConfig {
            grid_dim: (plan.chunks as u32, slices, rows),
            block_dim: (TURBO_MMA_THREADS, 1, 1),
            shared_mem_bytes: TURBO_MMA_SHARED_BYTES,
        };
        let counters = backend.arrival_counters(OP, slices as usize * rows as usize)?;
        let name = if call.head_dim == 64 {
            "attention_decode_tq_mma_d64"
        } else {
            "attention_decode_tq_mma_d128"
        };
        return launch!(
            backend,
            OP,
            "attention.cu",
            name,
            config,
            call.k,
            call.v,
            step.ptr,
            call.q,
            call.tables,
            call.out,
            partials,
            stats,
            call.heads,
            call.kv_heads,
            call.scale,
            call.window,
            plan.chunks as u32,
            heads_per_block,
            word,
            counters
        );
    }
    if !fused {
        let config = LaunchConfig {
            grid_dim: (slices, rows, 1),
            block_dim: (TURBO_QUERY_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        launch!(
            backend,
            OP,
            "attention.cu",
            "attention_tq_query",
            config,
            call.q,
            step.ptr,
            queries,
            call.heads,
            call.kv_heads,
            call.head_dim,
            heads_per_block,
            word
        )?;
    }
    let config = LaunchConfig {
        grid_dim: (plan.chunks as u32, slices, rows),
        block_dim: (TURBO_THREADS, 1, 1),
        shared_mem_bytes: TURBO_SHARED_BYTES,
    };
    launch!(
        backend,
        OP,
        "attention.cu",
        "attention_decode_tq_codes",
        config,
        call.k,
        call.v,
        step.ptr,
        queries,
        call.q,
        call.tables,
        partials,
        stats,
        call.heads,
        call.kv_heads,
        call.head_dim,
        call.scale,
        call.window,
        to_u32(OP, "chunk length", plan.chunk_len)?,
        plan.chunks as u32,
        heads_per_block,
        word,
        u32::from(fused)
    )?;
    combine(
        backend,
        call,
        step,
        (partials, stats),
        plan,
        rows,
        (0, kernels.v_rotation),
    )
}

/// The TurboQuant prefill on the tensor cores (attention_prefill_tq_mma_*, heads of 64 or
/// 128 values) straight into `out`: 64 query rows of one span and one head a block.
fn prefill_turbo_mma(
    backend: &CudaBackend,
    call: &Call,
    step: &StepView,
    tiles: usize,
) -> Result<(), BackendError> {
    let Some(kernels) = call.blocks else {
        return Err(crate::kv_type_refused(KvType::Tq4, OP));
    };
    let config = LaunchConfig {
        grid_dim: (to_u32(OP, "query tiles", tiles)?, call.heads, 1),
        block_dim: (TURBO_MMA_THREADS, 1, 1),
        shared_mem_bytes: TURBO_PREFILL_SHARED_BYTES,
    };
    let name = if call.head_dim == 64 {
        "attention_prefill_tq_mma_d64"
    } else {
        "attention_prefill_tq_mma_d128"
    };
    launch!(
        backend,
        OP,
        "attention.cu",
        name,
        config,
        call.k,
        call.v,
        step.ptr,
        call.q,
        call.tables,
        call.out,
        call.heads,
        call.kv_heads,
        call.scale,
        call.window,
        kernels.k_rotation
    )
}

/// Tiled prefill straight into `out`.
fn prefill(
    backend: &CudaBackend,
    call: &Call,
    step: &StepView,
    plan: &PrefillPlan,
) -> Result<(), BackendError> {
    let head_dim = call.head_dim as usize;
    let config = LaunchConfig {
        grid_dim: (to_u32(OP, "query tiles", plan.tiles)?, call.heads, 1),
        block_dim: (32 * plan.tile_rows as u32, 1, 1),
        shared_mem_bytes: plan.shared_bytes(head_dim),
    };
    // One signature: the float caches take the query rounding, those of blocks the rotations.
    let (name, rotations) = match call.blocks {
        Some(kernels) => (kernels.prefill, (kernels.k_rotation, kernels.v_rotation)),
        None if call.f16 => ("attention_prefill_f16", (0, 0)),
        None => ("attention_prefill_f32", (0, 0)),
    };
    launch!(
        backend,
        OP,
        "attention.cu",
        name,
        config,
        call.q,
        call.k,
        call.v,
        step.ptr,
        call.out,
        call.heads,
        call.kv_heads,
        call.head_dim,
        call.scale,
        call.window,
        plan.key_tile as u32,
        call.round_q,
        rotations.0,
        rotations.1,
        call.tables
    )
}

/// The tensor-core decode kernel (head_dim 64 or 128, f16 cache) on `grid`.
fn decode_mma(
    backend: &CudaBackend,
    call: &Call,
    step: &StepView,
    (partials, stats): (u64, u64),
    plan: &DecodePlan,
    grid_dim: (u32, u32, u32),
) -> Result<(), BackendError> {
    let config = LaunchConfig {
        grid_dim,
        block_dim: (MMA_THREADS, 1, 1),
        shared_mem_bytes: 0,
    };
    let (chunk_len, chunks) = (plan.chunk_len as u32, plan.chunks as u32);
    let heads_per_block = plan.heads_per_block as u32;
    let counters = backend.arrival_counters(OP, grid_dim.1 as usize * grid_dim.2 as usize)?;
    macro_rules! kernel {
        ($name:literal) => {
            launch!(
                backend,
                OP,
                "attention_mma.cu",
                $name,
                config,
                call.q,
                call.k,
                call.v,
                step.ptr,
                call.out,
                partials,
                stats,
                call.heads,
                call.kv_heads,
                call.scale,
                call.window,
                chunk_len,
                chunks,
                heads_per_block,
                counters
            )
        };
    }
    if call.head_dim == 64 {
        kernel!("attention_decode_mma_d64")
    } else {
        kernel!("attention_decode_mma_d128")
    }
}

/// The tensor-core prefill (head_dim 64 or 128, f16 cache) straight into `out`.
fn prefill_mma(
    backend: &CudaBackend,
    call: &Call,
    step: &StepView,
    tiles: usize,
) -> Result<(), BackendError> {
    let config = LaunchConfig {
        grid_dim: (to_u32(OP, "query tiles", tiles)?, call.heads, 1),
        block_dim: (MMA_THREADS, 1, 1),
        shared_mem_bytes: 0,
    };
    macro_rules! kernel {
        ($name:literal) => {
            launch!(
                backend,
                OP,
                "attention_mma.cu",
                $name,
                config,
                call.q,
                call.k,
                call.v,
                step.ptr,
                call.out,
                call.heads,
                call.kv_heads,
                call.scale,
                call.window
            )
        };
    }
    if call.head_dim == 64 {
        kernel!("attention_prefill_mma_d64")
    } else {
        kernel!("attention_prefill_mma_d128")
    }
}
