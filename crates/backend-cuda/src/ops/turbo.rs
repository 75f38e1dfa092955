//! TurboQuant KV caches (tq4, tq3) on CUDA (kernels/turbo.cu), the same algorithm and bytes
//! as the CPU's (`runit_backend::turbo` holds the layout, `backend-cpu/src/turbo/` the
//! attention): the row writer (outliers, norm, rotation, codes, and for tq4 keys the
//! residual's sign sketch, of each row minus the layer's mean key once `center_keys` set
//! one), and the attention on the codes (queries rotated once per block, scores from the
//! codes, values accumulated in the rotated basis and rotated back once; no row decoded).
//!
//! The kernels repeat the CPU scalar twins' float operations in their order (see
//! kernels/turbo.cu), so the cache bytes and the attention's outputs are meant to equal the
//! CPU's; `tests/turbo_gpu.rs` measures how far they do. Decode and prefill share the two
//! attention kernels, as the CPU's numbers do not depend on the batch: per (row, slice of
//! four query heads of a KV head, chunk of [`KEY_CHUNK`] visible keys) a partial, then
//! per (row, head) the merge in chunk order (split-KV, so a long decode row spreads over
//! many blocks). `--exact` numerics runs these kernels (compiled with `--fmad=false`, like
//! the exact modules): they are already the CPU's arithmetic. Otherwise heads of 64 or 128
//! values take kernels/attention.cu's flash-decoding and tiled prefill ([`fast`]): the same
//! estimate in the rotated basis, a tile of keys decoded once for every query head of its
//! KV head, sums in another order (within `tests/turbo_gpu.rs`'s bound of the CPU's).

use cudarc::driver::LaunchConfig;
use runit_backend::turbo::{self, TurboLayout};
use runit_backend::{
    Attention, AttentionParams, BackendError, Buffer, Device, KvCache, KvRole, KvType, OpResult,
};

use super::elementwise::{product, to_u32};
use super::kv::attended_end_row;
use crate::memory::{buffer_ptr, check_len, kv_mean_ptr, kv_ptr, DeviceKv};
use crate::{launch, CudaBackend, StepView};

/// Key positions of one chunk (backend-cpu's `KEY_CHUNK`; `TQ_KEY_CHUNK` in the kernel).
pub const KEY_CHUNK: usize = 512;
/// Query heads of one chunk block (backend-cpu's `MAX_HEADS`; `TQ_HEADS`).
const HEADS_PER_BLOCK: usize = 4;
/// The largest head the kernels hold (`TQ_MAX_HEAD_DIM`).
const MAX_HEAD_DIM: usize = 256;
/// Threads of a merge block and of a chunk block of many rows (`TQ_THREADS`).
const THREADS: u32 = 128;
/// Threads of a chunk block of at most [`FEW_ROWS`] rows (`TQ_FEW_ROWS_THREADS`).
const FEW_ROWS_THREADS: u32 = 512;
/// Most rows of a launch whose chunk blocks take [`FEW_ROWS_THREADS`] (`attention_turbo_chunk`;
/// more rows fill the device with blocks of [`THREADS`], `attention_turbo_chunk_rows`).
const FEW_ROWS: usize = 8;
/// Warps of a row writer's block at most (one block of 64 values each at a time).
const WRITE_WARPS: usize = 8;
/// Most f32 values of chunk partials one launch fills (64 MiB): a prefill whose rows need
/// more runs in groups of rows.
const MAX_PARTIAL_VALUES: usize = 1 << 24;
/// The most rows of one launch (grid.z).
const MAX_GRID_Z: usize = 65_535;

/// The values the kernels read from the backend's table (offsets `TQ_CENTROIDS4` ...
/// `TQ_SKETCH_FACTOR` of kernels/turbo.cu): the 4-bit codebook's 16 centroids and 15
/// thresholds, the 3-bit one's 8 and 7, and the sketch's factor.
pub fn tables() -> Vec<f32> {
    let mut tables = vec![0.0f32; 49];
    for (bits, at) in [(4, 0), (3, 32)] {
        let book = turbo::codebook(bits);
        let levels = 1 << bits;
        tables[at..at + levels].copy_from_slice(&book.centroids);
        tables[at + levels..at + 2 * levels - 1].copy_from_slice(&book.thresholds);
    }
    tables[48] = turbo::sketch_factor();
    tables
}

