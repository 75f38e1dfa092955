//! Attention over the paged KV caches (`PrimitiveOps::attention`): the cells and query
//! tables on the host, then one dispatch per path (ggml's tiled and one-chunk paths; where
//! matmul is not exact, the split path's two in place of the one-chunk path's), the
//! queries and outputs rotated where the caches are (q8_0/q4_0 caches, llama.cpp's Hadamard
//! rotation); and the one-chunk path (or the split path's merge) that also rounds its output
//! for the output projection (`FusedOps::attention_output`).

use runit_backend::{
    hadamard, Attention, BackendError, Buffer, KvRole, KvType, OpResult, SequenceSpan, Weight,
};

use crate::batch::{self, Binding};
use crate::device::{at_least, buffer, kv};
use crate::kernels::{self, AttentionPath, KernelSource};
use crate::ops::MAX_GROUPS;
use crate::WgpuBackend;

/// Query rows of a span from which ggml switches to its tiled attention.
const TILED_MIN_ROWS: usize = 64;
/// Keys a tile of the split path (`TILE` in attention_split.wgsl): a query's keys are cut
/// into chunks of whole tiles.
const SPLIT_TILE: usize = 32;
/// Workgroups the split path's first pass aims at: a few per multiprocessor of a large GPU
/// (an H100 has 132), so that a decode step's few heads still fill it.
const SPLIT_GROUPS: usize = 1024;

fn f(value: f32) -> u32 {
    value.to_bits()
}

/// Whether `spans` take rows 0 .. `tokens`, each row once, in order (so that a kernel run
/// over the spans' rows meets every row).
pub(crate) fn covers_in_order(spans: &[SequenceSpan], tokens: usize) -> bool {
    let mut next = 0;
    for span in spans {
        if span.first_row != next {
            return false;
        }
        next += span.rows;
    }
    next == tokens
}

