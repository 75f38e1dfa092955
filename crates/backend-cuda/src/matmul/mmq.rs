//! The decode-batch path: matmuls of more rows than the matvecs take on the tensor cores,
//! each packed weight block read once per tile of token rows; no weight is staged as a
//! dequantized matrix.
//!
//! Quantized weights take the pipelined kernels (`mmqp_*` in kernels/mmqp.cu) for up to
//! [`PIPE_MAX_TOKENS`] rows: raw weight blocks and f16 activations copied into shared memory
//! with cp.async, two stages in flight, each lane decoding its tensor-core fragments from the
//! raw bytes (integer tricks and f16x2 arithmetic for Q4_K, Q6_K and Q8_0, dequant.cuh's float
//! path for the other types), tiles of 8, 16, 32 or 64 token rows, the smallest that holds
//! the batch. Float weights take the f16 kernels (`mmq_*` in kernels/mmq.cu, each warp
//! dequantizing its rows into shared memory) for up to [`MMQ_MAX_TOKENS`] rows. With
//! `RUNIT_CUDA_MMQ8=1` quantized weights take the int8 kernels (`mmq8_*` in kernels/mmq8.cu,
//! slower: see `int8_enabled`) instead. Larger batches take the GEMM path.
//!
//! Matrices with too few row blocks to fill the device split their rows' length into ranges;
//! `mmq_merge` then adds the ranges' partial sums in a fixed order over the whole device. The
//! pipelined kernels instead give each of as many blocks as the device holds at once an equal
//! share of all the row blocks' stages (stream-K, [`PipePlan`]); `mmqp_merge` adds the partial
//! sums of the row blocks cut between them.

use cudarc::driver::LaunchConfig;
use runit_backend::BackendError;
use runit_quant::GgmlType;
use std::sync::OnceLock;

use super::names::TypeKernels;
use super::{ensure, launch_kernel, Operands, Scratch, OP};
use crate::CudaBackend;

/// Most token rows the f16 kernels take (one tile of float weights); more go through the
/// GEMM path.
pub const MMQ_MAX_TOKENS: usize = 16;
/// Most token rows the int8 kernels take (quantized weights); more go through the GEMM path.
pub const MMQ8_MAX_TOKENS: usize = 256;
/// Weight rows of one block (`MMQ_BLOCK_ROWS` in mmq.cu).
const BLOCK_ROWS: usize = 128;
/// Token rows of the f16 kernels' tile (8 NT of the built kernels).
const TILE_TOKENS: usize = 16;
/// Token rows of the int8 kernels' tiles (`mmq8_*_n2`, `_n4`, `_n8`).
const TILE8_TOKENS: [usize; 3] = [16, 32, 64];
/// Token rows of the pipelined kernels' smallest tile (`mmqp_<type>_n1`), for 2-8 rows unless
/// [`tile8_enabled`] says otherwise.
const TILE8_MIN: usize = 8;
/// Threads of one block (`MMQ_THREADS`).
const THREADS: u32 = 128;
/// Blocks per multiprocessor the split aims for, so that every multiprocessor streams weights.
const BLOCKS_PER_MULTIPROCESSOR: usize = 4;

/// Elements of the activations staged at once (`MMQ_CHUNK` in mmq.cu): ranges of the row
/// length and the rows themselves are whole multiples of it.
const CHUNK: usize = 128;

