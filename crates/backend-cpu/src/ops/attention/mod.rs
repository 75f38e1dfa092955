//! Causal grouped-query attention over the paged KV cache, mirroring ggml's CPU flash
//! attention (`ggml_compute_forward_flash_attn_ext_f16`), which the reference runs with:
//!
//! - a sequence's span of fewer than [`TILED_MIN_ROWS`] query rows takes ggml's one-chunk
//!   path ([`chunk`]): Q is rounded to the K cache type (f16) for the Q·K dot, the softmax is
//!   online in f32 key by key, and V is accumulated in the V cache type (f16 rounding at every
//!   step for an f16 cache);
//! - a larger span takes ggml's tiled path ([`tiled`]): everything in f32, keys in tiles of 64.
//!
//! A Q8_0 or Q4_0 cache always takes the one-chunk path (ggml tiles only f16 and f32
//! caches of one type): Q is quantized to Q8_0 (the K type's `vec_dot_type`) and dotted
//! with each key's blocks; each value row is dequantized to f32 and accumulated in f32.
//! TurboQuant caches take their own path (`crate::turbo::attention`).
//!
//! ggml picks the path from the query rows of the whole batch; llama.cpp's batch is one
//! sequence's span, so choosing per span gives each sequence of a multi-sequence batch the
//! numbers it gets alone.
//!
//! Keys are visited in position order (a single sequence in llama.cpp's cache sits in cell
//! order = position order). Work is split over (query row, head) pairs or (head, query tile).

mod chunk;
mod tiled;

use half::f16;
use runit_backend::{Attention, AttentionParams, BackendError, Buffer, SequenceSpan};

use runit_backend::{hadamard, KvRole};
use runit_quant::blocks::{BlockQ4_0, BlockQ8_0};
use runit_quant::dot::{dot_fn, gather_dot_fn, DotFn, GatherDotFn};
use runit_quant::GgmlType;

use crate::storage::{at_least, data, data_mut, kv, product, CpuKv};
use crate::CpuBackend;

const OP: &str = "attention";

/// Query rows (all spans together) from which ggml switches to its tiled f32 path.
pub const TILED_MIN_ROWS: usize = 64;

/// The head_dim granularity the tiled path needs (ggml: `DV % GGML_F32_EPR == 0`; the
/// reference machine has AVX-512, 16 lanes).
const TILED_HEAD_DIM_MULTIPLE: usize = 16;

/// One head of one cache row.
#[derive(Clone, Copy)]
pub enum CacheRow<'a> {
    F16(&'a [f16]),
    F32(&'a [f32]),
    /// `head_dim / 32` blocks.
    Q8_0(&'a [BlockQ8_0]),
    Q4_0(&'a [BlockQ4_0]),
}

/// Everything a worker needs to compute one query head.
pub struct Problem<'a> {
    pub q: &'a [f32],
    pub keys: &'a CpuKv,
    pub values: &'a CpuKv,
    pub kv_width: usize,
    pub heads: usize,
    pub group: usize,
    pub head_dim: usize,
    pub scale: f32,
    pub window: Option<usize>,
    /// The dot product of a quantized key with the query quantized to Q8_0 (ggml's
    /// `vec_dot` of the K cache type), for a Q8_0 or Q4_0 key cache.
    pub key_dot: Option<DotFn>,
    /// `key_dot` of many keys (rows of blocks of the cache) with several queries at once
    /// (the same bits per key and query).
    pub key_gather_dot: Option<GatherDotFn>,
    /// llama.cpp's Hadamard rotation of the queries (as of the keys) and of the output
    /// (as of the values): chunk lengths (`runit_backend::hadamard`).
    pub key_rotation: Option<usize>,
    pub value_rotation: Option<usize>,
}

impl Problem<'_> {
    /// Query vector of `row`, `head`.
    pub fn query(&self, row: usize, head: usize) -> &[f32] {
        let at = (row * self.heads + head) * self.head_dim;
        &self.q[at..at + self.head_dim]
    }

    /// First visible position of a query at `position`.
    pub fn first_visible(&self, position: usize) -> usize {
        self.window
            .map_or(0, |window| (position + 1).saturating_sub(window))
    }

    fn row<'c>(&self, cells: &'c CpuKv, cell: usize, head: usize) -> CacheRow<'c> {
        let at = cell * self.kv_width + head / self.group * self.head_dim;
        let blocks = at / 32..(at + self.head_dim) / 32;
        match cells {
            CpuKv::F16(data) => CacheRow::F16(&data[at..at + self.head_dim]),
            CpuKv::F32(data) => CacheRow::F32(&data[at..at + self.head_dim]),
            CpuKv::Q8_0(data) => CacheRow::Q8_0(&data[blocks]),
            CpuKv::Q4_0(data) => CacheRow::Q4_0(&data[blocks]),
            CpuKv::Turbo(_) => unreachable!("TurboQuant caches take their own path"),
        }
    }

    /// Key of query head `head` in `cell`.
    pub fn key(&self, cell: usize, head: usize) -> CacheRow<'_> {
        self.row(self.keys, cell, head)
    }

    /// Value of query head `head` in `cell`.
    pub fn value(&self, cell: usize, head: usize) -> CacheRow<'_> {
        self.row(self.values, cell, head)
    }
}

pub use chunk::RowDone;

/// The index of the span owning each of the first `end_row` rows (`usize::MAX` for none).
pub fn row_owners(spans: &[SequenceSpan], end_row: usize) -> Vec<usize> {
    let mut owner = vec![usize::MAX; end_row];
    for (index, span) in spans.iter().enumerate() {
        owner[span.first_row..span.first_row + span.rows].fill(index);
    }
    owner
}