impl WgpuBackend {
    /// `PrimitiveOps::attention` of `attention` into `out`; with `next` (the output
    /// projection's weight and the tokens it multiplies), also the rounding of the output for
    /// that matmul in the attention's dispatch where it can (every row on the one-chunk path,
    /// in spans that cover the rows in order, no value rotation after, the mode's blocks
    /// within a head), left for the matmul as `activations_as_cpu` leaves its own.
    pub(crate) fn attention_rows(
        &self,
        attention: &Attention<'_>,
        out: &mut Buffer,
        next: Option<(&Weight, usize)>,
    ) -> OpResult {
        const OP: &str = "attention";
        let params = attention.params;
        let (heads, kv_heads, head_dim) = (params.heads, params.kv_heads, params.head_dim);
        if kv_heads == 0 || !heads.is_multiple_of(kv_heads) {
            return Err(BackendError::Shape {
                op: OP,
                what: "kv_heads (dividing heads)",
                expected: heads,
                found: kv_heads,
            });
        }
        let (k_cache, v_cache) = (attention.k_cache, attention.v_cache);
        let kv_width = kv_heads * head_dim;
        for cache in [k_cache, v_cache] {
            if cache.width != kv_width {
                return Err(BackendError::Shape {
                    op: OP,
                    what: "cache width (kv_heads × head_dim)",
                    expected: kv_width,
                    found: cache.width,
                });
            }
        }
        if head_dim > 256 {
            return Err(self.device_error(
                OP,
                format!("head_dim {head_dim} is not supported (at most 256)"),
            ));
        }
        let (k, v) = (kv(k_cache, OP, "k_cache")?, kv(v_cache, OP, "v_cache")?);
        let kernel = |path, rounds| {
            kernels::attention(k_cache.ty, v_cache.ty, path, rounds).ok_or_else(|| {
                let unsupported = [k_cache, v_cache]
                    .into_iter()
                    .find(|c| kernels::cache_code(c.ty).is_none());
                self.unsupported_kv(unsupported.unwrap_or(k_cache))
            })
        };
        kernel(AttentionPath::OneChunk, false)?;
        let q_width = heads * head_dim;
        // ggml tiles only f16/f32 caches of one type, spans of TILED_MIN_ROWS rows and more
        // (the CPU backend's `ops/attention`); a pass whose rows must get their one-row
        // numbers takes the one-chunk path throughout.
        let tiles_caches =
            k_cache.ty == v_cache.ty && matches!(k_cache.ty, KvType::F16 | KvType::F32);
        let rows_alone = self.rows_alone.load(std::sync::atomic::Ordering::Relaxed);
        let path = |span: &SequenceSpan| match tiles_caches
            && span.rows >= TILED_MIN_ROWS
            && head_dim.is_multiple_of(16)
            && !rows_alone
        {
            true => AttentionPath::Tiled,
            false => AttentionPath::OneChunk,
        };
        let mut cells = Vec::new();
        // Query entries of each path.
        let mut queries = [Vec::new(), Vec::new()];
        for span in attention.spans {
            let end = span.start_position.saturating_add(span.rows);
            span.check_cells(OP, 0..end, k_cache.n_cells.min(v_cache.n_cells))?;
            at_least(
                OP,
                "q elements (rows × heads × head_dim)",
                (span.first_row + span.rows) * q_width,
                attention.q.len(),
            )?;
            at_least(
                OP,
                "out elements (rows × heads × head_dim)",
                (span.first_row + span.rows) * q_width,
                out.len(),
            )?;
            let offset = cells.len() as u32;
            cells.extend((0..end).map(|position| span.cell(position) as u32));
            let queries = &mut queries[usize::from(path(span) == AttentionPath::OneChunk)];
            for r in 0..span.rows {
                let position = span.start_position + r;
                let lo = params
                    .sliding_window
                    .map_or(0, |window| (position + 1).saturating_sub(window));
                queries.extend([
                    (span.first_row + r) as u32,
                    offset,
                    lo as u32,
                    position as u32,
                ]);
            }
        }
        if queries.iter().all(Vec::is_empty) || heads == 0 {
            return Ok(());
        }
        // Queries are rotated as the keys were, the output back as the values were.
        let key_rotation = hadamard::llama_rotation(k_cache.ty, KvRole::Keys, head_dim);
        let value_rotation = hadamard::llama_rotation(v_cache.ty, KvRole::Values, head_dim);
        let rotated = match key_rotation {
            Some(n) => {
                let rows = attention.q.len() / q_width;
                let copy = self.scratch_copy(attention.q, rows * q_width, OP)?;
                self.rotate(buffer(&copy, OP, "q")?, n, 0, rows * q_width / n)?;
                Some(copy)
            }
            None => None,
        };
        let q = buffer(rotated.as_ref().unwrap_or(attention.q), OP, "q")?;
        let out = buffer(out, OP, "out")?;
        // The one-chunk rows take the split path (and its merge the rounding).
        let split = self.split_attention && !self.exact_matmul;
        let rounding = next
            .filter(|&(_, tokens)| {
                value_rotation.is_none()
                    && queries[0].is_empty()
                    && covers_in_order(attention.spans, tokens)
            })
            .and_then(|(w, tokens)| {
                let len = tokens * q_width;
                let (mode, heads_a_block) = self.head_rounding(w, len, head_dim)?;
                // Blocks over several heads: only the merge's groups of heads round them.
                let merge_heads = match heads_a_block {
                    1 => 1,
                    n if split && heads.is_multiple_of(n) => n,
                    _ => return None,
                };
                Some((mode, len, merge_heads))
            });
        let rounded = match rounding {
            Some((_, len, _)) => Some(self.rounding_target(len)?),
            None => None,
        };
        let words = [
            heads as u32,
            (heads / kv_heads) as u32,
            head_dim as u32,
            kv_width as u32,
            q_width as u32,
            f(params.scale),
            0,
            rounding.map_or(0, |(mode, _, _)| mode),
            // The split path's chunks a query (set per dispatch).
            0,
            // Heads a merge workgroup takes.
            rounding.map_or(1, |(_, _, merge_heads)| merge_heads as u32),
        ];
        let paths = [AttentionPath::Tiled, AttentionPath::OneChunk];
        for (path, queries) in paths.into_iter().zip(&queries) {
            if path == AttentionPath::OneChunk && split {
                let kernels = [
                    kernel(AttentionPath::Split, false)?,
                    kernel(AttentionPath::Merge, rounded.is_some())?,
                ];
                // One chunk a query: the first pass writes the output (and rounds it where
                // the mode's blocks lie within a head), no merge.
                let whole_heads = words[9] == 1;
                let final_kernel = match (self.split_final, rounded.is_some()) {
                    (true, false) => Some(kernel(AttentionPath::SplitFinal, false)?),
                    (true, true) if whole_heads => Some(kernel(AttentionPath::SplitFinal, true)?),
                    _ => None,
                };
                let buffers = [q, &k.buffer, &v.buffer, out];
                let split = Split {
                    kernels,
                    final_kernel,
                    words,
                    cells: &cells,
                    buffers,
                    rounded: rounded.as_ref(),
                };
                self.attend_in_chunks(&split, queries)?;
                continue;
            }
            for part in queries.chunks(4 * MAX_GROUPS) {
                let mut bindings = [
                    q.into(),
                    (&k.buffer).into(),
                    (&v.buffer).into(),
                    batch::table(&cells),
                    batch::table(part),
                    out.into(),
                    q.into(),
                ];
                let bound = with_rounding(&mut bindings, rounded.as_ref());
                let groups = [(part.len() / 4) as u32, heads as u32, 1];
                let kernel = kernel(path, rounded.is_some())?;
                self.dispatch_ranges(OP, kernel, &words, bound, groups)?;
            }
        }
        if let Some((mode, len, _)) = rounding {
            self.leave_rounding(out, len, mode);
        }
        if let Some(n) = value_rotation {
            for span in attention.spans {
                let first = span.first_row * q_width / n;
                self.rotate(out, n, first, span.rows * q_width / n)?;
            }
        }
        Ok(())
    }
}