/// Largest head of kernels/attention.cu's TurboQuant path (`TQ_TILE_DIM`).
const FAST_MAX_HEAD_DIM: usize = 128;

/// True when kernels/attention.cu serves attention over these caches (`TurboKv`): outside
/// exact numerics, TurboQuant keys and values, heads of at most [`FAST_MAX_HEAD_DIM`]
/// values (whole blocks of 64). `RUNIT_CUDA_TURBO_FAST=0` keeps this module's kernels (read at
/// every call, so that a measurement can compare both).
pub fn fast(backend: &CudaBackend, k_cache: &KvCache, v_cache: &KvCache, head_dim: usize) -> bool {
    !backend.exact_numerics()
        && k_cache.ty.is_turbo()
        && v_cache.ty.is_turbo()
        && head_dim <= FAST_MAX_HEAD_DIM
        && head_dim.is_multiple_of(turbo::BLOCK)
        && std::env::var_os("RUNIT_CUDA_TURBO_FAST").is_none_or(|v| v != "0")
}

/// The rotation argument of kernels/attention.cu's TurboQuant kernels (`TQ_ROTATION`): bit
/// 31, the keys' code bits (bits 0-3) and sketch (bit 4), the values' code bits (bits 8-11),
/// the query heads of a KV head (bits 16-30, for the combine's rotation back).
pub fn rotation_word(k: KvType, v: KvType, group: usize) -> u32 {
    let (keys, values) = (layout(k, KvRole::Keys), layout(v, KvRole::Values));
    1 << 31
        | keys.code_bits as u32
        | u32::from(keys.sketch) << 4
        | (values.code_bits as u32) << 8
        | (group.min(0x7fff) as u32) << 16
}

/// The layout of a TurboQuant cache of `ty` holding `role`.
fn layout(ty: KvType, role: KvRole) -> TurboLayout {
    TurboLayout::new(if ty == KvType::Tq4 { 4 } else { 3 }, role)
}

/// Refuses heads the kernels cannot hold: not whole blocks of 64, or more than 256 values,
/// or a width that is not whole heads.
pub fn check_shape(ty: KvType, width: usize, head_dim: usize) -> OpResult {
    let refused = |what: String| Err(crate::kv_type_refused(ty, &what));
    if let Err(error) = ty.check_head_dim(head_dim) {
        return refused(error.to_string());
    }
    if head_dim > MAX_HEAD_DIM {
        return refused(format!(
            "heads of {head_dim} values (the TurboQuant kernels hold at most {MAX_HEAD_DIM})"
        ));
    }
    if !width.is_multiple_of(head_dim) {
        return Err(BackendError::Shape {
            op: "alloc_kv",
            what: "width (a multiple of head_dim)",
            expected: head_dim,
            found: width,
        });
    }
    Ok(())
}

/// `Device::center_keys`: the cache stores each key row minus `mean` from now on.
pub fn center_keys(backend: &CudaBackend, cache: &mut KvCache, mean: &[f32]) -> OpResult {
    const OP: &str = "center_keys";
    if mean.len() != cache.width {
        return Err(BackendError::Shape {
            op: OP,
            what: "mean (one value a channel)",
            expected: cache.width,
            found: mean.len(),
        });
    }
    if !cache.ty.is_turbo() || cache.role != KvRole::Keys {
        return Err(BackendError::UnsupportedKv {
            backend: backend.name(),
            ty: cache.ty,
            what: format!("centered {:?}", cache.role),
            supported: "tq4, tq3 keys",
        });
    }
    let slice = backend
        .stream
        .clone_htod(mean)
        .map_err(|e| backend.oom_or(e, OP, mean.len() * 4))?;
    let ptr = crate::device_address(&slice, &backend.stream);
    let device = cache
        .payload_mut::<DeviceKv>()
        .ok_or(BackendError::ForeignBuffer {
            op: OP,
            what: "cache",
        })?;
    device.mean = Some((slice, ptr));
    Ok(())
}