/// Attention of every span's query rows; see [`runit_backend::PrimitiveOps::attention`].
pub fn attention(
    backend: &CpuBackend,
    attention: &Attention<'_>,
    out: &mut Buffer,
) -> Result<(), BackendError> {
    attention_reporting(backend, attention, out, None).map(|_| ())
}

/// [`attention`], calling `row_done(row, values)` with each row of the output as soon as
/// it is finished, on the thread that computed it, where the work is split by whole rows
/// (ggml's one-chunk path): returns the number of rows so reported (from row 0 up; the
/// others, if any, were not).
pub fn attention_reporting(
    backend: &CpuBackend,
    attention: &Attention<'_>,
    out: &mut Buffer,
    row_done: Option<&RowDone>,
) -> Result<usize, BackendError> {
    let &Attention {
        q,
        k_cache,
        v_cache,
        spans,
        params,
    } = attention;
    let &AttentionParams {
        heads,
        kv_heads,
        head_dim,
        scale,
        sliding_window,
    } = params;
    if kv_heads == 0 || !heads.is_multiple_of(kv_heads) {
        return Err(BackendError::Shape {
            op: OP,
            what: "kv_heads (a non-zero divisor of heads)",
            expected: heads,
            found: kv_heads,
        });
    }
    if head_dim == 0 {
        return Err(BackendError::Shape {
            op: OP,
            what: "head_dim (non-zero)",
            expected: 1,
            found: 0,
        });
    }
    if sliding_window == Some(0) {
        return Err(BackendError::Shape {
            op: OP,
            what: "sliding_window (non-zero)",
            expected: 1,
            found: 0,
        });
    }
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
    let keys = kv(k_cache, OP, "k cache")?;
    let values = kv(v_cache, OP, "v cache")?;
    let n_cells = k_cache.n_cells.min(v_cache.n_cells);
    let mut end_row = 0;
    for span in spans {
        let span_end = span.first_row.saturating_add(span.rows);
        end_row = end_row.max(span_end);
        let end_position = span.start_position.saturating_add(span.rows);
        span.check_cells(OP, 0..end_position, n_cells)?;
    }
    let needed = product(OP, "rows × heads × head_dim", end_row, q_width)?;
    let q = data(q, OP, "q")?;
    at_least(OP, "q elements", needed, q.len())?;
    let out = data_mut(out, OP, "out")?;
    at_least(OP, "out elements", needed, out.len())?;

    let problem = Problem {
        q,
        keys,
        values,
        kv_width,
        heads,
        group: heads / kv_heads,
        head_dim,
        scale,
        window: sliding_window,
        key_dot: match keys {
            CpuKv::Q8_0(_) => dot_fn(GgmlType::Q8_0, backend.simd),
            CpuKv::Q4_0(_) => dot_fn(GgmlType::Q4_0, backend.simd),
            _ => None,
        },
        key_gather_dot: match keys {
            CpuKv::Q8_0(_) => gather_dot_fn(GgmlType::Q8_0, backend.simd),
            CpuKv::Q4_0(_) => gather_dot_fn(GgmlType::Q4_0, backend.simd),
            _ => None,
        },
        key_rotation: hadamard::llama_rotation(k_cache.ty, KvRole::Keys, head_dim),
        value_rotation: hadamard::llama_rotation(v_cache.ty, KvRole::Values, head_dim),
    };
    for (cache, role) in [(k_cache, "k cache"), (v_cache, "v cache")] {
        if cache.head_dim != head_dim {
            return Err(BackendError::Shape {
                op: OP,
                what: "cache head_dim",
                expected: head_dim,
                found: cache.head_dim,
            });
        }
        if let Err(error) = cache.ty.check_head_dim(head_dim) {
            return Err(BackendError::Device {
                backend: "cpu".to_string(),
                op: OP,
                message: format!("{role}: {error}"),
            });
        }
    }
    let float_caches = |cells: &CpuKv| matches!(cells, CpuKv::F16(_) | CpuKv::F32(_));
    if matches!(keys, CpuKv::Turbo(_)) != matches!(values, CpuKv::Turbo(_)) {
        return Err(BackendError::Device {
            backend: "cpu".to_string(),
            op: OP,
            message: format!(
                "TurboQuant keys and values go together (keys {}, values {})",
                k_cache.ty, v_cache.ty
            ),
        });
    }
    if matches!(keys, CpuKv::Turbo(_)) {
        crate::turbo::attention::run(backend, &problem, spans, end_row, out);
        return Ok(0);
    }
    // Each span takes the path it would take alone (ggml decides per graph, and a lone
    // sequence's graph is its span), so a span's numbers do not depend on the others; a
    // pass whose rows must be computed as if alone takes the one-chunk path, a lone row's.
    // ggml tiles only f16/f32 caches of one type.
    let tiles_caches = float_caches(keys) && k_cache.ty == v_cache.ty;
    let takes_tiled = |span: &SequenceSpan| {
        tiles_caches
            && span.rows >= TILED_MIN_ROWS
            && head_dim.is_multiple_of(TILED_HEAD_DIM_MULTIPLE)
            && !backend.rows_alone()
    };
    let tiled_spans = spans.iter().filter(|span| takes_tiled(span)).count();

    if tiled_spans == spans.len() {
        tiled::run(backend, &problem, spans, out);
        Ok(0)
    } else if tiled_spans == 0 {
        Ok(chunk::run(backend, &problem, spans, end_row, out, row_done))
    } else {
        let (tiled, chunked): (Vec<SequenceSpan>, Vec<SequenceSpan>) =
            spans.iter().cloned().partition(|span| takes_tiled(span));
        tiled::run(backend, &problem, &tiled, out);
        chunk::run(backend, &problem, &chunked, end_row, out, None);
        Ok(0)
    }
}
