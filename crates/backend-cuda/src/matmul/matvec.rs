//! The decode path: each weight row's packed bytes are read once for all (up to 8) token rows.
//!
//! Quantized weights: the activations are first quantized to q8_1 (`quantize_q8_cpu` in
//! convert.cu: per 32 values an int8 block, its scale `d` and `d · sum`), then
//! `matvec_<type>_t<T>` (matvec_legacy.cu / matvec_kquants.cu) dots weight parts with them by
//! `dp4a`. Float weights: `matvec_<type>[_vec|_vec4|_vec_warp]_t<T>` (matvec_float.cu) on the
//! f32 activations.
//!
//! Quantized kernels: blocks of 128 threads, 4 rows each (2 for more than 2 tokens). Float
//! kernels: one block per row (element-wise for rows of any length, or 16-byte loads), or,
//! for many short rows, `_vec_warp` kernels that give each warp `rows_per_warp` consecutive
//! rows; [`warp_rows`] sizes their grid to fit on the device at once.
//!
//! Every kernel takes a bias address (0: none) added to each output row in its epilogue, and
//! has a `_swiglu` twin dotting the same rows of two weights (gate, up) that writes
//! `silu(gate · x) * (up · x)`; the quantized twins give each block half as many output rows.

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

use cudarc::driver::LaunchConfig;
use runit_backend::BackendError;

use super::names::{token_variant, TypeKernels, WIDE_MIN_ROW};
use super::{ensure, launch_kernel, Operands, Scratch, MATVEC_MAX_TOKENS, OP, PREPARED_ROW_LEN};
use crate::CudaBackend;

/// Threads per block (MATVEC_THREADS in the kernels).
pub(super) const THREADS: u32 = 128;
/// Warps per block.
const WARPS: usize = THREADS as usize / 32;

/// Output rows per block of the quantized kernels (`MATVEC_ROWS` in matvec.cuh).
pub(super) fn rows_per_block(variant: usize) -> usize {
    if variant <= 1 {
        4
    } else {
        2
    }
}

