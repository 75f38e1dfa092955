//! Writing a step's keys and values into the paged cache (rounded to f16 for an f16 cache,
//! nearest even, as ggml's `set_rows`/`cpy` to F16).

use runit_backend::{BackendError, Buffer, KvCache, SequenceSpan};

use crate::storage::{at_least, data, kv, kv_mut, product, CpuKv};
use crate::vector;

const OP: &str = "kv_write";

/// Copies rows `span.first_row ..` of `k` and `v` into the cells of positions
/// `span.start_position ..` of each span.
pub fn kv_write(
    k: &Buffer,
    v: &Buffer,
    k_cache: &mut KvCache,
    v_cache: &mut KvCache,
    spans: &[SequenceSpan],
) -> Result<(), BackendError> {
    let k = data(k, OP, "k")?;
    let v = data(v, OP, "v")?;
    check(k, k_cache, spans)?;
    check(v, v_cache, spans)?;
    write_one(k, k_cache, spans, "k")?;
    write_one(v, v_cache, spans, "v")
}

/// Fails unless every span's rows are in `src` and its cells in `cache`.
fn check(src: &[f32], cache: &KvCache, spans: &[SequenceSpan]) -> Result<(), BackendError> {
    kv(cache, OP, "cache")?;
    for span in spans {
        let end_row = span.first_row.saturating_add(span.rows);
        let needed = product(OP, "rows × cache width", end_row, cache.width)?;
        at_least(OP, "k/v elements (rows × cache width)", needed, src.len())?;
        let end = span.start_position.saturating_add(span.rows);
        check_cells(OP, span, span.start_position..end, cache.n_cells)?;
    }
    Ok(())
}

fn write_one(
    src: &[f32],
    cache: &mut KvCache,
    spans: &[SequenceSpan],
    what: &'static str,
) -> Result<(), BackendError> {
    let width = cache.width;
    let cells = kv_mut(cache, OP, what)?;
    for span in spans {
        for r in 0..span.rows {
            let row = &src[(span.first_row + r) * width..(span.first_row + r + 1) * width];
            let at = span.cell(span.start_position + r) * width;
            match cells {
                CpuKv::F16(cells) => vector::to_f16(row, &mut cells[at..at + width]),
                CpuKv::F32(cells) => cells[at..at + width].copy_from_slice(row),
            }
        }
    }
    Ok(())
}

/// Fails unless every position in `positions` maps through the span's block table to a
/// cell below `n_cells`.
pub fn check_cells(
    op: &'static str,
    span: &SequenceSpan,
    positions: std::ops::Range<usize>,
    n_cells: usize,
) -> Result<(), BackendError> {
    if positions.is_empty() {
        return Ok(());
    }
    if span.block_size == 0 {
        return Err(BackendError::Shape {
            op,
            what: "block_size (non-zero)",
            expected: 1,
            found: 0,
        });
    }
    let last_block = (positions.end - 1) / span.block_size;
    at_least(
        op,
        "block table entries",
        last_block + 1,
        span.block_table.len(),
    )?;
    for block in &span.block_table[positions.start / span.block_size..=last_block] {
        let end = (*block as usize + 1).saturating_mul(span.block_size);
        at_least(op, "cache cells (block end)", end, n_cells)?;
    }
    Ok(())
}
