//! Writing a step's keys and values into the paged KV cache (kernels/kv.cu): row `t` of
//! each span goes to the cell its position maps to through the span's block table, read
//! from the step buffer, rounded to f16 (nearest even) for an f16 cache, quantized to ggml's
//! blocks for q8_0/q4_0, encoded by [`super::turbo`] for TurboQuant.

use cudarc::driver::LaunchConfig;
use runit_backend::{hadamard, BackendError, Buffer, KvCache, KvType, KvWrite, SequenceSpan};

use super::elementwise::{product, threads_for, to_u32};
use crate::memory::{buffer_ptr, check_len, kv_ptr};
use crate::{launch, CudaBackend};

const OP: &str = "kv_write";

/// Copies rows `span.first_row ..` of `k` and `v` into the cells of positions
/// `span.start_position ..` of each span.
pub fn kv_write(backend: &CudaBackend, write: KvWrite<'_>) -> Result<(), BackendError> {
    let KvWrite {
        k,
        v,
        k_cache,
        v_cache,
        spans,
    } = write;
    check(k, k_cache, spans)?;
    check(v, v_cache, spans)?;
    check_block_sizes(OP, spans)?;
    let rows = end_row(spans);
    if rows == 0 {
        return Ok(());
    }
    let step = backend.step_inputs(OP, None, None, Some(spans), None)?;
    for (src, cache, what) in [(k, &*k_cache, "k"), (v, &*v_cache, "v")] {
        let config = LaunchConfig {
            grid_dim: (to_u32(OP, "rows", rows)?, 1, 1),
            block_dim: (threads_for(cache.width, 256), 1, 1),
            shared_mem_bytes: 0,
        };
        let src = buffer_ptr(OP, what, src)?;
        let cells = kv_ptr(OP, what, cache)?;
        let width = to_u32(OP, "cache width", cache.width)?;
        let rows = rows as u32;
        let n_cells = cache.n_cells as u64;
        match cache.ty {
            KvType::F16 => launch!(
                backend,
                OP,
                "kv.cu",
                "kv_write_f16",
                config,
                cells,
                src,
                step.ptr,
                width,
                rows,
                n_cells
            )?,
            KvType::F32 => launch!(
                backend,
                OP,
                "kv.cu",
                "kv_write_f32",
                config,
                cells,
                src,
                step.ptr,
                width,
                rows,
                n_cells
            )?,
            KvType::Q8_0 | KvType::Q4_0 => {
                let name = if cache.ty == KvType::Q8_0 {
                    "kv_write_q8_0"
                } else {
                    "kv_write_q4_0"
                };
                let rotation = hadamard::llama_rotation(cache.ty, cache.role, cache.head_dim);
                let config = LaunchConfig {
                    shared_mem_bytes: to_u32(OP, "row bytes", cache.width * 4)?,
                    ..config
                };
                launch!(
                    backend,
                    OP,
                    "kv.cu",
                    name,
                    config,
                    cells,
                    src,
                    step.ptr,
                    width,
                    rows,
                    n_cells,
                    rotation.unwrap_or(0) as u32
                )?
            }
            KvType::Tq4 | KvType::Tq3 => {
                super::turbo::kv_write(backend, OP, src, cache, &step, rows as usize)?
            }
        }
    }
    Ok(())
}

/// One past the last row any span owns.
pub(crate) fn end_row(spans: &[SequenceSpan]) -> usize {
    spans
        .iter()
        .map(|span| span.first_row.saturating_add(span.rows))
        .max()
        .unwrap_or(0)
}

/// Fails unless every span's rows are in `src` and its cells in `cache`.
fn check(src: &Buffer, cache: &KvCache, spans: &[SequenceSpan]) -> Result<(), BackendError> {
    for span in spans {
        let end_row = span.first_row.saturating_add(span.rows);
        let needed = product(OP, "rows × cache width", end_row, cache.width)?;
        check_len(OP, "k/v elements (rows × cache width)", src, needed)?;
        let end = span.start_position.saturating_add(span.rows);
        span.check_cells(OP, span.start_position..end, cache.n_cells)?;
    }
    Ok(())
}

/// Fails unless every span attends to cells the caches hold (positions up to its last row's)
/// and every span has one block size; returns one past the last row any span owns.
pub(crate) fn attended_end_row(
    op: &'static str,
    spans: &[SequenceSpan],
    k_cache: &KvCache,
    v_cache: &KvCache,
) -> Result<usize, BackendError> {
    let n_cells = k_cache.n_cells.min(v_cache.n_cells);
    for span in spans {
        let end_position = span.start_position.saturating_add(span.rows);
        span.check_cells(op, 0..end_position, n_cells)?;
    }
    check_block_sizes(op, spans)?;
    Ok(end_row(spans))
}

/// The step buffer holds one block size (the first span's): every span must use it.
pub(crate) fn check_block_sizes(
    op: &'static str,
    spans: &[SequenceSpan],
) -> Result<(), BackendError> {
    let Some(first) = spans.first() else {
        return Ok(());
    };
    match spans.iter().find(|s| s.block_size != first.block_size) {
        Some(other) => Err(BackendError::Shape {
            op,
            what: "block_size (the same for every span)",
            expected: first.block_size,
            found: other.block_size,
        }),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn span(first_row: usize, rows: usize, start: usize, table: Vec<u32>) -> SequenceSpan {
        SequenceSpan {
            first_row,
            rows,
            start_position: start,
            block_table: table,
            block_size: 4,
        }
    }

    #[test]
    fn short_tables_and_far_blocks_are_rejected() {
        // Positions 0..6 need two blocks of 4.
        let short = span(0, 6, 0, vec![0]);
        assert!(matches!(
            short.check_cells(OP, 0..6, 16),
            Err(BackendError::Shape {
                expected: 2,
                found: 1,
                ..
            })
        ));
        let far = span(0, 6, 0, vec![0, 4]);
        assert!(matches!(
            far.check_cells(OP, 0..6, 16),
            Err(BackendError::Shape {
                expected: 20,
                found: 16,
                ..
            })
        ));
        assert!(span(0, 6, 0, vec![3, 1]).check_cells(OP, 0..6, 16).is_ok());
        assert!(short.check_cells(OP, 6..6, 16).is_ok());
    }

    #[test]
    fn spans_must_share_a_block_size() {
        let mut other = span(1, 1, 0, vec![1]);
        assert!(check_block_sizes(OP, &[span(0, 1, 0, vec![0]), other.clone()]).is_ok());
        other.block_size = 8;
        assert!(check_block_sizes(OP, &[span(0, 1, 0, vec![0]), other]).is_err());
        assert_eq!(end_row(&[span(3, 2, 0, vec![]), span(0, 1, 0, vec![])]), 5);
    }
}