/// Which batched kernel takes a matmul.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Path {
    /// The f16 kernel (float weights, one tile of [`TILE_TOKENS`]).
    Half(&'static str),
    /// The int8 kernel with tiles of `tile` token rows.
    Int8 { kernel: &'static str, tile: usize },
    /// The pipelined f16 kernel with tiles of `tile` token rows and `shared` bytes of
    /// dynamic shared memory.
    Pipe {
        kernel: &'static str,
        tile: usize,
        shared: u32,
        /// Elements of one pipeline stage.
        stage: usize,
    },
}

/// Source of the pipelined kernels.
const PIPE_FILE: &str = "mmqp.cu";
/// The value of `name` in `RUNIT_CUDA_DEFINES` (the defines passed to NVRTC for an
/// experiment), or `default`.
fn kernel_define(name: &str, default: usize) -> usize {
    std::env::var("RUNIT_CUDA_DEFINES")
        .unwrap_or_default()
        .split_whitespace()
        .find_map(|define| define.strip_prefix(name)?.strip_prefix('=')?.parse().ok())
        .unwrap_or(default)
}

/// Stages in flight (`MMQP_STAGES` in mmqp.cu: 2).
fn pipe_stages() -> usize {
    static STAGES: OnceLock<usize> = OnceLock::new();
    *STAGES.get_or_init(|| kernel_define("MMQP_STAGES", 2))
}

/// Elements of one stage of the pipelined kernels for weights of `ty` (`MmqpLayout::K` in
/// mmqp.cu): 256 for blocks of 256 elements, `MMQP_SMALL_K` (128) for blocks of 32. On an
/// H200 (session 34, qwen2.5-7b Q8_0, 64 rows) stages of 128 decoded 1.18x faster than 256:
/// 8.70 against 10.24 ms a step (two blocks per multiprocessor instead of one); 8 rows equal.
fn pipe_stage(ty: GgmlType) -> usize {
    static SMALL: OnceLock<usize> = OnceLock::new();
    if ty.block_size() >= 256 {
        256
    } else {
        *SMALL.get_or_init(|| kernel_define("MMQP_SMALL_K", 128))
    }
}

/// 2-8 rows take the pipelined kernels with tiles of 8 tokens (`mmqp_<type>_n1`) instead of
/// 16: half the tensor-core products and activation copies. On an H100 (session 44, 8 rows,
/// ms a step) 7B Q4_K_M 4.244 / 4.240 -> 3.996 / 3.982, 7B Q8_0 5.027 / 5.027 -> 4.992 / 4.997.
/// `RUNIT_CUDA_MMQP_TILE8=0` keeps tiles of 16 (for measuring).
fn tile8_enabled() -> bool {
    static ENABLED: OnceLock<bool> = OnceLock::new();
    *ENABLED.get_or_init(|| std::env::var("RUNIT_CUDA_MMQP_TILE8").map_or(true, |v| v != "0"))
}

/// The largest tile of the pipelined kernels: 64 token rows, or `RUNIT_CUDA_MMQP_TILE` (16 or
/// 32: more token tiles, each weight block read once a tile; for measuring).
fn pipe_max_tile() -> usize {
    static TILE: OnceLock<usize> = OnceLock::new();
    *TILE.get_or_init(|| {
        std::env::var("RUNIT_CUDA_MMQP_TILE")
            .ok()
            .and_then(|v| v.parse().ok())
            .filter(|tile| TILE8_TOKENS.contains(tile))
            .unwrap_or(TILE8_TOKENS[TILE8_TOKENS.len() - 1])
    })
}

/// Threads of a pipelined kernel's block: the four computing warps (`MMQ_THREADS`) and
/// `MMQP_PRODUCERS` copying warps (mmqp.cu; 0 unless set in `RUNIT_CUDA_DEFINES`).
fn pipe_threads() -> u32 {
    static PRODUCERS: OnceLock<usize> = OnceLock::new();
    THREADS + 32 * *PRODUCERS.get_or_init(|| kernel_define("MMQP_PRODUCERS", 0)) as u32
}

/// Bytes between two rows' windows of a stage in shared memory (`MmqpLayout::W_STRIDE` in
/// mmqp.cu, whose comment says why and what it measured): for the super-block types, the
/// stage's blocks after their first byte's misalignment (a multiple of the largest power of
/// two, up to 16, dividing the bytes of the super-blocks rows are made of) in 16-byte chunks,
/// rounded up to an odd count; for blocks of 32, up to 15 bytes of misalignment either side.
pub fn pipe_row_stride(ty: GgmlType) -> usize {
    let stage = pipe_stage(ty);
    let stage_bytes = stage / ty.block_size() * ty.type_size();
    if ty.block_size() < 256 {
        return (stage_bytes + 30).next_multiple_of(16);
    }
    let align = (1 << ty.type_size().trailing_zeros()).min(16);
    let window = (16 - align + stage_bytes).next_multiple_of(16);
    if (window / 16) % 2 == 1 {
        window
    } else {
        window + 16
    }
}

/// Dynamic shared memory of a pipelined kernel for weights of `ty` and tiles of `tile`
/// tokens: per stage, each of the block's rows' window ([`pipe_row_stride`]) and the tile's
/// f16 activations.
pub fn pipe_shared_bytes(ty: GgmlType, tile: usize) -> u32 {
    let stage = pipe_stage(ty);
    (pipe_stages() * (BLOCK_ROWS * pipe_row_stride(ty) + tile * stage * 2)) as u32
}

/// The batched kernel that takes a matmul of `tokens` rows of `n_in` elements of a `ty`
/// weight, if any.
pub fn path(ty: GgmlType, kernels: &TypeKernels, tokens: usize, n_in: usize) -> Option<Path> {
    if !n_in.is_multiple_of(CHUNK) {
        return None;
    }
    if let Some(names) = kernels.mmq8.filter(|_| int8_enabled()) {
        if tokens > int8_max_tokens() {
            return None;
        }
        let variant = tile_variant(tokens);
        return Some(Path::Int8 {
            kernel: names[variant],
            tile: TILE8_TOKENS[variant],
        });
    }
    if let Some(names) = kernels
        .mmqp
        .filter(|_| pipe_enabled() && tokens <= pipe_max_tokens())
    {
        let tile8 = kernels
            .mmqp_tile8
            .filter(|_| tokens <= TILE8_MIN && tile8_enabled());
        let (kernel, tile) = match tile8 {
            Some(kernel) => (kernel, TILE8_MIN),
            None => {
                let variant = tile_variant(tokens.min(pipe_max_tile()));
                (names[variant], TILE8_TOKENS[variant])
            }
        };
        return Some(Path::Pipe {
            kernel,
            tile,
            shared: pipe_shared_bytes(ty, tile),
            stage: pipe_stage(ty),
        });
    }
    kernels
        .mmq
        .filter(|_| tokens <= MMQ_MAX_TOKENS)
        .map(Path::Half)
}

/// Quantized weights take the pipelined kernels for up to [`PIPE_MAX_TOKENS`] rows (or
/// `RUNIT_CUDA_MMQP_MAX`) unless `RUNIT_CUDA_MMQP=0`. On an H200 (qwen2.5-7b Q4_K_M,
/// docs/perf-cuda.md, session 28) they decoded 64 rows 1.55x faster than the GEMM path and 16
/// rows 1.6x faster than the f16 kernels of mmq.cu; on an H100 (session 43), after sessions
/// 41-42's kernel work, 128 rows 1.51x (11.35 against 17.10 ms a step) and 256 rows 1.02x,
/// and 128-token prompts 1.41x (pp128 12,427 against 8,783 tok/s), but 256-token prompts
/// 0.95x: the GEMM path keeps 129 rows and more.
fn pipe_enabled() -> bool {
    static ENABLED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ENABLED.get_or_init(|| std::env::var("RUNIT_CUDA_MMQP").map_or(true, |v| v != "0"))
}

/// Most token rows the pipelined kernels take by default (two tiles of 64); more take the
/// GEMM path.
pub const PIPE_MAX_TOKENS: usize = 128;

fn pipe_max_tokens() -> usize {
    static MAX: OnceLock<usize> = OnceLock::new();
    crate::env_count(&MAX, "RUNIT_CUDA_MMQP_MAX", PIPE_MAX_TOKENS)
}

/// `RUNIT_CUDA_MMQ8=1`: quantized weights take the int8 kernels (up to
/// [`MMQ8_MAX_TOKENS`] rows) instead of the f16 kernels (up to [`MMQ_MAX_TOKENS`]) and the
/// GEMM path. Off by default: on an H200 (qwen2.5-7b Q4_K_M, docs/perf-cuda.md) they decoded
/// 16 rows 11% and 64-256 rows 37-46% slower than those paths.
fn int8_enabled() -> bool {
    static ENABLED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ENABLED.get_or_init(|| std::env::var("RUNIT_CUDA_MMQ8").is_ok_and(|v| v == "1"))
}

/// [`MMQ8_MAX_TOKENS`], or `RUNIT_CUDA_MMQ8_MAX` (for measuring where the GEMM path wins).
fn int8_max_tokens() -> usize {
    static MAX: OnceLock<usize> = OnceLock::new();
    crate::env_count(&MAX, "RUNIT_CUDA_MMQ8_MAX", MMQ8_MAX_TOKENS)
}

/// Index into [`TILE8_TOKENS`] of the smallest tile that holds `tokens` (the largest beyond).
fn tile_variant(tokens: usize) -> usize {
    TILE8_TOKENS
        .iter()
        .position(|&tile| tokens <= tile)
        .unwrap_or(TILE8_TOKENS.len() - 1)
}

/// The launch shape of one batched matmul.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MmqPlan {
    pub row_blocks: usize,
    pub token_tiles: usize,
    /// Elements of each range of the rows' length; `splits` ranges.
    pub split: usize,
    pub splits: usize,
}

