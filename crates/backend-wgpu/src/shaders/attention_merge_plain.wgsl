// The merged attention's output as it is (`PrimitiveOps::attention`).

fn round_values(group_base: u32, lid: u32, values: vec4<f32>, live: bool) {}
