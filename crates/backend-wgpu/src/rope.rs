//! RoPE of one buffer or of a step's queries and keys in one dispatch, or of both with the
//! cache write of the keys and values: the host's angles (`RopeParams::angles`, as the CPU
//! computes them) in a table, then `rope.wgsl`.

use runit_backend::{
    hadamard, BackendError, Buffer, KvCache, KvType, KvWrite, OpResult, Projection, RopeKvWrite,
    RopeParams, RopeStyle, Weight,
};

use crate::attention::covers_in_order;
use crate::backend::{grid, rows_grid};
use crate::batch;
use crate::device::{at_least, buffer, kv, weight};
use crate::kernels;
use crate::matmul::PartsExtra;
use crate::ops::cache_entries;
use crate::WgpuBackend;

/// Whether RoPE with `a` and with `b` turns each position's pairs by the same angles (they
/// differ in their heads at most).
pub(crate) fn same_angles(a: &RopeParams, b: &RopeParams) -> bool {
    let b_with_a_heads = RopeParams {
        heads: a.heads,
        ..b.clone()
    };
    *a == b_with_a_heads
}

/// rope_kv_write.wgsl's invocations a workgroup: a key row's pairs and cache words a step
/// (a 7B's 256 of each), and the pairs of the queries a workgroup rotates.
const ROPE_KV_THREADS: usize = 256;

/// What a RoPE dispatch takes: its parameter words (`rope.wgsl`'s, the last four
/// rope_kv_write.wgsl's alone), the angles table (cos, sin of each token's pairs) and the
/// pairs of each buffer.
struct RopePlan {
    words: [u32; 12],
    angles: Vec<f32>,
    pairs: [usize; 2],
}

impl WgpuBackend {
    /// RoPE of one buffer (`rope.wgsl` with `rope_one.wgsl`) or of two in one dispatch
    /// (`rope_pair.wgsl`: a step's queries and keys), each with its parameters; the angles
    /// are those of the first's, so a second must have the same ([`same_angles`]).
    pub(crate) fn rope_buffers(
        &self,
        xs: &[(&Buffer, &RopeParams)],
        positions: &[u32],
        freq_factors: Option<&Weight>,
    ) -> OpResult {
        const OP: &str = "rope";
        let Some(plan) = self.rope_plan(xs, positions, freq_factors)? else {
            return Ok(());
        };
        let threads = grid(plan.pairs[0] + plan.pairs[1]);
        let first = buffer(xs[0].0, OP, "x")?;
        let angles = batch::table(&plan.angles);
        match xs.get(1) {
            None => {
                let bindings = [angles, first.into()];
                self.dispatch_ranges(OP, Self::plain("rope"), &plan.words, &bindings, threads)
            }
            Some((second, _)) => {
                let bindings = [angles, first.into(), buffer(second, OP, "k")?.into()];
                let kernel = Self::plain("rope_pair");
                self.dispatch_ranges(OP, kernel, &plan.words, &bindings, threads)
            }
        }
    }

    /// RoPE of a step's queries and keys and the write of its keys and values into their
    /// caches in one dispatch (`rope_kv_write.wgsl`), equal to `rope_buffers` of both then
    /// `kv_write`. It applies where the queries' and keys' angles are the same, neither cache
    /// rotates its rows (llama.cpp's Hadamard rotation runs over a copy, a pass of its own),
    /// both caches' rows are the keys' rows and the spans write every row once, in order (so
    /// that the rows the kernel rotates are those `rope_buffers` would). Returns `false`,
    /// having recorded nothing, where it does not apply: the caller then runs the two.
    pub(crate) fn rope_kv_write_rows(
        &self,
        op: &mut RopeKvWrite<'_>,
    ) -> Result<bool, BackendError> {
        const OP: &str = "rope_kv_write";
        let (k_rope, tokens) = (op.k_rope, op.positions.len());
        let key_width = k_rope.heads * k_rope.head_dim;
        let caches = [&*op.k_cache, &*op.v_cache];
        let applies = same_angles(op.q_rope, k_rope)
            && caches.iter().all(|cache| {
                cache.width == key_width
                    && hadamard::llama_rotation(cache.ty, cache.role, cache.head_dim).is_none()
            })
            && covers_in_order(op.spans, tokens);
        if !applies {
            return Ok(false);
        }
        let kernel = self.cache_kernel(kernels::rope_kv_write, op.k_cache, op.v_cache)?;
        let xs = [(&*op.q, op.q_rope), (&*op.k, k_rope)];
        let Some(plan) = self.rope_plan(&xs, op.positions, op.freq_factors)? else {
            return Ok(false);
        };
        let write = KvWrite {
            k: op.k,
            v: op.v,
            k_cache: op.k_cache,
            v_cache: op.v_cache,
            spans: op.spans,
        };
        let (entries, _) = cache_entries(&write, OP)?;
        let rows = entries.len() / 2;
        let groups = rows + plan.pairs[0].div_ceil(ROPE_KV_THREADS);
        let [gx, gy, _] = rows_grid(groups);
        let mut words = plan.words;
        words[8..10].copy_from_slice(&[rows as u32, key_width as u32]);
        let (k_gpu, v_gpu) = (kv(write.k_cache, OP, "k")?, kv(write.v_cache, OP, "v")?);
        let bindings = [
            batch::table(&plan.angles),
            buffer(op.q, OP, "q")?.into(),
            buffer(write.k, OP, "k")?.into(),
            buffer(write.v, OP, "v")?.into(),
            batch::table(&entries),
            (&k_gpu.buffer).into(),
            (&v_gpu.buffer).into(),
        ];
        self.dispatch_ranges(OP, kernel, &words, &bindings, [gx, gy, 1])?;
        Ok(true)
    }