impl MmqPlan {
    /// The plan for `tokens` × `n_in` activations in tiles of `tile` tokens and `n_out`
    /// weight rows, aiming for `blocks` blocks (when the rows give fewer, their length is
    /// split into ranges).
    pub fn new(tokens: usize, tile: usize, n_in: usize, n_out: usize, blocks: usize) -> MmqPlan {
        let row_blocks = n_out.div_ceil(BLOCK_ROWS);
        let token_tiles = tokens.div_ceil(tile).max(1);
        // Ranges are whole K-quant super-blocks when the row holds them, else whole chunks.
        let granularity = if n_in.is_multiple_of(256) { 256 } else { CHUNK };
        let wanted = blocks
            .div_ceil(row_blocks * token_tiles)
            .clamp(1, (n_in / granularity).max(1));
        let split = n_in.div_ceil(wanted).next_multiple_of(granularity);
        MmqPlan {
            row_blocks,
            token_tiles,
            split,
            splits: n_in.div_ceil(split),
        }
    }
}

/// Runs batched kernel `path` for `op.tokens` rows (adding `op.bias` when it is not 0).
pub(super) fn run(
    backend: &CudaBackend,
    path: Path,
    op: &Operands,
    scratch: &mut Scratch,
) -> Result<(), BackendError> {
    let (name, tile, x, scales) = match path {
        Path::Half(name) => (name, TILE_TOKENS, half_input(backend, op, scratch)?, None),
        Path::Int8 { kernel, tile } => {
            let (aq, ads) = super::matvec::quantized_input(backend, op, scratch)?;
            (kernel, tile, aq, Some(ads))
        }
        Path::Pipe {
            kernel,
            tile,
            shared,
            stage,
        } => {
            let x = half_input(backend, op, scratch)?;
            return run_pipe(backend, kernel, (tile, shared, stage), x, op, scratch);
        }
    };
    let plan = MmqPlan::new(
        op.tokens,
        tile,
        op.n_in,
        op.n_out,
        BLOCKS_PER_MULTIPROCESSOR * backend.multiprocessors(OP)?,
    );
    let partial = if plan.splits > 1 {
        let values = op.tokens * op.n_out;
        ensure(
            backend,
            &mut scratch.partial,
            plan.splits * values,
            "split partial sums",
        )?
    } else {
        0
    };
    let config = LaunchConfig {
        grid_dim: (
            plan.row_blocks as u32,
            plan.token_tiles as u32,
            plan.splits as u32,
        ),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    };
    let (weight, row_bytes, n_in, n_out) = (
        op.weight,
        op.row_bytes as u64,
        op.n_in as u32,
        op.n_out as u32,
    );
    let (tokens, split) = (op.tokens as u32, plan.split as u32);
    match scales {
        None => launch_kernel!(
            backend, OP, "mmq.cu", name, config, weight, row_bytes, n_in, n_out, x, tokens, split,
            op.out, op.bias, partial
        )?,
        Some(ads) => launch_kernel!(
            backend, OP, "mmq8.cu", name, config, weight, row_bytes, n_in, n_out, x, ads, tokens,
            split, op.out, op.bias, partial
        )?,
    }
    if plan.splits == 1 {
        return Ok(());
    }
    // The ranges' partial sums, added in range order.
    let values = op.tokens * op.n_out;
    launch_kernel!(
        backend,
        OP,
        "mmq.cu",
        "mmq_merge",
        crate::grid_for(values),
        partial,
        values as u64,
        plan.splits as u32,
        n_out,
        op.bias,
        op.out
    )
}

