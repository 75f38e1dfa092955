//! Launch shapes of the attention kernels, from counts only (rows, spans, the block-table
//! stride), never from sequence lengths, so a captured graph stays valid as sequences grow.

/// The largest head dimension the kernels hold (`MAX_HEAD_DIM` in kernels/attention.cu).
pub const MAX_HEAD_DIM: usize = 256;
/// Threads of a decode block (`DECODE_THREADS`).
pub const DECODE_THREADS: u32 = 128;
/// Query heads one decode block serves at most (`MAX_HEADS_PER_BLOCK`).
pub const MAX_HEADS_PER_BLOCK: usize = 8;
/// Positions of the smallest decode chunk: one tile (`DECODE_TILE`). A block's tiles run one
/// after another, latency-bound (about 18 us a tile with one block an SM, H100, session 36),
/// so few rows at depth want many one-tile blocks.
pub const MIN_CHUNK: usize = 32;
/// Threads of every block of kernels/attention_mma.cu (`MMA_THREADS`).
pub const MMA_THREADS: u32 = 128;
/// Query rows of a tensor-core prefill block (`QUERY_TILE`).
pub const MMA_QUERY_TILE: usize = 64;
/// Query heads one tensor-core decode block serves at most (the 16 rows of an mma tile).
pub const MMA_MAX_HEADS_PER_BLOCK: usize = 16;
/// Positions of the smallest tensor-core decode chunk (one 16-position sub-tile per warp).
pub const MMA_MIN_CHUNK: usize = 64;
/// Blocks a multiprocessor the tensor-core decode plan aims at (its blocks hold ~35 KB of
/// shared memory: six fit).
pub const MMA_BLOCKS_PER_MULTIPROCESSOR: usize = 4;
/// Chunks a decode row of the tensor-core kernel is split into at most (longer capacities get
/// longer chunks; its in-kernel merge holds 64 weights a head).
pub const MMA_MAX_CHUNKS: usize = 64;
/// Chunks a decode row of attention_decode_* is split into at most (attention_combine's
/// `MAX_CHUNKS`), for batches of at most `CHUNK_ROWS / MAX_CHUNKS` rows.
pub const MAX_CHUNKS: usize = 512;
/// Rows × chunks a plan of attention_decode_* aims at: few rows get many short chunks (one row
/// at depth 16k kept 172 blocks of 4 warps busy on 12 tiles each, latency-bound: session 35),
/// many rows fewer (the partials' scratch stays at most 64 rows' of 64 chunks).
pub const CHUNK_ROWS: usize = 4096;
/// The fewest chunks a plan's cap falls to however many rows it has.
pub const MIN_CHUNKS_CAP: usize = 64;
/// Threads of the TurboQuant decode kernels (`TQ_THREADS` in kernels/attention.cu).
pub const TURBO_THREADS: u32 = 128;
/// Threads of the TurboQuant query preparation (`TQ_QUERY_THREADS`): a warp per (query head,
/// block of 64) of a head slice.
pub const TURBO_QUERY_THREADS: u32 = 512;
/// Positions of a TurboQuant decode tile (`TQ_TILE`): chunks are whole tiles.
pub const TURBO_MIN_CHUNK: usize = 64;
/// Blocks of the TurboQuant decode kernel a multiprocessor holds (`TQ_MIN_BLOCKS`: its
/// registers and [`TURBO_SHARED_BYTES`] allow three).
pub const TURBO_BLOCKS_PER_MULTIPROCESSOR: usize = 3;
/// Dynamic shared memory of a TurboQuant decode block (`TQ_SHARED_WORDS` words): the
/// prepared query, two stages of 64 keys (27 words) and values (22 words), scores, weights,
/// the values' norms and outliers, the key and value centroid-pair tables (256 float2 each)
/// and softmax state, and for the tensor-core scores (`TQ_MMA_SCORES`) the query's fragments
/// (2,048 words) and the key centroid pairs as f16 halves (512 words).
pub const TURBO_SHARED_BYTES: u32 = 4
    * (TURBO_QUERY_FLOATS
        + 2 * 64 * (27 + 22)
        + 8 * 64 * 2
        + 2 * 64 * (1 + 2 * 2)
        + 2 * 512
        + 24
        + 2048
        + 512) as u32;