/// `bindings` with its last slot (a placeholder) bound to the rounding target where the
/// kernel rounds its output for the next matmul, else without that slot.
fn with_rounding<'a, 'b>(
    bindings: &'b mut [Binding<'a>],
    rounded: Option<&'a wgpu::Buffer>,
) -> &'b [Binding<'a>] {
    let last = bindings.len() - 1;
    match rounded {
        Some(rounded) => {
            bindings[last] = rounded.into();
            bindings
        }
        None => &bindings[..last],
    }
}

/// What the split path's two passes bind and take (`WgpuBackend::attend_in_chunks`).
struct Split<'a> {
    /// The first pass and the merge.
    kernels: [KernelSource; 2],
    /// The first pass that writes the output itself, for queries whose keys are one chunk
    /// (attention_split_final.wgsl), where it serves.
    final_kernel: Option<KernelSource>,
    /// The one-chunk kernel's parameters (attention_params.wgsl); the chunks are set here.
    words: [u32; 10],
    /// The position -> cell tables of the sequences.
    cells: &'a [u32],
    /// q, the key and value caches, and the output.
    buffers: [&'a wgpu::Buffer; 4],
    /// Where the merge rounds its output for the output projection, if it does.
    rounded: Option<&'a wgpu::Buffer>,
}

impl WgpuBackend {
    /// Attention of `queries` (four words each: row, cells offset, first and last visible
    /// position) by the split path: the keys of each (query, head) cut into chunks of whole
    /// tiles, a workgroup each (`attention_split.wgsl`), as many chunks as make about
    /// SPLIT_GROUPS workgroups, each chunk's softmax sums in a record of `attention_partials`;
    /// then a workgroup a (query, group of `words[9]` heads) merges them
    /// (`attention_merge.wgsl`). Queries are taken in groups whose records fit one binding.
    fn attend_in_chunks(&self, split: &Split<'_>, queries: &[u32]) -> OpResult {
        const OP: &str = "attention";
        let [q, k, v, out] = split.buffers;
        let (heads, head_dim) = (split.words[0] as usize, split.words[2] as usize);
        let record_bytes = (head_dim + 2) * 4;
        let per_binding = self.max_binding as usize / (heads * record_bytes);
        for part in queries.chunks(4 * per_binding.clamp(1, MAX_GROUPS)) {
            let count = part.len() / 4;
            let longest = part
                .chunks(4)
                .map(|entry| (entry[3] + 1 - entry[2]) as usize)
                .max()
                .unwrap_or(1);
            let chunks = longest
                .div_ceil(SPLIT_TILE)
                .min(SPLIT_GROUPS.div_ceil(count * heads))
                .min(per_binding / count)
                .max(1);
            let mut words = split.words;
            words[8] = chunks as u32;
            if let Some(kernel) = split.final_kernel.filter(|_| chunks == 1) {
                let mut bindings = [
                    q.into(),
                    k.into(),
                    v.into(),
                    batch::table(split.cells),
                    batch::table(part),
                    out.into(),
                    out.into(),
                ];
                let bound = with_rounding(&mut bindings, split.rounded);
                let groups = [1, heads as u32, count as u32];
                self.dispatch_ranges(OP, kernel, &words, bound, groups)?;
                continue;
            }
            let bytes = (count * heads * chunks * record_bytes) as u64;
            let partials = self.attention_partials(bytes)?;
            let bindings = [
                q.into(),
                k.into(),
                v.into(),
                batch::table(split.cells),
                batch::table(part),
                (&partials).into(),
            ];
            let groups = [chunks as u32, heads as u32, count as u32];
            self.dispatch_ranges(OP, split.kernels[0], &words, &bindings, groups)?;
            let mut bindings = [
                (&partials).into(),
                batch::table(part),
                out.into(),
                out.into(),
            ];
            let bound = with_rounding(&mut bindings, split.rounded);
            let merge_heads = words[9] as usize;
            let groups = [count as u32, (heads / merge_heads) as u32, 1];
            self.dispatch_ranges(OP, split.kernels[1], &words, bound, groups)?;
        }
        Ok(())
    }

    /// The split path's record buffer, of at least `bytes` (grown by halves, so that its bind
    /// groups stay the same from one decode step to the next).
    fn attention_partials(&self, bytes: u64) -> Result<wgpu::Buffer, BackendError> {
        let mut partials = self
            .attention_partials
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if let Some(buffer) = partials.as_ref().filter(|b| b.size() >= bytes) {
            return Ok(buffer.clone());
        }
        let size = partials
            .as_ref()
            .map_or(bytes, |b| bytes.max(b.size() + b.size() / 2))
            .min(self.max_binding.max(bytes));
        let buffer = self.new_buffer("attention", size)?;
        *partials = Some(buffer.clone());
        Ok(buffer)
    }
}
