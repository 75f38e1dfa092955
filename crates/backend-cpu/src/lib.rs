//! The CPU backend: the reference implementation of the backend contract, with SIMD kernels
//! (AVX2 + FMA + F16C, runtime-detected, each with a scalar twin) and a rayon thread pool.
//!
//! Numerics reproduce what llama.cpp's CPU backend computed for the golden data (AVX-512,
//! gcc 12 with fused multiply-add contraction), bit for bit where the layer dumps could check
//! it: RMS norm sums squares in order in f64, RoPE runs ggml's running-θ recurrence in f32 and
//! fuses one product of each rotated value, the KV cache is f16 by default, attention mirrors
//! ggml's flash attention (Q rounded to f16, Q·K summed in f64, online softmax with a fused
//! sum update, V accumulated in f16 for short batches; f32 throughout for batches of 64 rows
//! or more, as ggml's tiled path), and SwiGLU uses ggml's polynomial `exp`. The f32 sums of
//! every node of SmolLM2-135M Q4_1 match llama.cpp's dump in all 30 layers
//! (`tests/golden_exact.rs` checks layers 0 and 1).
//!
//! ```
//! use runit_backend::{Device, PrimitiveOps};
//! use runit_backend_cpu::CpuBackend;
//!
//! let backend = CpuBackend::new(1).unwrap();
//! let mut a = backend.alloc(3).unwrap();
//! let mut b = backend.alloc(3).unwrap();
//! backend.upload(&mut a, &[1.0, 2.0, 3.0]).unwrap();
//! backend.upload(&mut b, &[0.5, 0.5, 0.5]).unwrap();
//! backend.add(&mut a, &b, 3).unwrap();
//! let mut out = [0.0; 3];
//! backend.download(&a, &mut out).unwrap();
//! assert_eq!(out, [1.5, 2.5, 3.5]);
//! ```

mod backend;
mod cells;
pub mod matmul;
mod ops;
mod storage;
mod turbo;
mod vector;

pub use runit_quant::dot::SimdLevel;

use runit_backend::BackendError;

use vector::Isa;

/// Below this many f32 elements of work an op runs on the calling thread: splitting a
/// decode batch's small rows (8 x 576) over the team cost more in waits than it saved.
const PARALLEL_MIN_ELEMENTS: usize = 1 << 15;

/// The CPU backend. Cheap to share: hold it in an `Arc<dyn Backend>`.
pub struct CpuBackend {
    pool: rayon::ThreadPool,
    threads: usize,
    simd: SimdLevel,
    isa: Isa,
    /// Activations converted for the matmul kernels, kept between calls.
    matmul_scratch: std::sync::Mutex<Vec<u8>>,
    /// An op's output converted for the matmul that takes it next by the op's own tasks
    /// (`matmul::Prepared`: the SwiGLU's for the down projection, the attention's for the
    /// output projection), kept between calls.
    prepared_scratch: std::sync::Mutex<Vec<u8>>,
    /// The pass between `begin_step` and `end_step` computes every row as if alone
    /// (`StepInputs::rows_alone`).
    pub(crate) rows_alone: std::sync::atomic::AtomicBool,
    /// `FusedOps::norms_in_matmuls`: off (the add-and-norm order) unless a test asks for
    /// the other order ([`CpuBackend::with_norms_in_matmuls`]).
    pub(crate) norms_in_matmuls: bool,
}

impl CpuBackend {
    /// A backend with `threads` worker threads (0 = one per core) at the best SIMD level of
    /// this CPU.
    pub fn new(threads: usize) -> Result<CpuBackend, BackendError> {
        CpuBackend::with_simd(threads, SimdLevel::detect())
    }

    /// A backend at an explicit SIMD level (`SimdLevel::Scalar` is the portable twin the
    /// parity suite compares against). Fails when this CPU lacks the level.
    pub fn with_simd(threads: usize, simd: SimdLevel) -> Result<CpuBackend, BackendError> {
        if !simd.is_available() {
            return Err(BackendError::Device {
                backend: "cpu".to_string(),
                op: "new",
                message: format!(
                    "SIMD level {simd:?} is not available on this CPU (best: {:?}{})",
                    SimdLevel::detect(),
                    runit_quant::cpu::cap_setting()
                        .map_or_else(String::new, |cap| format!(" under {cap}"))
                ),
            });
        }
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(|index| format!("runit-cpu-{index}"))
            .build()
            .map_err(|error| BackendError::Device {
                backend: "cpu".to_string(),
                op: "new",
                message: format!("cannot start {threads} worker threads: {error}"),
            })?;
        let threads = pool.current_num_threads();
        Ok(CpuBackend {
            pool,
            threads,
            simd,
            isa: Isa::detect(simd != SimdLevel::Scalar),
            matmul_scratch: std::sync::Mutex::new(Vec::new()),
            prepared_scratch: std::sync::Mutex::new(Vec::new()),
            rows_alone: std::sync::atomic::AtomicBool::new(false),
            norms_in_matmuls: false,
        })
    }