/// The launch shape of a pipelined matmul: `blocks` × `token_tiles` blocks, each taking
/// `share` consecutive stages of the row blocks' stages (mmqp.cu's `mmqp`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PipePlan {
    pub blocks: usize,
    pub token_tiles: usize,
    pub share: usize,
    /// Most grid blocks sharing one row block: the partial sums' slots (1: no merge).
    pub slots: usize,
}

impl PipePlan {
    /// The plan for `tokens` rows of activations in tiles of `tile` tokens and `n_out`
    /// weight rows of `n_stages` stages on a device that holds `resident` blocks at once.
    /// Whole row blocks per grid block when that leaves the device as busy (a matrix of many
    /// row blocks), else equal shares of all the stages, one grid block per resident block
    /// (stream-K): each multiprocessor then gets the same work whatever the matrix's shape,
    /// where whole row blocks or ranges of equal splits leave a last wave that keeps a few
    /// multiprocessors busy while the others idle. Its cost: the row blocks cut between grid
    /// blocks are merged by `mmqp_merge`, and each cut restarts a block's pipeline (counted as
    /// two stages below). Shares are at least `n_stages / max_slots` stages (`usize::MAX`: no
    /// cap), so that a cut row block has at most about `max_slots` slots to merge (fewer,
    /// longer grid blocks): `RUNIT_CUDA_MMQP_SLOTS`, a measuring knob for the trade between a
    /// busier device and the merges' reads.
    pub fn new(
        tokens: usize,
        tile: usize,
        n_stages: usize,
        n_out: usize,
        resident: usize,
        max_slots: usize,
    ) -> PipePlan {
        let row_blocks = n_out.div_ceil(BLOCK_ROWS);
        let token_tiles = tokens.div_ceil(tile).max(1);
        let total = row_blocks * n_stages;
        let per_tile = (resident / token_tiles).max(1);
        // Stages of the busiest resident block, whole row blocks against equal shares.
        let whole = row_blocks.div_ceil(per_tile) * n_stages;
        let even = total.div_ceil(per_tile);
        let share = if 10 * (even + 2) < 9 * whole {
            even.max(n_stages.div_ceil(max_slots.max(1)))
        } else {
            n_stages
        };
        let first = |r: usize| r * n_stages / share;
        let last = |r: usize| ((r + 1) * n_stages - 1) / share;
        PipePlan {
            blocks: total.div_ceil(share),
            token_tiles,
            share,
            slots: (0..row_blocks)
                .map(|r| last(r) - first(r) + 1)
                .max()
                .unwrap_or(1),
        }
    }
}

