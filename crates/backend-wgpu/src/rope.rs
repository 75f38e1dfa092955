//! RoPE of one buffer or of a step's queries and keys in one dispatch: the host's angles
//! (`RopeParams::angles`, as the CPU computes them) in a table, then `rope.wgsl`.

use runit_backend::{BackendError, Buffer, OpResult, RopeParams, RopeStyle, Weight};

use crate::backend::grid;
use crate::batch;
use crate::device::{at_least, buffer, weight};
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
        let (first, params) = xs[0];
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
            return Ok(());
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
            return Ok(());
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
        ];
        let threads = grid(pairs + second_pairs);
        let first = buffer(first, OP, "x")?;
        let angles = batch::table(&flat);
        match second {
            None => {
                let bindings = [angles, first.into()];
                self.dispatch_ranges(OP, Self::plain("rope"), &words, &bindings, threads)
            }
            Some((second, _)) => {
                let bindings = [angles, first.into(), buffer(second, OP, "k")?.into()];
                self.dispatch_ranges(OP, Self::plain("rope_pair"), &words, &bindings, threads)
            }
        }
    }
}