    /// This backend asking the decoder for its residual-in-matmul order
    /// (`FusedOps::norms_in_matmuls`), which the CPU gains nothing from: the decoder's two
    /// orders are checked against each other on it, value for value.
    pub fn with_norms_in_matmuls(mut self, on: bool) -> CpuBackend {
        self.norms_in_matmuls = on;
        self
    }

    /// True while the current pass computes every row as it would be computed alone
    /// (`StepInputs::rows_alone`): no batched matmul orders, one-chunk attention.
    pub fn rows_alone(&self) -> bool {
        self.rows_alone.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Number of worker threads.
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// The SIMD level the kernels run at.
    pub fn simd(&self) -> SimdLevel {
        self.simd
    }

    /// The worker pool (for kernels that split work themselves).
    pub fn pool(&self) -> &rayon::ThreadPool {
        &self.pool
    }

    /// Runs `work(chunk)` for every `chunk < chunks` on the calling thread and the matmul's
    /// helper threads (the same threads every op uses, so ops never compete for cores).
    fn run_chunks(&self, chunks: usize, work: &(dyn Fn(usize) + Sync)) {
        matmul::Parallelism::pool(&self.pool).for_each_chunk(chunks, work);
    }

    /// Runs `f(row_index, row)` over the `rows` rows of `width` elements at the start of
    /// `out`, on the pool when the work is large enough to pay for it.
    fn for_rows<F>(&self, out: &mut [f32], width: usize, rows: usize, f: F)
    where
        F: Fn(usize, &mut [f32]) + Sync + Send,
    {
        if width == 0 || rows == 0 {
            return;
        }
        let out = &mut out[..rows * width];
        if self.threads > 1 && rows > 1 && rows * width >= PARALLEL_MIN_ELEMENTS {
            // About 4096 elements a chunk, and at least one chunk per thread.
            let per_chunk = (4096 / width).min(rows.div_ceil(self.threads)).max(1);
            let chunks = rows.div_ceil(per_chunk);
            let shared = SharedRows::new(out, width);
            self.run_chunks(chunks, &|chunk| {
                let first = chunk * per_chunk;
                for index in first..(first + per_chunk).min(rows) {
                    // SAFETY: chunks cover disjoint row ranges, so each row is borrowed
                    // by one call at a time; `out` stays borrowed until `run_chunks`
                    // returns, after every chunk.
                    f(index, unsafe { shared.row(index) });
                }
            });
        } else {
            for (index, row) in out.chunks_mut(width).enumerate() {
                f(index, row);
            }
        }
    }
}

/// Rows of one output buffer handed to parallel chunks, each row to exactly one of them.
pub(crate) struct SharedRows {
    start: *mut f32,
    len: usize,
    width: usize,
}

// SAFETY: shared access only hands out rows through the `unsafe` `row` and `rows`, whose
// callers promise that no row is borrowed mutably by two threads (or read while written).
unsafe impl Sync for SharedRows {}

impl SharedRows {
    /// `out` seen as rows of `width` values.
    pub(crate) fn new(out: &mut [f32], width: usize) -> SharedRows {
        SharedRows {
            start: out.as_mut_ptr(),
            len: out.len(),
            width,
        }
    }

    /// Row `index`, mutably.
    ///
    /// # Safety
    /// No other reference to this row may be alive while the returned one is, and the
    /// buffer given to [`SharedRows::new`] must outlive it.
    #[allow(clippy::mut_from_ref)]
    pub(crate) unsafe fn row(&self, index: usize) -> &mut [f32] {
        let at = index * self.width;
        assert!(
            at + self.width <= self.len,
            "row {index} is outside the buffer"
        );
        // SAFETY: `at + width <= len` (asserted above), so the row lies inside the buffer,
        // which the caller promises outlives it and no other reference aliases.
        unsafe { std::slice::from_raw_parts_mut(self.start.add(at), self.width) }
    }

    /// Rows `first .. first + count`, to read.
    ///
    /// # Safety
    /// No mutable reference to these rows may be alive while the returned one is, and the
    /// buffer given to [`SharedRows::new`] must outlive it.
    pub(crate) unsafe fn rows(&self, first: usize, count: usize) -> &[f32] {
        let (at, len) = (first * self.width, count * self.width);
        assert!(
            at + len <= self.len,
            "rows {first} + {count} outside the buffer"
        );
        // SAFETY: `at + len <= self.len` (asserted above), so the rows lie inside the
        // buffer, which the caller promises outlives them and nothing writes meanwhile.
        unsafe { std::slice::from_raw_parts(self.start.add(at), len) }
    }
}
