//! Sampling on the device (kernels/sample.cu): each row's token drawn as
//! [`runit_backend::sample::sample_row`] draws it on the host (the same biases, penalties,
//! top-k order, f64 softmax, top-p, min-p and pick by mass at the host's uniform), so a
//! sampled decode step downloads two numbers per row instead of the vocabulary. CUDA's f64
//! `exp` may differ from the host's by an ulp, which moves a draw only when the uniform lies
//! within that ulp of a boundary between two tokens' masses; everything else is the same
//! arithmetic in the same order, down to the sign and payload of a NaN the biases or
//! penalties produce (the GPU's own NaN is positive, which ranks first in the candidates'
//! total order where the host's negative NaN ranks last).
//!
//! Rows the device does not sample go to the host, which samples them with `sample_row`
//! from the downloaded logits (the same tokens, the old cost): rows whose biases force
//! tokens (+100, which bans the rest of the vocabulary), and non-greedy rows that keep more
//! than [`K_MAX`] candidates (top-k of 0 or above `K_MAX` on a wider row).

use cudarc::driver::LaunchConfig;
use runit_backend::sample::{forces_tokens, min_p_log, sample_row, RowSampling, Sampled};
use runit_backend::{BackendError, Buffer, Device};

use super::elementwise::{product, to_u32};
use super::pick::{MAX_PARTS, SLICE};
use crate::memory::{buffer_ptr, check_len};
use crate::{device_address, launch, CudaBackend};

const OP: &str = "sample_pick";

/// Most candidates the device keeps for a row (`SAMPLE_K_MAX` in kernels/sample.cu).
pub const K_MAX: usize = 1024;
/// u32 fields of a row's header (`SAMPLE_HEADER`; the `H_*` offsets in the kernel).
const HEADER: usize = 16;
/// u32 fields of a row's selection state (`SAMPLE_STATE`).
const STATE: usize = 8;
/// Rounds of the radix select: eight bits of the 64-bit key each.
const ROUNDS: usize = 8;
const FLAG_GREEDY: u32 = 1;
const FLAG_PENALTIES: u32 = 2;
const FLAG_HOST: u32 = 4;

/// How many candidates top-k keeps of a row of `width` logits (every one without top-k).
fn kept_by_top_k(row: &RowSampling<'_>, width: usize) -> usize {
    match row.filters.top_k {
        0 => width,
        k => k.min(width),
    }
}

/// True when the device samples `row` (of `width` logits); the host samples the others.
pub fn samples_on_device(row: &RowSampling<'_>, width: usize) -> bool {
    !forces_tokens(row.logit_bias)
        && (row.filters.is_greedy() || kept_by_top_k(row, width) <= K_MAX)
}

/// The bits of the NaN this host's f32 arithmetic gives for an invalid operation (x86:
/// 0xffc00000, a negative NaN; Arm: 0x7fc00000), which the kernels give where the host's
/// penalties would (`as_host` in kernels/sample.cu): a NaN's sign decides its place among
/// the candidates.
fn invalid_nan() -> u32 {
    let infinity = std::hint::black_box(f32::INFINITY);
    (infinity - std::hint::black_box(f32::INFINITY)).to_bits()
}

