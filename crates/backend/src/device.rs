//! The first part of the contract: the device and its memory (buffers, weights, caches,
//! transfers) and the hooks of a forward pass (step inputs, capture and replay).

use runit_quant::GgmlType;

use crate::BackendError;
use crate::OpResult;
use crate::{Buffer, KvCache, KvRole, KvType, Op, StepInputs, StepKey, Weight, WeightSource};

/// A compute device and its memory.
pub trait Device {
    /// Short name for logs and errors (`"cpu"`, `"cuda:0"`).
    fn name(&self) -> String;

    /// True when `op` can run on weights of type `ty`.
    fn supports(&self, op: Op, ty: GgmlType) -> bool;

    /// A zeroed f32 activation buffer of `len` elements.
    fn alloc(&self, len: usize) -> Result<Buffer, BackendError>;

    /// Copies `data` into the first `data.len()` elements of `buffer`.
    fn upload(&self, buffer: &mut Buffer, data: &[f32]) -> OpResult;

    /// Copies the first `out.len()` elements of `buffer` into `out` (waits for pending work).
    fn download(&self, buffer: &Buffer, out: &mut [f32]) -> OpResult;

    /// Makes the weight `source` describes usable by this backend. Its bytes are the packed
    /// tensor as stored in the file; a host backend may keep referring to them (zero copy), a
    /// device backend uploads them. The weight keeps the source's role.
    fn load_weight(&self, source: WeightSource<'_>) -> Result<Weight, BackendError>;

    /// A KV cache for one layer: `n_cells` token slots of `width` = kv_heads × `head_dim`,
    /// holding keys or values (`role`) as `ty`. A type this backend does not store, or a
    /// width that is not a whole number of its blocks, is `BackendError::UnsupportedKv`.
    fn alloc_kv(
        &self,
        n_cells: usize,
        width: usize,
        head_dim: usize,
        ty: KvType,
        role: KvRole,
    ) -> Result<KvCache, BackendError>;

    /// Makes a TurboQuant key cache store each row minus `mean` (`[width]`, the same for
    /// every position): every score of a query moves by the same `q . mean`, which the
    /// softmax ignores, while the codes see smaller vectors. A backend without TurboQuant
    /// caches refuses it.
    fn center_keys(&self, cache: &mut KvCache, mean: &[f32]) -> OpResult {
        let _ = mean;
        Err(BackendError::UnsupportedKv {
            backend: self.name(),
            ty: cache.ty,
            what: "centered keys".to_string(),
            supported: "TurboQuant key caches of a backend that stores them",
        })
    }

    /// Waits until all submitted work is done.
    fn synchronize(&self) -> OpResult;

    /// Device memory free for weights and caches, in bytes (`None`: host memory, not checked).
    fn memory_available(&self) -> Option<usize> {
        None
    }

    /// True when the backend computes straight from the host memory its weights are loaded
    /// from (the CPU backend) instead of copying them to a device: the loader may then copy
    /// that memory into a faster layout first (huge pages; `runit_model::WeightPlacement`).
    fn reads_weights_from_host(&self) -> bool {
        false
    }

    /// Announces the host-side inputs of the forward pass whose ops follow, until
    /// [`Device::end_step`]. Ops of the pass are called with these very slices; a device
    /// backend copies them to device memory once, so its ops read them there and a captured
    /// pass stays valid when they change. The default does nothing.
    fn begin_step(&self, inputs: &StepInputs<'_>) -> OpResult {
        let _ = inputs;
        Ok(())
    }

    /// Ends the pass started by [`Device::begin_step`].
    fn end_step(&self) -> OpResult {
        Ok(())
    }

    /// True when [`Device::run_captured`] records and replays passes (CUDA graphs).
    fn captures_steps(&self) -> bool {
        false
    }

    /// True when a pass's windowed layers may use block tables of their own (rings of their
    /// windows, `StepInputs::window_spans`): always for a backend that runs passes op by op;
    /// a capturing one must keep the window spans of [`Device::begin_step`] for its ops.
    fn takes_window_spans(&self) -> bool {
        !self.captures_steps()
    }

    /// Runs `body`, the ops of one forward pass between `begin_step` and `end_step`, or
    /// replays the capture of an earlier pass with the same `key` instead of calling it. The
    /// body must not read device results back to the host. The default runs `body`.
    fn run_captured(&self, key: StepKey, body: &mut dyn FnMut() -> OpResult) -> OpResult {
        let _ = key;
        body()
    }
}