/// A pipelined matmul launched without its merge: the partial sums of its cut row blocks at
/// `partial` (0 when no row block was cut), and its plan's stages and share.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Unmerged {
    pub partial: u64,
    pub n_stages: u32,
    pub share: u32,
}

/// Which scratch buffer holds a launch's partial sums: the gate's and up's of a batched
/// SwiGLU are merged together after both ran ([`super::gated_ffn_hidden`]), and Q's, K's and
/// V's of a batched [`super::matmul_qkv`] by one [`merge3`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Partials {
    First,
    Second,
    Third,
}

/// mmqp.cu's `MmqpMergeArgs` (same fields, order and C layout): one matmul of a `mmqp_merge3`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct MergeArgs {
    partial: u64,
    n_out: u32,
    n_stages: u32,
    share: u32,
    bias: u64,
    out: u64,
}

/// The merges of three pipelined matmuls launched by [`run_unmerged`] over the same `tokens`
/// rows, in one `mmqp_merge3` launch: each output as `mmqp_merge` leaves it (the same sums in
/// the same order). Nothing is launched when no row block of the three was cut.
pub(super) fn merge3(
    backend: &CudaBackend,
    tokens: usize,
    runs: [(&Operands, Unmerged); 3],
) -> Result<(), BackendError> {
    if runs.iter().all(|(_, unmerged)| unmerged.partial == 0) {
        return Ok(());
    }
    let values: usize = runs.iter().map(|(op, _)| tokens * op.n_out).sum();
    let [a, b, c] = runs.map(|(op, unmerged)| MergeArgs {
        partial: unmerged.partial,
        n_out: op.n_out as u32,
        n_stages: unmerged.n_stages,
        share: unmerged.share,
        bias: op.bias,
        out: op.out,
    });
    launch_kernel!(
        backend,
        OP,
        PIPE_FILE,
        "mmqp_merge3",
        crate::grid_for(values),
        tokens as u32,
        a,
        b,
        c
    )
}