/// Threads of the TurboQuant tensor-core decode (`TQ_MMA_THREADS`: four warps).
pub const TURBO_MMA_THREADS: u32 = 128;
/// Blocks of the TurboQuant tensor-core decode a multiprocessor holds (`TQ_MMA_MIN_BLOCKS`):
/// two. Its [`TURBO_MMA_SHARED_BYTES`] would allow three, but 168 registers a thread spill
/// (session 46, H100: 199 against 230 tok/s at depth 16384).
pub const TURBO_MMA_BLOCKS_PER_MULTIPROCESSOR: usize = 2;
/// Dynamic shared memory of a TurboQuant tensor-core decode block (`TQ_MMA_SHARED_WORDS`
/// words): the queries (R q and S R q as f16 rows of 136, plain as 8 × 128 f32), the key and
/// value centroid-pair tables (256 words each), the signs by nibble (32), the 8-point Hadamard
/// rows (32), the warps' maxima and sums (2 × 4 × 8); then each of the four warps' two stages
/// of 16 raw keys and values (49 words each), its key/value and sign tiles (16 rows of 136 f16
/// each), its values' outliers (16 × 2 × 2) and its key outliers' scores (16 × 8 f32).
pub const TURBO_MMA_SHARED_BYTES: u32 = 4
    * ((2 * 4 * 136 + 8 * 128 + 2 * 256 + 32 + 32 + 2 * 4 * 8)
        + 4 * (2 * 16 * 49 + 2 * 16 * 136 / 2 + 16 * 2 * 2 + 16 * 8)) as u32;
/// Dynamic shared memory of a TurboQuant tensor-core prefill block (`TQP_SHARED_WORDS`
/// words): the S R q rows and the key, sign and value tiles (64 rows of 136 f16 each), two
/// stages of 64 staged keys and values (49 words each), the keys' and values' outliers (64 × 2
/// × 2 each), the centroid-pair tables (256 words each), the signs by nibble (32) and the
/// 8-point Hadamard rows (32).
pub const TURBO_PREFILL_SHARED_BYTES: u32 =
    4 * (4 * 64 * 136 / 2 + 2 * 64 * 49 + 2 * 64 * 2 * 2 + 2 * 256 + 32 + 32) as u32;
/// f32 values of one (row, KV head, head slice)'s prepared queries (`TQ_Q_FLOATS`): rotated
/// queries (8 heads × 2 blocks × 68), plain queries (8 × 128), the tables' totals (16) and the
/// sketch's tables (2 blocks × 2,064).
pub const TURBO_QUERY_FLOATS: usize = 8 * 2 * 68 + 8 * 128 + 16 + 2 * 2064;
/// Average rows per span from which the prefill kernel is used.
pub const PREFILL_MIN_ROWS_PER_SPAN: usize = 8;
/// Rows from which the CPU reference computes in f32 only (its `TILED_MIN_ROWS`); below it,
/// with an f16 cache, it rounds queries to f16 first, and so do the kernels.
pub const CPU_TILED_MIN_ROWS: usize = 64;
/// The head_dim granularity of the CPU reference's tiled path.
pub const CPU_TILED_HEAD_DIM_MULTIPLE: usize = 16;
/// The most rows a decode grid holds (grid.z).
const MAX_GRID_Z: usize = 65_535;

/// Flash-decoding: per (row, kv head, head slice, chunk) partials, then a combine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DecodePlan {
    pub chunk_len: usize,
    pub chunks: usize,
    pub heads_per_block: usize,
    /// Blocks per kv head (its query heads, `heads_per_block` at a time).
    pub slices: usize,
}