/// Warps of kernel `name` the device holds at once, by (device ordinal, kernel name).
pub(super) fn resident_warps(
    backend: &CudaBackend,
    file: &'static str,
    name: &'static str,
) -> Result<usize, BackendError> {
    static CACHE: OnceLock<Mutex<HashMap<(usize, &'static str), usize>>> = OnceLock::new();
    let cache = CACHE.get_or_init(|| Mutex::new(HashMap::new()));
    let context = backend.stream().context();
    let key = (context.ordinal(), name);
    if let Some(&warps) = cache.lock().expect("occupancy cache lock").get(&key) {
        return Ok(warps);
    }
    let function = backend.kernel(OP, file, name)?;
    let blocks = function
        .occupancy_max_active_blocks_per_multiprocessor(THREADS, 0, None)
        .map_err(|e| backend.driver_error(OP, e))?;
    let warps = (blocks.max(1) as usize) * backend.multiprocessors(OP)? * WARPS;
    cache
        .lock()
        .expect("occupancy cache lock")
        .insert(key, warps);
    Ok(warps)
}

/// Float weights whose rows are at most this many bytes, with at least
/// [`WARP_MIN_ROWS`] rows, take the warp-per-row kernels (an H200 ran the 151936 x 896 F16
/// output matrix in 67 µs instead of 101, and 4864 x 896 in 4.2 µs instead of 4.8).
pub(super) const WARP_MAX_ROW_BYTES: usize = 2048;
/// See [`WARP_MAX_ROW_BYTES`].
pub(super) const WARP_MIN_ROWS: usize = 4096;
/// Other float weights of at least this many rows take the four-loads-per-thread kernels
/// (18944 x 3584 F16: 4.1 TB/s instead of 3.7); fewer rows are faster with one load per
/// thread and step (3584 x 3584 F16: 7.2 µs instead of 8.4).
pub(super) const UNROLLED_MIN_ROWS: usize = 8192;

/// `(rows per warp, blocks)` for `n_out` rows on a device holding `resident` warps: the
/// fewest rows per warp whose grid fits at once, then as few warps as that share needs.
pub fn warp_rows(n_out: usize, resident: usize) -> (usize, usize) {
    let per_warp = n_out.div_ceil(resident.max(1)).max(1);
    let warps = n_out.div_ceil(per_warp);
    (per_warp, warps.div_ceil(WARPS))
}

/// Bytes of q8_1 activations for `tokens` rows of `n_in` (a multiple of 32) values: the int8
/// values (padded to 16 bytes), then one (d, d·sum) f32 pair per 32 values.
pub fn q8_1_bytes(tokens: usize, n_in: usize) -> usize {
    (tokens * n_in).next_multiple_of(16) + tokens * n_in / 32 * 8
}

/// Runs the decode matvec for `op.tokens <= MATVEC_MAX_TOKENS` rows (adding `op.bias` to
/// each output row when it is not 0).
pub(super) fn run(
    backend: &CudaBackend,
    kernels: &TypeKernels,
    op: &Operands,
    scratch: &mut Scratch,
) -> Result<(), BackendError> {
    run_with(backend, kernels, op, None, scratch)
}

/// The SwiGLU decode matvec: `out = silu(W · x) * (W_up · x)` with `op.weight` the gate and
/// `up` the address of the up weight (same type and shape).
pub(super) fn run_swiglu(
    backend: &CudaBackend,
    kernels: &TypeKernels,
    op: &Operands,
    up: u64,
    scratch: &mut Scratch,
) -> Result<(), BackendError> {
    run_with(backend, kernels, op, Some(up), scratch)
}

/// Q, K and V of one input in one launch (quantized types with a `matvec_qkv` kernel):
/// `q`, `k`, `v` share the type, row length, `x` and token count; `k` and `v` the row count.
/// Returns `false` (nothing launched) when the type has no such kernel.
pub(super) fn run_qkv(
    backend: &CudaBackend,
    kernels: &TypeKernels,
    q: &Operands,
    k: &Operands,
    v: &Operands,
    scratch: &mut Scratch,
) -> Result<bool, BackendError> {
    debug_assert!((1..=MATVEC_MAX_TOKENS).contains(&q.tokens));
    let variant = token_variant(q.tokens);
    let name = match (&kernels.matvec_wide, &kernels.matvec_qkv) {
        (Some((_, _, wide)), _) if q.n_in >= WIDE_MIN_ROW => wide[variant],
        (_, Some(qkv)) if kernels.matvec_vector.is_none() => qkv[variant],
        _ => return Ok(false),
    };
    let (aq, ads) = quantized_input(backend, q, scratch)?;
    let rows = rows_per_block(variant);
    let blocks = q.n_out.div_ceil(rows) + 2 * k.n_out.div_ceil(rows);
    let config = LaunchConfig {
        grid_dim: (blocks as u32, 1, 1),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    };
    launch_kernel!(
        backend,
        OP,
        kernels.matvec_file,
        name,
        config,
        q.weight,
        k.weight,
        v.weight,
        q.row_bytes as u64,
        q.n_in as u32,
        q.n_out as u32,
        k.n_out as u32,
        aq,
        ads,
        q.out,
        k.out,
        v.out,
        q.tokens as u32,
        q.bias,
        k.bias,
        v.bias
    )?;
    Ok(true)
}

/// Quantizes the activations to q8_1 unless the scratch already holds them; returns the
/// addresses of the int8 values and of the (d, d·sum) pairs. `op.tokens` may exceed
/// [`MATVEC_MAX_TOKENS`] (the expert matvecs quantize one row per token and expert).
pub(super) fn quantized_input(
    backend: &CudaBackend,
    op: &Operands,
    scratch: &mut Scratch,
) -> Result<(u64, u64), BackendError> {
    // Sized for the largest token count, so the scratch grows only for longer rows (or more
    // rows than a decode matmul has).
    let len = q8_1_bytes(MATVEC_MAX_TOKENS, op.n_in.max(PREPARED_ROW_LEN))
        .max(q8_1_bytes(op.tokens, op.n_in));
    let base = ensure(backend, &mut scratch.q8_1, len, "q8_1 activation")?;
    let values = op.tokens * op.n_in;
    let (aq, ads) = (base, base + values.next_multiple_of(16) as u64);
    // One warp per 32 values (per 256 for the K-quants' Q8_K-style scales).
    let warps = values / if op.activation_mode == 2 { 256 } else { 32 };
    let quantize = LaunchConfig {
        grid_dim: (warps.div_ceil(8).clamp(1, 65_535) as u32, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    };
    let current = super::Converted {
        x: op.x,
        tokens: op.tokens,
        row_len: op.n_in,
        generation: backend.write_generation(),
        scratch: base,
        mode: op.activation_mode,
    };
    if scratch.quantized != Some(current) {
        launch_kernel!(
            backend,
            OP,
            "convert.cu",
            "quantize_q8_cpu",
            quantize,
            op.x,
            aq,
            ads,
            values as u64,
            op.activation_mode
        )?;
        scratch.quantized = Some(current);
    }
    Ok((aq, ads))
}

/// [`run`] (`up` = `None`) or [`run_swiglu`].
fn run_with(
    backend: &CudaBackend,
    kernels: &TypeKernels,
    op: &Operands,
    up: Option<u64>,
    scratch: &mut Scratch,
) -> Result<(), BackendError> {
    debug_assert!((1..=MATVEC_MAX_TOKENS).contains(&op.tokens));
    let variant = token_variant(op.tokens);
    let block_grid = |rows_per_block: usize| LaunchConfig {
        grid_dim: (op.n_out.div_ceil(rows_per_block) as u32, 1, 1),
        block_dim: (THREADS, 1, 1),
        shared_mem_bytes: 0,
    };
    let warp_grid = |name: &'static str| -> Result<(LaunchConfig, u32), BackendError> {
        let resident = resident_warps(backend, kernels.matvec_file, name)?;
        let (per_warp, blocks) = warp_rows(op.n_out, resident);
        let config = LaunchConfig {
            grid_dim: (blocks as u32, 1, 1),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        Ok((config, per_warp as u32))
    };
    let (row_bytes, n_in, n_out, tokens) = (
        op.row_bytes as u64,
        op.n_in as u32,
        op.n_out as u32,
        op.tokens as u32,
    );
    let file = kernels.matvec_file;
    match &kernels.matvec_vector {
        None => {
            let (aq, ads) = quantized_input(backend, op, scratch)?;
            let (plain, swiglu) = match &kernels.matvec_wide {
                Some((plain, swiglu, _)) if op.n_in >= WIDE_MIN_ROW => {
                    (plain[variant], swiglu[variant])
                }
                _ => (kernels.matvec[variant], kernels.matvec_swiglu[variant]),
            };
            match up {
                None => launch_kernel!(
                    backend,
                    OP,
                    file,
                    plain,
                    block_grid(rows_per_block(variant)),
                    op.weight,
                    row_bytes,
                    n_in,
                    n_out,
                    aq,
                    ads,
                    op.out,
                    tokens,
                    op.bias
                ),
                // Each block dots half its rows of gate and half of up (MATVEC_ROWS / 2
                // output rows).
                Some(up) => launch_kernel!(
                    backend,
                    OP,
                    file,
                    swiglu,
                    block_grid(rows_per_block(variant) / 2),
                    op.weight,
                    up,
                    row_bytes,
                    n_in,
                    n_out,
                    aq,
                    ads,
                    op.out,
                    tokens
                ),
            }
        }
        Some(vector) => {
            let aligned = op.n_in.is_multiple_of(8)
                && op.weight.is_multiple_of(16)
                && up.is_none_or(|up| up.is_multiple_of(16))
                && op.x.is_multiple_of(16);
            if aligned && op.row_bytes <= WARP_MAX_ROW_BYTES && op.n_out >= WARP_MIN_ROWS {
                match up {
                    None => {
                        let name = vector.warp[variant];
                        let (config, per_warp) = warp_grid(name)?;
                        launch_kernel!(
                            backend, OP, file, name, config, op.weight, row_bytes, n_in, n_out,
                            op.x, op.out, tokens, per_warp, op.bias
                        )
                    }
                    Some(up) => {
                        let name = vector.warp_swiglu[variant];
                        let (config, per_warp) = warp_grid(name)?;
                        launch_kernel!(
                            backend, OP, file, name, config, op.weight, up, row_bytes, n_in, n_out,
                            op.x, op.out, tokens, per_warp
                        )
                    }
                }
            } else {
                let (plain, swiglu) = if !aligned {
                    (kernels.matvec[variant], kernels.matvec_swiglu[variant])
                } else if op.n_out >= UNROLLED_MIN_ROWS {
                    (vector.unrolled[variant], vector.unrolled_swiglu[variant])
                } else {
                    (vector.single[variant], vector.single_swiglu[variant])
                };
                match up {
                    None => launch_kernel!(
                        backend,
                        OP,
                        file,
                        plain,
                        block_grid(1),
                        op.weight,
                        row_bytes,
                        n_in,
                        n_out,
                        op.x,
                        op.out,
                        tokens,
                        op.bias
                    ),
                    Some(up) => launch_kernel!(
                        backend,
                        OP,
                        file,
                        swiglu,
                        block_grid(1),
                        op.weight,
                        up,
                        row_bytes,
                        n_in,
                        n_out,
                        op.x,
                        op.out,
                        tokens
                    ),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn q8_1_scratch_holds_every_token_count() {
        for n_in in [32, 896, 3584, 18944] {
            let capacity = q8_1_bytes(MATVEC_MAX_TOKENS, n_in);
            for tokens in 1..=MATVEC_MAX_TOKENS {
                let values = tokens * n_in;
                let end = values.next_multiple_of(16) + values / 32 * 8;
                assert!(end <= capacity, "{tokens} x {n_in}");
            }
        }
        assert_eq!(q8_1_bytes(1, 32), 32 + 8);
    }

    #[test]
    fn warp_rows_cover_every_row_in_one_wave() {
        let resident = 132 * 8 * WARPS;
        for n_out in [1, 7, 128, 512, 896, 3584, 4224, 4225, 4864, 18944, 151_936] {
            let (per_warp, blocks) = warp_rows(n_out, resident);
            assert!(blocks * WARPS * per_warp >= n_out, "{n_out}");
            // The last block holds at least one row, and the grid fits at once.
            assert!((blocks - 1) * WARPS * per_warp < n_out, "{n_out}");
            assert!(blocks * WARPS <= resident + WARPS, "{n_out}");
        }
        assert_eq!(warp_rows(3584, resident), (1, 896));
        assert_eq!(warp_rows(18944, resident), (5, 948));
    }
}
