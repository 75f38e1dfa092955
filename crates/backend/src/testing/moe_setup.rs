//! Inputs of the mixture-of-experts cases ([`crate::FusedOps::moe_ffn`]): seeded stacked
//! expert weights, a router, and the buffers of one call, for the parity suite and the
//! device backends' own MoE tests.
//!
//! The default router makes routing exact on every backend: its row `e` is the unit vector
//! `e`, so token `t`'s logit `e` is `x[t][e]` bit for bit (a sum of one product by 1 and
//! zeros), and planting equal values in `x` plants exactly tied logits.

use super::random::{make_weight, Rng};
use crate::{unfused, Backend, BackendError, Buffer, MoeBuffers, MoeFfn, MoeFfnRun, Weight};
use runit_quant::GgmlType;

/// The weights of one MoE layer as f32 values, and its routing rule.
#[derive(Debug, Clone)]
pub struct MoeCase {
    /// Type of the gate, up and down weights.
    pub ty: GgmlType,
    pub router_ty: GgmlType,
    pub embd: usize,
    pub ff: usize,
    pub experts: usize,
    pub used: usize,
    pub renormalise: bool,
    router: Vec<f32>, // [experts, embd]
    gate: Vec<f32>,   // [experts, ff, embd]
    up: Vec<f32>,     // [experts, ff, embd]
    down: Vec<f32>,   // [experts, embd, ff]
}

impl MoeCase {
    /// Random experts of type `ty` with the exact router (`embd >= experts`).
    pub fn new(
        seed: u64,
        ty: GgmlType,
        (embd, ff): (usize, usize),
        (experts, used): (usize, usize),
        renormalise: bool,
    ) -> MoeCase {
        assert!(embd >= experts, "the exact router needs embd >= experts");
        let mut rng = Rng::new(seed);
        let mut router = vec![0.0; experts * embd];
        for e in 0..experts {
            router[e * embd + e] = 1.0;
        }
        MoeCase {
            ty,
            router_ty: GgmlType::F32,
            embd,
            ff,
            experts,
            used,
            renormalise,
            router,
            gate: rng.normal(experts * ff * embd, 0.05),
            up: rng.normal(experts * ff * embd, 0.05),
            down: rng.normal(experts * embd * ff, 0.05),
        }
    }

    /// The same experts with a random router of type `ty` (realistic logits, which a
    /// backend computes with its own rounding).
    pub fn with_random_router(mut self, seed: u64, ty: GgmlType) -> MoeCase {
        self.router = Rng::new(seed).normal(self.experts * self.embd, 0.5);
        self.router_ty = ty;
        self
    }

    /// `tokens` rows of input: values in `[-1, 1)`, the first `experts` of each row (the
    /// exact router's logits) in `[-2, 2)`.
    pub fn inputs(&self, rng: &mut Rng, tokens: usize) -> Vec<f32> {
        let mut x = rng.values(tokens * self.embd, -1.0, 1.0);
        for row in x.chunks_mut(self.embd) {
            for value in &mut row[..self.experts] {
                *value *= 2.0;
            }
        }
        x
    }

    /// A one-line description for reports.
    pub fn describe(&self, tokens: usize) -> String {
        format!(
            "experts [{}x{}] x{}, {} used{}, router {}, {tokens} tokens",
            self.ff,
            self.embd,
            self.experts,
            self.used,
            if self.renormalise {
                " renormalised"
            } else {
                ""
            },
            self.router_ty,
        )
    }

    /// The weights on `backend`.
    pub fn load(&self, backend: &dyn Backend) -> Result<LoadedMoe, BackendError> {
        let (embd, ff, experts) = (self.embd, self.ff, self.experts);
        Ok(LoadedMoe {
            router: make_weight(
                backend,
                "moe.ffn_gate_inp",
                self.router_ty,
                &[embd, experts],
                &self.router,
            )?,
            gate: make_weight(
                backend,
                "moe.ffn_gate_exps",
                self.ty,
                &[embd, ff, experts],
                &self.gate,
            )?,
            up: make_weight(
                backend,
                "moe.ffn_up_exps",
                self.ty,
                &[embd, ff, experts],
                &self.up,
            )?,
            down: make_weight(
                backend,
                "moe.ffn_down_exps",
                self.ty,
                &[ff, embd, experts],
                &self.down,
            )?,
            experts,
            used: self.used,
            renormalise: self.renormalise,
        })
    }