impl DecodePlan {
    /// The plan for `rows` decode rows over caches whose tables reach `capacity` positions,
    /// with `group` query heads per kv head. A row's chunks depend on the batch's row count,
    /// so its sums' order does too (within the near-tie rule, as the matmuls' tiles).
    pub fn new(capacity: usize, group: usize, rows: usize) -> DecodePlan {
        DecodePlan::with(
            capacity,
            group,
            MIN_CHUNK,
            max_chunks(rows),
            MAX_HEADS_PER_BLOCK,
        )
    }

    /// The plan of the TurboQuant decode kernel (attention_decode_tq_codes): `chunk_len` 0,
    /// each row's chunks following its visible length (`row_chunk_len` in
    /// kernels/attention.cu: whole 64-key tiles), so that the grid's blocks all hold keys at
    /// any depth; `chunks` a row such that the grid fills [`TURBO_BLOCKS_PER_MULTIPROCESSOR`]
    /// blocks of each of `multiprocessors` once (a block pipelines its tiles), at most one
    /// tile a chunk at the table's capacity. With `mma` the same for the tensor-core decode
    /// (attention_decode_tq_mma_*, [`TURBO_MMA_BLOCKS_PER_MULTIPROCESSOR`] blocks a
    /// multiprocessor). `RUNIT_CUDA_TQ_CHUNKS` sets the chunks (a measuring knob).
    pub fn turbo(
        capacity: usize,
        group: usize,
        rows: usize,
        kv_heads: usize,
        multiprocessors: usize,
        mma: bool,
    ) -> DecodePlan {
        static CHUNKS: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
        let mut plan = DecodePlan::with(capacity, group, TURBO_MIN_CHUNK, 1, MAX_HEADS_PER_BLOCK);
        let blocks = if mma {
            TURBO_MMA_BLOCKS_PER_MULTIPROCESSOR
        } else {
            TURBO_BLOCKS_PER_MULTIPROCESSOR
        };
        let fill = plan.chunks_to_fill(blocks * multiprocessors, rows, kv_heads);
        let chunks = match crate::env_count(&CHUNKS, "RUNIT_CUDA_TQ_CHUNKS", 0) {
            0 => fill,
            knob => knob,
        };
        plan.chunks = chunks
            .min(max_chunks(rows))
            .min(capacity.max(1).div_ceil(TURBO_MIN_CHUNK))
            .max(1);
        plan.chunk_len = 0;
        plan
    }

    /// The plan of the tensor-core decode kernel (attention_decode_mma_*) for `rows` rows of
    /// `kv_heads` KV heads on `multiprocessors`: chunks of at least [`MMA_MIN_CHUNK`]
    /// positions, as few as still give [`MMA_BLOCKS_PER_MULTIPROCESSOR`] blocks a
    /// multiprocessor (a block's sub-tiles run one after another, so few rows want many short
    /// chunks; many rows fill the device with long ones, and a row within one chunk skips the
    /// merge). `RUNIT_CUDA_MMA_DECODE_FILL=0` (a measuring knob) keeps the shortest chunks
    /// whatever the rows.
    pub fn mma(
        capacity: usize,
        group: usize,
        rows: usize,
        kv_heads: usize,
        multiprocessors: usize,
    ) -> DecodePlan {
        static FILL: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
        let mut plan = DecodePlan::with(
            capacity,
            group,
            MMA_MIN_CHUNK,
            MMA_MAX_CHUNKS,
            MMA_MAX_HEADS_PER_BLOCK,
        );
        let wanted = plan
            .chunks_to_fill(
                MMA_BLOCKS_PER_MULTIPROCESSOR * multiprocessors,
                rows,
                kv_heads,
            )
            .max(1);
        if wanted < plan.chunks && crate::env_count(&FILL, "RUNIT_CUDA_MMA_DECODE_FILL", 1) != 0 {
            plan.chunk_len = capacity
                .max(1)
                .div_ceil(wanted)
                .next_multiple_of(MMA_MIN_CHUNK);
            plan.chunks = capacity.max(1).div_ceil(plan.chunk_len);
        }
        plan
    }

