//! The parity suite's element-wise ops: residual add, scale, the gated activations and bias.

use runit_quant::GgmlType;

use super::{buffer, read, Suite, ELEMENTWISE_BOUND};
use crate::testing::random::{make_weight, Rng};
use crate::Activation;

impl Suite<'_> {
    pub(super) fn elementwise(&mut self) {
        let mut rng = Rng::new(0x5eed_0003);
        let len = 40_000;
        let a = rng.values(len, -6.0, 6.0);
        let c = rng.values(len, -2.0, 2.0);
        self.case(
            "add",
            format!("{len} elements"),
            None,
            ELEMENTWISE_BOUND,
            |b| {
                let mut dst = buffer(b, &a)?;
                b.add(&mut dst, &buffer(b, &c)?, len - 3)?;
                read(b, &dst, len)
            },
        );
        // The gates cover GELU's table and both of its cut-offs (at -10 and 10).
        let wide = rng.values(len, -12.0, 12.0);
        for (activation, name) in [(Activation::Silu, "silu"), (Activation::GeluTanh, "gelu")] {
            self.case(
                "gated_activation",
                format!("{name}, {len} elements"),
                None,
                ELEMENTWISE_BOUND,
                |b| {
                    let mut gate = buffer(b, &wide)?;
                    b.gated_activation(activation, &mut gate, &buffer(b, &c)?, len - 5)?;
                    read(b, &gate, len)
                },
            );
        }
        self.case(
            "scale",
            format!("{len} elements"),
            None,
            ELEMENTWISE_BOUND,
            |b| {
                let mut x = buffer(b, &a)?;
                b.scale(&mut x, 25.298_222, len - 7)?;
                read(b, &x, len)
            },
        );
        let (tokens, width) = (3, 96);
        let x = rng.values(tokens * width, -1.0, 1.0);
        let bias = rng.values(width, -0.5, 0.5);
        self.case(
            "add_bias",
            format!("{tokens} x {width}"),
            None,
            ELEMENTWISE_BOUND,
            |b| {
                let weight = make_weight(b, "parity.bias", GgmlType::F32, &[width], &bias)?;
                let mut input = buffer(b, &x)?;
                b.add_bias(&mut input, &weight, tokens)?;
                read(b, &input, tokens * width)
            },
        );
    }
}