/// Runs pipelined kernel `kernel` (tiles of `tile` tokens, `shared` bytes of dynamic shared
/// memory, stages of `stage` elements) on f16 activations at `x`, then its merge.
fn run_pipe(
    backend: &CudaBackend,
    kernel: &'static str,
    shape: (usize, u32, usize),
    x: u64,
    op: &Operands,
    scratch: &mut Scratch,
) -> Result<(), BackendError> {
    let unmerged = launch_pipe(backend, kernel, shape, x, op, scratch, Partials::First)?;
    if unmerged.partial == 0 {
        return Ok(());
    }
    launch_kernel!(
        backend,
        OP,
        PIPE_FILE,
        "mmqp_merge",
        crate::grid_for(op.tokens * op.n_out),
        unmerged.partial,
        op.tokens as u32,
        op.n_out as u32,
        unmerged.n_stages,
        unmerged.share,
        op.bias,
        op.out
    )
}

/// The pipelined kernel of `path` for `op` on its f16 input (converted unless held), its
/// merge left to the caller: `None` when `path` is not a pipelined one.
pub(super) fn run_unmerged(
    backend: &CudaBackend,
    path: Path,
    op: &Operands,
    scratch: &mut Scratch,
    partials: Partials,
) -> Result<Option<Unmerged>, BackendError> {
    let Path::Pipe {
        kernel,
        tile,
        shared,
        stage,
    } = path
    else {
        return Ok(None);
    };
    let x = half_input(backend, op, scratch)?;
    launch_pipe(
        backend,
        kernel,
        (tile, shared, stage),
        x,
        op,
        scratch,
        partials,
    )
    .map(Some)
}

/// Launches pipelined kernel `kernel` with its partial sums in `partials`.
fn launch_pipe(
    backend: &CudaBackend,
    kernel: &'static str,
    (tile, shared, stage): (usize, u32, usize),
    x: u64,
    op: &Operands,
    scratch: &mut Scratch,
    partials: Partials,
) -> Result<Unmerged, BackendError> {
    let resident = match scratch.resident.get(kernel) {
        Some(&resident) => resident,
        None => {
            // `RUNIT_CUDA_MMQP_BLOCKS` (blocks per multiprocessor) overrides the driver's
            // occupancy for experiments.
            static BLOCKS: OnceLock<usize> = OnceLock::new();
            let per_multiprocessor = match crate::env_count(&BLOCKS, "RUNIT_CUDA_MMQP_BLOCKS", 0) {
                0 => backend
                    .kernel(OP, PIPE_FILE, kernel)?
                    .occupancy_max_active_blocks_per_multiprocessor(
                        pipe_threads(),
                        shared as usize,
                        None,
                    )
                    .map_err(|e| backend.driver_error(OP, e))?
                    .max(1) as usize,
                blocks => blocks,
            };
            let resident = per_multiprocessor * backend.multiprocessors(OP)?;
            scratch.resident.insert(kernel, resident);
            resident
        }
    };
    let n_stages = op.n_in.div_ceil(stage);
    static SLOTS: OnceLock<usize> = OnceLock::new();
    let max_slots = match crate::env_count(&SLOTS, "RUNIT_CUDA_MMQP_SLOTS", 0) {
        0 => usize::MAX,
        slots => slots,
    };
    let plan = PipePlan::new(op.tokens, tile, n_stages, op.n_out, resident, max_slots);
    let values = op.tokens * op.n_out;
    let partial = if plan.slots > 1 {
        let slot = match partials {
            Partials::First => &mut scratch.partial,
            Partials::Second => &mut scratch.partial_second,
            Partials::Third => &mut scratch.partial_third,
        };
        ensure(backend, slot, plan.slots * values, "split partial sums")?
    } else {
        0
    };
    let config = LaunchConfig {
        grid_dim: (plan.blocks as u32, plan.token_tiles as u32, 1),
        block_dim: (pipe_threads(), 1, 1),
        shared_mem_bytes: shared,
    };
    let (weight, row_bytes, n_in, n_out) = (
        op.weight,
        op.row_bytes as u64,
        op.n_in as u32,
        op.n_out as u32,
    );
    let (tokens, share) = (op.tokens as u32, plan.share as u32);
    launch_kernel!(
        backend, OP, PIPE_FILE, kernel, config, weight, row_bytes, n_in, n_out, x, tokens, share,
        op.out, op.bias, partial
    )?;
    Ok(Unmerged {
        partial,
        n_stages: n_stages as u32,
        share,
    })
}