    /// Chunks a row that give a grid of `rows` rows and `kv_heads` KV heads (each in this
    /// plan's slices) at least `blocks` blocks.
    fn chunks_to_fill(&self, blocks: usize, rows: usize, kv_heads: usize) -> usize {
        blocks.div_ceil(rows.max(1) * kv_heads.max(1) * self.slices)
    }

    fn with(
        capacity: usize,
        group: usize,
        min_chunk: usize,
        max_chunks: usize,
        max_heads: usize,
    ) -> DecodePlan {
        let chunk_len = min_chunk * capacity.max(1).div_ceil(min_chunk * max_chunks);
        let slices = group.max(1).div_ceil(max_heads);
        DecodePlan {
            chunk_len,
            chunks: capacity.max(1).div_ceil(chunk_len),
            heads_per_block: group.max(1).div_ceil(slices),
            slices,
        }
    }

    /// f32 values of the accumulator partials for `rows` rows of `heads` heads.
    pub fn partial_values(&self, rows: usize, heads: usize, head_dim: usize) -> usize {
        rows * heads * self.chunks * head_dim
    }

    /// f32 values of the (max, sum) partials.
    pub fn stat_values(&self, rows: usize, heads: usize) -> usize {
        rows * heads * self.chunks * 2
    }

    /// Dynamic shared memory of a decode block: its queries.
    pub fn shared_bytes(&self, head_dim: usize) -> u32 {
        (self.heads_per_block * head_dim * 4) as u32
    }
}

/// Chunks a decode row of `rows` may be split into (attention_decode_* and _tq).
fn max_chunks(rows: usize) -> usize {
    (CHUNK_ROWS / rows.max(1)).clamp(MIN_CHUNKS_CAP, MAX_CHUNKS)
}

/// Tiled prefill: one block per (tile of `tile_rows` query rows of one span, head).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PrefillPlan {
    pub tile_rows: usize,
    pub key_tile: usize,
    /// Blocks along x: enough for every span's tiles.
    pub tiles: usize,
}

impl PrefillPlan {
    /// The plan for `total_rows` rows in `spans` spans. Each span needs
    /// `ceil(rows / tile_rows)` tiles, at most `ceil(total / tile_rows) + spans` in all.
    pub fn new(head_dim: usize, total_rows: usize, spans: usize) -> PrefillPlan {
        let (tile_rows, key_tile) = if head_dim <= 128 { (16, 32) } else { (8, 16) };
        PrefillPlan {
            tile_rows,
            key_tile,
            tiles: total_rows.div_ceil(tile_rows) + spans,
        }
    }

    /// Dynamic shared memory: queries, padded keys, values and cells (4-byte words).
    pub fn shared_bytes(&self, head_dim: usize) -> u32 {
        let words = self.tile_rows * head_dim
            + self.key_tile * (head_dim + 1)
            + self.key_tile * head_dim
            + self.key_tile;
        (words * 4) as u32
    }
}

/// True when the tensor-core kernels (kernels/attention_mma.cu) serve this cache: f16, with
/// head_dim 64 or 128. `RUNIT_CUDA_ATTENTION_MMA=0` turns them off (read at every call, so
/// that a measurement can compare both).
pub fn use_mma(f16: bool, head_dim: usize) -> bool {
    f16 && matches!(head_dim, 64 | 128)
        && std::env::var_os("RUNIT_CUDA_ATTENTION_MMA").is_none_or(|v| v != "0")
}

/// Blocks along x of the tensor-core prefill: enough for every span's 64-row tiles.
pub fn mma_prefill_tiles(total_rows: usize, spans: usize) -> usize {
    total_rows.div_ceil(MMA_QUERY_TILE) + spans
}

/// True when the prefill kernel should run: many rows per span, or more rows than a decode
/// grid holds. Both kernels are correct for any batch; this only picks the faster.
pub fn use_prefill(total_rows: usize, end_row: usize, spans: usize) -> bool {
    total_rows >= PREFILL_MIN_ROWS_PER_SPAN * spans.max(1) || end_row > MAX_GRID_Z
}