    /// `moe_ffn` of `x` (`tokens` rows) on `backend` with fresh weights and buffers, or its
    /// default sequence ([`unfused::moe_ffn`]) when `primitive`; the output rows.
    pub fn run(
        &self,
        backend: &dyn Backend,
        x: &[f32],
        tokens: usize,
        primitive: bool,
    ) -> Result<Vec<f32>, BackendError> {
        let moe = self.load(backend)?;
        let mut workspace = MoeWorkspace::new(backend, &moe, tokens)?;
        backend.upload(&mut workspace.x, x)?;
        workspace.run(backend, &moe, tokens, primitive)?;
        workspace.output(backend, tokens)
    }
}

/// The weights of a [`MoeCase`] on a backend.
pub struct LoadedMoe {
    pub router: Weight,
    pub gate: Weight,
    pub up: Weight,
    pub down: Weight,
    pub experts: usize,
    pub used: usize,
    pub renormalise: bool,
}

impl LoadedMoe {
    /// The layer as [`crate::FusedOps::moe_ffn`] takes it.
    pub fn ffn(&self) -> MoeFfn<'_> {
        MoeFfn {
            router: &self.router,
            gate: &self.gate,
            up: &self.up,
            down: &self.down,
            experts: self.experts,
            used: self.used,
            renormalise: self.renormalise,
        }
    }
}

/// The buffers of `moe_ffn` calls of up to `capacity` rows, as a model's scratch holds them.
pub struct MoeWorkspace {
    embd: usize,
    /// `[capacity, embd]` input.
    pub x: Buffer,
    /// `[capacity, embd]` output.
    pub out: Buffer,
    router: Buffer,
    gathered: Buffer,
    gate: Buffer,
    up: Buffer,
    expert_out: Buffer,
}

impl MoeWorkspace {
    pub fn new(
        backend: &dyn Backend,
        moe: &LoadedMoe,
        capacity: usize,
    ) -> Result<MoeWorkspace, BackendError> {
        let (embd, ff) = (moe.gate.row_len(), moe.gate.rows());
        let rows = capacity.max(1);
        Ok(MoeWorkspace {
            embd,
            x: backend.alloc(rows * embd)?,
            out: backend.alloc(rows * embd)?,
            router: backend.alloc(rows * moe.experts)?,
            gathered: backend.alloc(rows * embd)?,
            gate: backend.alloc(rows * ff)?,
            up: backend.alloc(rows * ff)?,
            expert_out: backend.alloc(rows * embd)?,
        })
    }

    /// `moe_ffn` of the first `tokens` rows of `x` into `out` (the default sequence when
    /// `primitive`).
    pub fn run(
        &mut self,
        backend: &dyn Backend,
        moe: &LoadedMoe,
        tokens: usize,
        primitive: bool,
    ) -> Result<(), BackendError> {
        let run = MoeFfnRun {
            ffn: moe.ffn(),
            x: &self.x,
            tokens,
            scratch: MoeBuffers {
                router: &mut self.router,
                gathered: &mut self.gathered,
                gate: &mut self.gate,
                up: &mut self.up,
                expert_out: &mut self.expert_out,
            },
        };
        if primitive {
            unfused::moe_ffn(backend, run, &mut self.out)
        } else {
            backend.moe_ffn(run, &mut self.out)
        }
    }

    /// The first `tokens` rows of `out`.
    pub fn output(&self, backend: &dyn Backend, tokens: usize) -> Result<Vec<f32>, BackendError> {
        let mut values = vec![0.0; tokens * self.embd];
        backend.download(&self.out, &mut values)?;
        Ok(values)
    }
}