/// The packed input of the kernels: a header per row, then the lists it points to.
fn pack(sampling: &[RowSampling<'_>], width: usize) -> Result<Vec<u32>, BackendError> {
    let mut input = vec![0u32; sampling.len() * HEADER];
    for (r, row) in sampling.iter().enumerate() {
        let mut flags = 0;
        if row.filters.is_greedy() {
            flags |= FLAG_GREEDY;
        }
        if !row.penalties.is_off() {
            flags |= FLAG_PENALTIES;
        }
        if !samples_on_device(row, width) {
            flags |= FLAG_HOST;
        }
        let penalized = to_u32(OP, "packed input", input.len())?;
        input.extend(row.penalized.iter().flat_map(|&(id, count)| [id, count]));
        let bias = to_u32(OP, "packed input", input.len())?;
        input.extend(
            row.logit_bias
                .iter()
                .flat_map(|&(id, value)| [id, value.to_bits()]),
        );
        let f = row.filters;
        let uniform = row.uniform.to_bits();
        let header = [
            flags,
            to_u32(OP, "candidates", kept_by_top_k(row, width))?,
            f.temperature.to_bits(),
            f.top_p.to_bits(),
            f.min_p.to_bits(),
            min_p_log(f.min_p).to_bits(),
            row.penalties.repeat.to_bits(),
            row.penalties.frequency.to_bits(),
            row.penalties.presence.to_bits(),
            penalized,
            to_u32(OP, "penalized tokens", row.penalized.len())?,
            bias,
            to_u32(OP, "logit biases", row.logit_bias.len())?,
            uniform as u32,
            (uniform >> 32) as u32,
            invalid_nan(),
        ];
        input[r * HEADER..(r + 1) * HEADER].copy_from_slice(&header);
    }
    Ok(input)
}

/// Each of the first `rows` rows of `width` logits sampled under `sampling[row]` (see the
/// module's notes); the device rows are left biased and penalized.
/// Sampled rows are drawn on the device by these kernels unless `RUNIT_CUDA_SAMPLE=0`, which
/// samples on the host (`runit_backend::sample_pick_on_host`, the contract's default),
/// downloading the rows. `tests/sample_gpu.rs` passed on an H200 (session 34): every setting
/// combination and 1-64 rows draw the host's tokens.
pub fn enabled() -> bool {
    static ENABLED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ENABLED.get_or_init(|| std::env::var("RUNIT_CUDA_SAMPLE").map_or(true, |v| v != "0"))
}

pub fn sample_pick(
    backend: &CudaBackend,
    logits: &mut Buffer,
    rows: usize,
    width: usize,
    sampling: &[RowSampling<'_>],
) -> Result<Vec<Sampled>, BackendError> {
    check_len(
        OP,
        "logits",
        logits,
        product(OP, "rows × width", rows, width)?,
    )?;
    if sampling.len() != rows {
        return Err(BackendError::Shape {
            op: OP,
            what: "sampling settings (one per row)",
            expected: rows,
            found: sampling.len(),
        });
    }
    let outside = sampling
        .iter()
        .flat_map(|row| row.logit_bias)
        .find(|&&(id, _)| id as usize >= width);
    if let Some(&(id, _)) = outside {
        return Err(BackendError::Shape {
            op: OP,
            what: "logit bias token (below the row width)",
            expected: width,
            found: id as usize,
        });
    }
    if rows == 0 {
        return Ok(Vec::new());
    }
    if width == 0 {
        return Err(BackendError::Shape {
            op: OP,
            what: "row width (non-zero)",
            expected: 1,
            found: 0,
        });
    }
    let on_device: Vec<bool> = sampling
        .iter()
        .map(|row| samples_on_device(row, width))
        .collect();
    let mut sampled = vec![
        Sampled {
            id: 0,
            logit: f32::NAN
        };
        rows
    ];
    if on_device.iter().any(|&d| d) {
        sample_on_device(backend, logits, rows, width, sampling, &mut sampled)?;
    }
    if on_device.iter().any(|&d| !d) {
        // The rows the device leaves alone, sampled on the host from their logits.
        let mut host = vec![0.0; rows * width];
        backend.download(logits, &mut host)?;
        for (r, row) in host.chunks_mut(width).enumerate() {
            if !on_device[r] {
                sampled[r] = sample_row(row, &sampling[r]).map_err(|id| BackendError::Shape {
                    op: OP,
                    what: "logit bias token (below the row width)",
                    expected: width,
                    found: id as usize,
                })?;
            }
        }
    }
    Ok(sampled)
}

/// The kernels' pass over every row (those flagged for the host are left alone), writing
/// the device rows' tokens into `sampled`.
fn sample_on_device(
    backend: &CudaBackend,
    logits: &mut Buffer,
    rows: usize,
    width: usize,
    sampling: &[RowSampling<'_>],
    sampled: &mut [Sampled],
) -> Result<(), BackendError> {
    let logits_ptr = buffer_ptr(OP, "logits", logits)?;
    let input = pack(sampling, width)?;
    let (_input_guard, input_ptr) = backend.upload_small(OP, &input)?;
    let parts = width.div_ceil(SLICE).min(MAX_PARTS);
    let chunk = width.div_ceil(parts);
    // Scratch, in u32s: [ids | logits | greedy ids | greedy log-probabilities |
    //   selection states | key histograms | candidates (u64) | greedy partials]
    let state_at = 4 * rows;
    let histogram_at = state_at + STATE * rows;
    let candidates_at = (histogram_at + 256 * rows).next_multiple_of(2);
    let partials_at = candidates_at + 2 * K_MAX * rows;
    let needed = product(OP, "rows × parts", rows, 3 * parts)?.saturating_add(partials_at);
    let mut slot = backend
        .pick_scratch()
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    let scratch = super::pick::grown(backend, OP, &mut slot, needed)?;
    let base = device_address(scratch, backend.stream());
    let at = |offset: usize| base + 4 * offset as u64;
    let (out_ids, out_logits) = (at(0), at(rows));
    let (greedy_ids, greedy_logprobs) = (at(2 * rows), at(3 * rows));
    let (state, histogram) = (at(state_at), at(histogram_at));
    let (candidates, partials) = (at(candidates_at), at(partials_at));
    let rows_u32 = to_u32(OP, "rows", rows)?;
    let width_u32 = to_u32(OP, "width", width)?;
    let parts_u32 = to_u32(OP, "parts", parts)?;
    let chunk_u32 = to_u32(OP, "chunk", chunk)?;
    let per_row = |threads: u32| LaunchConfig {
        grid_dim: (rows_u32, 1, 1),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: 0,
    };
    let per_slice = LaunchConfig {
        grid_dim: (parts_u32, rows_u32, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    };
    launch!(
        backend,
        OP,
        "sample.cu",
        "sample_adjust_f32",
        per_row(32),
        logits_ptr,
        width_u32,
        rows_u32,
        input_ptr,
        state,
        histogram
    )?;
    let device_rows = || sampling.iter().filter(|row| samples_on_device(row, width));
    if device_rows().any(|row| row.filters.is_greedy()) {
        // The greedy rows' argmax on their adjusted logits (pick.cu's two phases).
        launch!(
            backend,
            OP,
            "pick.cu",
            "greedy_pick_partial_f32",
            per_slice,
            logits_ptr,
            width_u32,
            rows_u32,
            parts_u32,
            chunk_u32,
            partials
        )?;
        launch!(
            backend,
            OP,
            "pick.cu",
            "greedy_pick_combine_f32",
            per_row(32),
            partials,
            parts_u32,
            rows_u32,
            greedy_ids,
            greedy_logprobs
        )?;
    }
    if device_rows().any(|row| !row.filters.is_greedy()) {
        let select = LaunchConfig {
            grid_dim: (rows_u32.div_ceil(32), 1, 1),
            block_dim: (32, 1, 1),
            shared_mem_bytes: 0,
        };
        for _ in 0..ROUNDS {
            launch!(
                backend,
                OP,
                "sample.cu",
                "sample_histogram_f32",
                per_slice,
                logits_ptr,
                width_u32,
                rows_u32,
                chunk_u32,
                state,
                histogram
            )?;
            launch!(
                backend,
                OP,
                "sample.cu",
                "sample_select",
                select,
                rows_u32,
                state,
                histogram
            )?;
        }
        launch!(
            backend,
            OP,
            "sample.cu",
            "sample_gather_f32",
            per_slice,
            logits_ptr,
            width_u32,
            rows_u32,
            chunk_u32,
            input_ptr,
            state,
            candidates
        )?;
    }
    launch!(
        backend,
        OP,
        "sample.cu",
        "sample_draw_f32",
        per_row(K_MAX as u32),
        logits_ptr,
        width_u32,
        rows_u32,
        input_ptr,
        state,
        candidates,
        greedy_ids,
        out_ids,
        out_logits
    )?;
    let mut host = vec![0u32; 2 * rows];
    backend
        .stream()
        .memcpy_dtoh(&scratch.slice(..2 * rows), &mut host)
        .map_err(|e| backend.driver_error(OP, e))?;
    backend
        .stream()
        .synchronize()
        .map_err(|e| backend.driver_error(OP, e))?;
    for (r, out) in sampled.iter_mut().enumerate() {
        *out = Sampled {
            id: host[r],
            logit: f32::from_bits(host[rows + r]),
        };
    }
    Ok(())
}