/// Converts the activations to f16 with the CPU's rounding for the weight type unless the
/// scratch already holds them; returns their address.
pub(super) fn half_input(
    backend: &CudaBackend,
    op: &Operands,
    scratch: &mut Scratch,
) -> Result<u64, BackendError> {
    let values = op.tokens * op.n_in;
    let base = ensure(backend, &mut scratch.half_x, values, "f16 activation")?;
    let current = super::Converted {
        x: op.x,
        tokens: op.tokens,
        row_len: op.n_in,
        generation: backend.write_generation(),
        scratch: base,
        mode: op.activation_mode,
    };
    if scratch.halved != Some(current) {
        launch_kernel!(
            backend,
            OP,
            "convert.cu",
            "activation_f16_cpu",
            super::gemm::convert_grid(values, op.activation_mode),
            op.x,
            base,
            values as u64,
            op.activation_mode
        )?;
        scratch.halved = Some(current);
        scratch.modes.insert(op.n_in, op.activation_mode);
    }
    Ok(base)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every stage of every row starts its blocks within `pipe_row_stride` of the 16-byte
    /// boundary before them, for row lengths of every granularity the pipelined kernels take;
    /// the super-block types' strides are odd chunk counts, and Q4_K's tiles of 16 tokens fit
    /// four blocks in an H100's or H200's 228 KB of shared memory a multiprocessor (1 KB
    /// reserved a block).
    #[test]
    fn pipe_windows_hold_every_stage() {
        use GgmlType::*;
        for ty in [
            Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS,
        ] {
            let stride = pipe_row_stride(ty);
            if ty.block_size() >= 256 {
                assert_eq!(stride % 32, 16, "{ty:?}: odd chunk count");
            }
            let stage = pipe_stage(ty);
            let stage_bytes = stage / ty.block_size() * ty.type_size();
            let unit = if ty.block_size() >= 256 { 256 } else { CHUNK };
            for n_in in (1..=9).map(|k| k * unit) {
                let row_bytes = n_in / ty.block_size() * ty.type_size();
                for row in 0..32 {
                    for start in (0..n_in).step_by(stage) {
                        let at = row * row_bytes + start / ty.block_size() * ty.type_size();
                        let bytes = stage.min(n_in - start) / ty.block_size() * ty.type_size();
                        let window = (at % 16 + bytes).next_multiple_of(16);
                        assert!(
                            window <= stride,
                            "{ty:?} n_in {n_in} row {row}: {window} > {stride}"
                        );
                    }
                }
            }
            assert!(
                stride <= (stage_bytes + 30).next_multiple_of(16) + 16,
                "{ty:?}"
            );
        }
        assert_eq!(pipe_row_stride(Q8_0), 176);
        assert_eq!(pipe_row_stride(Q4_K), 144);
        assert_eq!(pipe_row_stride(Q6_K), 240);
        assert!(4 * (pipe_shared_bytes(Q4_K, 16) as usize + 1024) <= 228 * 1024);
    }

    #[test]
    fn plans_cover_rows_tokens_and_length() {
        for (tokens, n_in, n_out) in [
            (9, 896, 896),
            (16, 3584, 3584),
            (16, 18944, 3584),
            (12, 3584, 18944),
            (13, 4864, 896),
            (9, 128, 1),
        ] {
            let plan = MmqPlan::new(tokens, TILE_TOKENS, n_in, n_out, 4 * 132);
            assert!(plan.token_tiles * TILE_TOKENS >= tokens);
            assert!(plan.row_blocks * BLOCK_ROWS >= n_out);
            assert!(plan.splits * plan.split >= n_in);
            assert!((plan.splits - 1) * plan.split < n_in, "no empty range");
            assert!(plan.split.is_multiple_of(CHUNK));
            if n_in.is_multiple_of(256) {
                assert!(plan.split.is_multiple_of(256));
            }
        }
        // A 3584-row matrix (28 row blocks) splits its length to fill 132 multiprocessors.
        let plan = MmqPlan::new(16, TILE_TOKENS, 18944, 3584, 4 * 132);
        assert!(plan.row_blocks * plan.splits >= BLOCKS_PER_MULTIPROCESSOR * 132);
        // Enough row blocks: one range.
        assert_eq!(
            MmqPlan::new(16, TILE_TOKENS, 3584, 151_936, 4 * 132).splits,
            1
        );
    }

    /// Walks a plan as mmqp.cu's `mmqp` and `mmqp_merge` do: every stage of every row block
    /// is taken by exactly one grid block, whole row blocks are those one grid block takes
    /// alone, and the slots of a cut row block are 0.. in the order of its stages.
    #[test]
    fn pipe_plans_take_every_stage_once() {
        for (tokens, n_in, n_out, resident, max_slots) in [
            (64, 3584, 18944, 264, usize::MAX),
            (64, 18944, 3584, 264, usize::MAX),
            (64, 18944, 3584, 132, usize::MAX),
            (64, 3584, 4608, 264, usize::MAX),
            (64, 3584, 151_936, 264, usize::MAX),
            (9, 896, 4864, 528, usize::MAX),
            (33, 4864, 896, 264, usize::MAX),
            (128, 3584, 3584, 264, usize::MAX),
            (64, 384, 128, 264, usize::MAX),
            (16, 128, 1, 8, usize::MAX),
            (64, 3584, 3584, 264, 2),
            (64, 3584, 512, 264, 3),
            (64, 18944, 3584, 264, 4),
        ] {
            let n_stages: usize = usize::div_ceil(n_in, 256);
            let plan = PipePlan::new(
                tokens,
                64.min(tokens.next_power_of_two()),
                n_stages,
                n_out,
                resident,
                max_slots,
            );
            if max_slots < usize::MAX {
                assert!(plan.slots <= max_slots + 1, "{max_slots} slots: {plan:?}");
            }
            let row_blocks = n_out.div_ceil(BLOCK_ROWS);
            let total = row_blocks * n_stages;
            let mut taken = vec![Vec::new(); row_blocks];
            for block in 0..plan.blocks {
                let (mut unit, end) = (block * plan.share, total.min((block + 1) * plan.share));
                assert!(unit < end, "no idle grid block");
                while unit < end {
                    let (row_block, first) = (unit / n_stages, unit % n_stages);
                    let last = n_stages.min(first + end - unit);
                    taken[row_block].push((block, first, last));
                    unit += last - first;
                }
            }
            for (r, segments) in taken.iter().enumerate() {
                let mut next = 0;
                for (slot, &(block, first, last)) in segments.iter().enumerate() {
                    assert_eq!(first, next, "stages in order, none missing");
                    assert_eq!(block - r * n_stages / plan.share, slot);
                    next = last;
                }
                assert_eq!(next, n_stages);
                let last_block = ((r + 1) * n_stages - 1) / plan.share;
                assert_eq!(segments.len(), last_block - r * n_stages / plan.share + 1);
                assert!(segments.len() <= plan.slots);
            }
            assert!(plan.blocks * plan.token_tiles <= resident.max(row_blocks * plan.token_tiles));
        }
        // qwen2.5-7b's gate at 64 rows, two blocks per multiprocessor: equal shares.
        let plan = PipePlan::new(64, 64, 14, 18944, 264, usize::MAX);
        assert_eq!((plan.blocks, plan.share), (259, 8));
        // The output matrix's 1,187 row blocks fill the device whole.
        assert_eq!(PipePlan::new(64, 64, 14, 151_936, 264, usize::MAX).slots, 1);
    }
}
