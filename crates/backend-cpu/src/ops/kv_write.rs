//! Writing a step's keys and values into the paged cache: rounded to f16 for an f16 cache
//! (nearest even, as ggml's `set_rows`/`cpy` to F16), quantized to ggml's blocks for Q8_0
//! and Q4_0 (as its `set_rows`, after llama.cpp's Hadamard rotation: `runit_backend::hadamard`), encoded for TurboQuant (`crate::turbo`).

use runit_backend::{hadamard, turbo, BackendError, KvCache, KvWrite, SequenceSpan};
use runit_quant::quantize::q8::quantize_row_q8_0_activation;
use runit_quant::quantize::quantize_row_q4_0;

use crate::storage::{at_least, data, kv, kv_mut, product, CpuKv};
use crate::vector;

const OP: &str = "kv_write";

/// Copies rows `span.first_row ..` of `k` and `v` into the cells of positions
/// `span.start_position ..` of each span.
pub fn kv_write(write: KvWrite<'_>) -> Result<(), BackendError> {
    let KvWrite {
        k,
        v,
        k_cache,
        v_cache,
        spans,
    } = write;
    let k = data(k, OP, "k")?;
    let v = data(v, OP, "v")?;
    check(k, k_cache, spans)?;
    check(v, v_cache, spans)?;
    write_one(k, k_cache, spans, "k")?;
    write_one(v, v_cache, spans, "v")
}

/// Most rows (over all spans) whose destinations [`prefetch_destinations`] asks for.
const PREFETCH_MAX_ROWS: usize = 64;

/// Asks for the cache lines that [`kv_write`] will store the spans' rows to, in both
/// caches, in a writable state (`prefetchw`), without waiting for them: a decode step's new
/// cells are cold (last written a context ago, if ever), and stored to one after another
/// their ownership requests took about 5 us per layer for eight SmolLM2 rows, every other
/// thread waiting. Issued before the work that precedes the write (the RoPE), they
/// overlap it. Cells outside a cache or a block table are skipped (`kv_write` reports
/// them); batches of more than [`PREFETCH_MAX_ROWS`] rows are left alone (their write is
/// a small part of their step).
pub fn prefetch_destinations(k_cache: &KvCache, v_cache: &KvCache, spans: &[SequenceSpan]) {
    if spans.iter().map(|span| span.rows).sum::<usize>() > PREFETCH_MAX_ROWS {
        return;
    }
    for cache in [k_cache, v_cache] {
        let Ok(cells) = kv(cache, OP, "cache") else {
            continue;
        };
        let width = cache.width;
        for span in spans {
            for position in span.start_position..span.start_position + span.rows {
                let Some(&block) = span.block_table.get(position / span.block_size.max(1)) else {
                    continue;
                };
                let cell = block as usize * span.block_size + position % span.block_size.max(1);
                if let Some(row) = cells.row_bytes(cell, width) {
                    prefetch_for_write(row.as_ptr(), row.len());
                }
            }
        }
    }
}

/// `prefetchw` of every cache line of the `len` bytes at `start`: a hint that never
/// faults and changes no value.
fn prefetch_for_write(start: *const u8, len: usize) {
    #[cfg(target_arch = "x86_64")]
    for offset in (0..len).step_by(64) {
        // SAFETY: `prefetchw` is a hint: it reads and writes no memory architecturally and
        // raises no fault whatever the address (here inside the cache row, through
        // `wrapping_add`); the block uses no stack and keeps the flags.
        unsafe {
            std::arch::asm!(
                "prefetchw [{}]",
                in(reg) start.wrapping_add(offset),
                options(nostack, preserves_flags, readonly)
            )
        };
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (start, len);
}

/// Fails unless every span's rows are in `src` and its cells in `cache`.
fn check(src: &[f32], cache: &KvCache, spans: &[SequenceSpan]) -> Result<(), BackendError> {
    kv(cache, OP, "cache")?;
    for span in spans {
        let end_row = span.first_row.saturating_add(span.rows);
        let needed = product(OP, "rows × cache width", end_row, cache.width)?;
        at_least(OP, "k/v elements (rows × cache width)", needed, src.len())?;
        let end = span.start_position.saturating_add(span.rows);
        span.check_cells(OP, span.start_position..end, cache.n_cells)?;
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
    let rotation = hadamard::llama_rotation(cache.ty, cache.role, cache.head_dim);
    let mut rotated = vec![0.0f32; if rotation.is_some() { width } else { 0 }];
    let cells = kv_mut(cache, OP, what)?;
    for span in spans {
        for r in 0..span.rows {
            let mut row = &src[(span.first_row + r) * width..(span.first_row + r + 1) * width];
            if let Some(n) = rotation {
                rotated.copy_from_slice(row);
                hadamard::rotate_chunks(&mut rotated, n);
                row = &rotated;
            }
            let at = span.cell(span.start_position + r) * width;
            let cell = span.cell(span.start_position + r);
            match cells {
                CpuKv::F16(cells) => vector::to_f16(row, &mut cells[at..at + width]),
                CpuKv::F32(cells) => cells[at..at + width].copy_from_slice(row),
                // ggml-cpu's `set_rows` quantizes with the type's `from_float`: the x86
                // SIMD rounding for Q8_0 (as activations), the reference one for Q4_0.
                CpuKv::Q8_0(cells) => {
                    quantize_row_q8_0_activation(row, &mut cells[at / 32..(at + width) / 32])
                }
                CpuKv::Q4_0(cells) => {
                    quantize_row_q4_0(row, &mut cells[at / 32..(at + width) / 32])
                }
                CpuKv::Turbo(cells) => {
                    let bytes = cells.row_bytes();
                    let dst = &mut cells.bytes[cell * bytes..(cell + 1) * bytes];
                    match &cells.mean {
                        Some(mean) => {
                            let centered: Vec<f32> =
                                row.iter().zip(mean).map(|(v, m)| v - m).collect();
                            turbo::encode_row(cells.layout, &centered, dst);
                        }
                        None => turbo::encode_row(cells.layout, row, dst),
                    }
                }
            }
        }
    }
    Ok(())
}