/// Encodes rows `0 .. rows` of `src` (`[rows, width]` f32, device address) into the cells
/// of their positions (kernels/turbo.cu `kv_write_turbo`); rows no span owns are skipped.
pub fn kv_write(
    backend: &CudaBackend,
    op: &'static str,
    src: u64,
    cache: &KvCache,
    step: &StepView,
    rows: usize,
) -> OpResult {
    let (cells, mean, n_cells, bits, sketch) = cache_args(op, cache)?;
    launch!(
        backend,
        op,
        "turbo.cu",
        "kv_write_turbo",
        writer_config(op, cache.width, rows, 1)?,
        cells,
        src,
        step.ptr,
        backend.turbo_tables()?,
        mean,
        to_u32(op, "cache width", cache.width)?,
        rows as u32,
        n_cells,
        bits,
        sketch
    )
}

/// The row writer's launch (`kv_write_turbo`, and the writing blocks of `rope_kv_write_turbo`)
/// for rows of `width` values: grid (`rows`, `grid_y`), a warp per block of 64 values up to
/// [`WRITE_WARPS`], and their shared memory.
pub(crate) fn writer_config(
    op: &'static str,
    width: usize,
    rows: usize,
    grid_y: usize,
) -> Result<LaunchConfig, BackendError> {
    let blocks = width / turbo::BLOCK;
    let warps = blocks.clamp(1, WRITE_WARPS);
    Ok(LaunchConfig {
        grid_dim: (
            to_u32(op, "rows", rows)?,
            to_u32(op, "grid rows", grid_y)?,
            1,
        ),
        block_dim: (32 * warps as u32, 1, 1),
        shared_mem_bytes: to_u32(
            op,
            "row writer shared memory",
            warps * (turbo::BLOCK * 4 + turbo::BLOCK) + blocks * turbo::OUTLIERS,
        )?,
    })
}

/// A TurboQuant cache's arguments to the row writer: its cells, its mean row (0: none), its
/// cell count, code bits and whether it keeps the sketch.
pub(crate) fn cache_args(
    op: &'static str,
    cache: &KvCache,
) -> Result<(u64, u64, u64, u32, u32), BackendError> {
    let layout = layout(cache.ty, cache.role);
    Ok((
        kv_ptr(op, "cache", cache)?,
        kv_mean_ptr(op, "cache", cache)?,
        cache.n_cells as u64,
        layout.code_bits as u32,
        u32::from(layout.sketch),
    ))
}

