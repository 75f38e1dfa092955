// The one-chunk split attention's output as it is (`PrimitiveOps::attention`).

fn round_values(q_base: u32, lid: u32, values: vec2<f32>) {}
