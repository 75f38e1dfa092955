// The one-chunk attention's output as it is (`PrimitiveOps::attention`).

fn round_output(q_base: u32, lid: u32) {}