/// True when queries are rounded to f16 before the Q·K dot, as the CPU reference's one-chunk
/// path does for an f16 cache.
pub fn round_queries(f16_keys: bool, total_rows: usize, head_dim: usize) -> bool {
    f16_keys
        && (total_rows < CPU_TILED_MIN_ROWS
            || !head_dim.is_multiple_of(CPU_TILED_HEAD_DIM_MULTIPLE))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decode_chunks_cover_the_capacity() {
        // The smallest step table (64 blocks of 16): 32 chunks of one tile.
        let plan = DecodePlan::new(64 * 16, 4, 1);
        assert_eq!((plan.chunk_len, plan.chunks), (32, 32));
        assert_eq!((plan.heads_per_block, plan.slices), (4, 1));
        // 32k positions: chunks grow so that there are at most 64 for 64 rows or more, up to
        // MAX_CHUNKS for fewer rows.
        let plan = DecodePlan::new(2048 * 16, 8, 64);
        assert_eq!((plan.chunk_len, plan.chunks), (512, 64));
        let plan = DecodePlan::new(2048 * 16, 8, 256);
        assert_eq!((plan.chunk_len, plan.chunks), (512, 64));
        let plan = DecodePlan::new(2048 * 16, 8, 32);
        assert_eq!((plan.chunk_len, plan.chunks), (256, 128));
        let plan = DecodePlan::new(2048 * 16, 8, 1);
        assert_eq!((plan.chunk_len, plan.chunks), (64, 512));
        for (capacity, rows) in [1, 255, 256, 257, 8191, 8192, 8193, 100_000, 1 << 20]
            .into_iter()
            .flat_map(|capacity| [1, 8, 16, 17, 64, 1000].map(|rows| (capacity, rows)))
        {
            let plan = DecodePlan::new(capacity, 1, rows);
            assert!(plan.chunks <= MAX_CHUNKS, "{capacity}: {plan:?}");
            assert!(
                plan.chunks * rows <= CHUNK_ROWS.max(MIN_CHUNKS_CAP * rows),
                "{capacity}: {plan:?}"
            );
            assert!(
                plan.chunks * plan.chunk_len >= capacity,
                "{capacity}: {plan:?}"
            );
            assert!(
                (plan.chunks - 1) * plan.chunk_len < capacity.max(1),
                "{capacity}"
            );
            assert_eq!(plan.chunk_len % MIN_CHUNK, 0);
        }
    }

    #[test]
    fn turbo_plans_fill_the_device_once() {
        // One row of the 7B shape (4 KV heads, groups of 7) on 132 multiprocessors: 99
        // chunks, so 396 blocks (three a multiprocessor) at any depth.
        let plan = DecodePlan::turbo(17_000, 7, 1, 4, 132, false);
        assert_eq!((plan.chunk_len, plan.chunks), (0, 99));
        assert_eq!((plan.heads_per_block, plan.slices), (7, 1));
        // The tensor-core decode: two blocks a multiprocessor.
        let plan = DecodePlan::turbo(17_000, 7, 1, 4, 132, true);
        assert_eq!((plan.chunk_len, plan.chunks), (0, 66));
        // Small tables keep a tile a chunk at least; many rows keep their scratch bounded.
        assert_eq!(DecodePlan::turbo(100, 7, 1, 4, 132, false).chunks, 2);
        assert_eq!(DecodePlan::turbo(1 << 20, 7, 256, 4, 132, true).chunks, 1);
        for rows in [1, 3, 64, 4096] {
            let plan = DecodePlan::turbo(1 << 16, 12, rows, 2, 132, rows % 2 == 0);
            assert!(
                plan.chunks >= 1 && plan.chunks <= max_chunks(rows),
                "{rows}"
            );
            assert_eq!(plan.slices, 2);
        }
        assert!(TURBO_SHARED_BYTES <= 227 * 1024 / TURBO_BLOCKS_PER_MULTIPROCESSOR as u32);
        assert!(TURBO_MMA_SHARED_BYTES <= 227 * 1024 / TURBO_MMA_BLOCKS_PER_MULTIPROCESSOR as u32);
    }

    #[test]
    fn mma_plans_fit_the_kernels() {
        // One row of 4 KV heads on 132 multiprocessors: the shortest chunks.
        let plan = DecodePlan::mma(64 * 16, 7, 1, 4, 132);
        assert_eq!((plan.chunk_len, plan.chunks), (64, 16));
        // 64 rows: three chunks of 384 fill 4 blocks a multiprocessor (768 of 528).
        let plan = DecodePlan::mma(64 * 16, 7, 64, 4, 132);
        assert_eq!((plan.chunk_len, plan.chunks), (384, 3));
        // 1,024 rows at a capacity of 64 positions: one chunk.
        let plan = DecodePlan::mma(64, 7, 1024, 4, 132);
        assert_eq!((plan.chunk_len, plan.chunks), (64, 1));
        assert_eq!((plan.heads_per_block, plan.slices), (7, 1));
        let plan = DecodePlan::mma(1 << 20, 32, 1, 8, 132);
        assert!(plan.chunks <= MMA_MAX_CHUNKS && plan.chunks * plan.chunk_len >= 1 << 20);
        assert_eq!((plan.heads_per_block, plan.slices), (16, 2));
        for group in 1..=40 {
            let plan = DecodePlan::mma(4096, group, 8, 4, 132);
            assert!(plan.heads_per_block <= MMA_MAX_HEADS_PER_BLOCK, "{group}");
            assert!(plan.heads_per_block * plan.slices >= group, "{group}");
        }
        let spans: [&[usize]; 3] = [&[512], &[1, 1, 1], &[65, 63, 64, 1]];
        for rows in spans {
            let needed: usize = rows.iter().map(|r| r.div_ceil(MMA_QUERY_TILE)).sum();
            assert!(mma_prefill_tiles(rows.iter().sum(), rows.len()) >= needed);
        }
        assert!(!use_mma(false, 128));
        assert!(!use_mma(true, 80));
    }

    #[test]
    fn head_slices_are_balanced_and_cover_the_group() {
        for group in 1..=40 {
            let plan = DecodePlan::new(1024, group, 1);
            assert!(plan.heads_per_block <= MAX_HEADS_PER_BLOCK, "{group}");
            assert!(plan.heads_per_block * plan.slices >= group, "{group}");
            assert!(plan.heads_per_block * (plan.slices - 1) < group, "{group}");
        }
        let plan = DecodePlan::new(1024, 12, 1);
        assert_eq!((plan.heads_per_block, plan.slices), (6, 2));
    }

    #[test]
    fn prefill_tiles_bound_every_span_split() {
        let spans: [&[usize]; 4] = [&[100], &[1, 1, 1], &[17, 15, 33, 1], &[64, 64]];
        for rows in spans {
            for head_dim in [64, 128, 256] {
                let plan = PrefillPlan::new(head_dim, rows.iter().sum(), rows.len());
                let needed: usize = rows.iter().map(|r| r.div_ceil(plan.tile_rows)).sum();
                assert!(plan.tiles >= needed, "{rows:?}: {plan:?}");
                assert!(plan.shared_bytes(head_dim) <= 48 * 1024, "{head_dim}");
                assert!(plan.key_tile <= 32);
            }
        }
    }

    #[test]
    fn kernel_choice_follows_rows_per_span() {
        assert!(!use_prefill(1, 1, 1));
        assert!(!use_prefill(64, 64, 64));
        assert!(use_prefill(100, 100, 1));
        assert!(use_prefill(70, 70, 2));
        assert!(use_prefill(70_000, 70_000, 70_000));
        assert!(round_queries(true, 63, 64));
        assert!(!round_queries(true, 64, 64));
        assert!(round_queries(true, 66, 80 + 8));
        assert!(!round_queries(false, 1, 64));
    }
}