/// Attention of every span's query rows over TurboQuant caches; see
/// [`runit_backend::PrimitiveOps::attention`].
pub fn attention(
    backend: &CudaBackend,
    attention: &Attention<'_>,
    out: &mut Buffer,
) -> Result<(), BackendError> {
    const OP: &str = "attention";
    let &Attention {
        q,
        k_cache,
        v_cache,
        spans,
        params,
    } = attention;
    if !k_cache.ty.is_turbo() || !v_cache.ty.is_turbo() {
        return Err(BackendError::Device {
            backend: backend.name(),
            op: OP,
            message: format!(
                "TurboQuant keys and values go together (keys {}, values {}): its attention \
                 runs in the rotated basis of both",
                k_cache.ty, v_cache.ty
            ),
        });
    }
    let &AttentionParams {
        heads,
        kv_heads,
        head_dim,
        ..
    } = params;
    for cache in [k_cache, v_cache] {
        if cache.head_dim != head_dim {
            return Err(BackendError::Shape {
                op: OP,
                what: "cache head_dim",
                expected: head_dim,
                found: cache.head_dim,
            });
        }
        check_shape(cache.ty, cache.width, head_dim)?;
    }
    let end_row = attended_end_row(OP, spans, k_cache, v_cache)?;
    if end_row == 0 {
        return Ok(());
    }
    let q_width = product(OP, "heads × head_dim", heads, head_dim)?;
    let needed = product(OP, "rows × heads × head_dim", end_row, q_width)?;
    check_len(OP, "q", q, needed)?;
    check_len(OP, "out", out, needed)?;
    let step = backend.step_inputs(OP, None, None, Some(spans), None)?;
    // Chunks from the table's capacity, not the sequences' lengths (a captured step stays
    // valid as they grow); a row's chunks past its visible keys exit at once.
    let block_size = spans.first().map_or(1, |s| s.block_size);
    let capacity = product(
        OP,
        "table stride × block size",
        step.table_stride,
        block_size,
    )?;
    let chunks = capacity.max(1).div_ceil(KEY_CHUNK);
    let slices = (heads / kv_heads).div_ceil(HEADS_PER_BLOCK);
    let per_row = heads * chunks * (2 + 2 * head_dim);
    let group_rows = (MAX_PARTIAL_VALUES / per_row)
        .clamp(1, MAX_GRID_Z)
        .min(end_row);
    let partials = backend.attention_scratch(OP, group_rows * per_row)?;
    let (k_layout, v_layout) = (
        layout(k_cache.ty, KvRole::Keys),
        layout(v_cache.ty, KvRole::Values),
    );
    let window = params
        .sliding_window
        .map_or(0, |w| w.min(i32::MAX as usize) as u32);
    let (q, k, v, out) = (
        buffer_ptr(OP, "q", q)?,
        kv_ptr(OP, "k cache", k_cache)?,
        kv_ptr(OP, "v cache", v_cache)?,
        buffer_ptr(OP, "out", out)?,
    );
    let tables = backend.turbo_tables()?;
    let (heads, kv_heads) = (
        to_u32(OP, "heads", heads)?,
        to_u32(OP, "kv_heads", kv_heads)?,
    );
    let chunks = to_u32(OP, "key chunks", chunks)?;
    let (chunk_kernel, chunk_threads) = if end_row <= FEW_ROWS {
        ("attention_turbo_chunk", FEW_ROWS_THREADS)
    } else {
        ("attention_turbo_chunk_rows", THREADS)
    };
    for first_row in (0..end_row).step_by(group_rows) {
        let rows = group_rows.min(end_row - first_row) as u32;
        let first_row = to_u32(OP, "rows", first_row)?;
        let config = LaunchConfig {
            grid_dim: (
                chunks,
                to_u32(OP, "kv_heads × head slices", kv_heads as usize * slices)?,
                rows,
            ),
            block_dim: (chunk_threads, 1, 1),
            shared_mem_bytes: 0,
        };
        launch!(
            backend,
            OP,
            "turbo.cu",
            chunk_kernel,
            config,
            q,
            k,
            v,
            step.ptr,
            tables,
            partials,
            heads,
            kv_heads,
            head_dim as u32,
            params.scale,
            window,
            chunks,
            first_row,
            k_layout.code_bits as u32,
            u32::from(k_layout.sketch),
            v_layout.code_bits as u32
        )?;
        let config = LaunchConfig {
            grid_dim: (heads, rows, 1),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        launch!(
            backend,
            OP,
            "turbo.cu",
            "attention_turbo_merge",
            config,
            out,
            partials,
            step.ptr,
            heads,
            kv_heads,
            head_dim as u32,
            window,
            chunks,
            first_row
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_hold_the_codebooks_where_the_kernels_read_them() {
        let tables = tables();
        assert_eq!(tables[..16], turbo::codebook(4).centroids[..]);
        assert_eq!(tables[16..31], turbo::codebook(4).thresholds[..]);
        assert_eq!(tables[32..40], turbo::codebook(3).centroids[..]);
        assert_eq!(tables[40..47], turbo::codebook(3).thresholds[..]);
        assert_eq!(tables[48], turbo::sketch_factor());
    }

    #[test]
    fn heads_the_kernels_cannot_hold_are_refused() {
        assert!(check_shape(KvType::Tq4, 256, 128).is_ok());
        assert!(check_shape(KvType::Tq3, 3 * 64, 64).is_ok());
        for (width, head_dim) in [(96, 96), (512, 512), (200, 100)] {
            let error = check_shape(KvType::Tq4, width, head_dim).expect_err("refused");
            assert!(
                matches!(error, BackendError::UnsupportedKv { .. }),
                "{error}"
            );
        }
        assert!(check_shape(KvType::Tq4, 192, 128).is_err());
    }

    #[test]
    fn rotation_words_carry_both_layouts_and_the_group() {
        assert_eq!(rotation_word(KvType::Tq4, KvType::Tq3, 7), 0x8007_0314);
        assert_eq!(rotation_word(KvType::Tq3, KvType::Tq4, 1), 0x8001_0404);
    }

    #[test]
    fn layouts_follow_the_shared_one() {
        assert_eq!(
            layout(KvType::Tq4, KvRole::Keys),
            TurboLayout::new(4, KvRole::Keys)
        );
        assert_eq!(
            layout(KvType::Tq3, KvRole::Values),
            TurboLayout::new(3, KvRole::Values)
        );
    }
}