    /// The Q, K and V projections of one token's `x` with RoPE of Q and K and the cache
    /// write of K and V in their dispatch's epilogue (`matvec_rope.wgsl`,
    /// `FusedOps::qkv_rope_kv_write`), where it applies: no QK norms, the same angles for
    /// both, whole heads rotated, f16 or f32 caches as wide as the keys without a rotation of
    /// their own, the projections in one dispatch (their biases in its epilogue). `false`:
    /// nothing recorded.
    pub(crate) fn qkv_rope_epilogue(
        &self,
        projections: &[Projection<'_>; 3],
        x: &Buffer,
        op: &mut RopeKvWrite<'_>,
    ) -> Result<bool, BackendError> {
        const OP: &str = "rope_kv_write";
        let (q_rope, k_rope, tokens) = (op.q_rope, op.k_rope, op.positions.len());
        let head_dim = k_rope.head_dim;
        let key_width = k_rope.heads * head_dim;
        let caches = [&*op.k_cache, &*op.v_cache];
        let fits = self.rope_epilogue
            && self.fused_ops
            && tokens == 1
            && op.qk_norms.is_none()
            && same_angles(q_rope, k_rope)
            && q_rope.head_dim == head_dim
            && k_rope.rotary_dim == head_dim
            && head_dim.is_multiple_of(4)
            && caches.iter().all(|cache| {
                cache.width == key_width
                    && matches!(cache.ty, KvType::F16 | KvType::F32)
                    && hadamard::llama_rotation(cache.ty, cache.role, cache.head_dim).is_none()
            })
            && covers_in_order(op.spans, tokens);
        if !fits {
            return Ok(false);
        }
        let biases = self.epilogue_biases(projections)?;
        if biases.is_none() && projections.iter().any(|p| p.bias.is_some()) {
            return Ok(false);
        }
        let xs = [(&*op.q, q_rope), (&*op.k, k_rope)];
        let Some(plan) = self.rope_plan(&xs, op.positions, op.freq_factors)? else {
            return Ok(false);
        };
        let (entries, _) = cache_entries(&op.kv_write(), OP)?;
        let (k_gpu, v_gpu) = (kv(op.k_cache, OP, "k")?, kv(op.v_cache, OP, "v")?);
        let f16 = |cache: &KvCache| u32::from(cache.ty == KvType::F16);
        let extra = PartsExtra::Rope {
            angles: &plan.angles,
            k_cache: &k_gpu.buffer,
            v_cache: &v_gpu.buffer,
            cell: entries[1],
            head_dim: head_dim as u32,
            neox: q_rope.style == RopeStyle::Neox,
            f16: f16(op.k_cache) | (f16(op.v_cache) << 1),
        };
        let weights = projections.map(|p| p.weight);
        let mut outs = [&mut *op.q, &mut *op.k, &mut *op.v];
        self.matmul_parts(&weights, x, tokens, &mut outs, biases.as_ref(), extra)
    }

    /// The checks, angles and parameters of RoPE of `xs` (the angles of the first's
    /// parameters), or `None` where no pair turns.
    fn rope_plan(
        &self,
        xs: &[(&Buffer, &RopeParams)],
        positions: &[u32],
        freq_factors: Option<&Weight>,
    ) -> Result<Option<RopePlan>, BackendError> {
        const OP: &str = "rope";
        let tokens = positions.len();
        for (x, params) in xs {
            let (heads, head_dim, rotary) = (params.heads, params.head_dim, params.rotary_dim);
            if rotary > head_dim || !rotary.is_multiple_of(2) {
                return Err(BackendError::Shape {
                    op: OP,
                    what: "rotary_dim (even, at most head_dim)",
                    expected: head_dim,
                    found: rotary,
                });
            }
            at_least(OP, "x elements", tokens * heads * head_dim, x.len())?;
        }
        let params = xs[0].1;
        let second = xs.get(1);
        let half = params.rotary_dim / 2;
        let factors = match freq_factors {
            Some(w) => {
                let host = weight(w, OP, "freq_factors")?.host.as_deref();
                let host = host.ok_or_else(|| self.unsupported(OP, w))?;
                at_least(OP, "frequency factors", half, host.len())?;
                Some(host)
            }
            None => None,
        };
        if tokens == 0 || half == 0 {
            return Ok(None);
        }
        let mut angles = vec![(0.0f32, 0.0f32); tokens * half];
        for (position, row) in positions.iter().zip(angles.chunks_mut(half)) {
            params.angles(*position, factors, row);
        }
        let flat: Vec<f32> = angles.iter().flat_map(|(c, s)| [*c, *s]).collect();
        let pairs = tokens * params.heads * half;
        let second_heads = second.map_or(0, |(_, other)| other.heads);
        let second_pairs = tokens * second_heads * half;
        if pairs + second_pairs == 0 {
            return Ok(None);
        }
        let neox = u32::from(params.style == RopeStyle::Neox);
        let words = [
            pairs as u32,
            params.heads as u32,
            params.head_dim as u32,
            half as u32,
            neox,
            0,
            second_pairs as u32,
            second_heads as u32,
            0,
            0,
            0,
            0,
        ];
        Ok(Some(RopePlan {
            words,
            angles: flat,
            pairs: [pairs, second_pairs],
        }))
    }
}
