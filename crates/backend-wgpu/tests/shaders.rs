//! Every WGSL kernel parses and validates with naga, and translates to Metal Shading
//! Language, so that a shader Metal would reject fails here (no Apple machine needed).

use naga::back::msl;
use naga::valid::{Capabilities, ValidationFlags, Validator};

#[test]
fn every_kernel_validates_and_translates_to_msl() {
    let sources = runit_backend_wgpu::kernel_sources();
    assert!(sources.len() > 20, "{} kernels", sources.len());
    let mut failures = Vec::new();
    for (name, source) in &sources {
        let module = match naga::front::wgsl::parse_str(source) {
            Ok(module) => module,
            Err(error) => {
                failures.push(format!("{name}: parse: {}", error.emit_to_string(source)));
                continue;
            }
        };
        let mut validator = Validator::new(ValidationFlags::all(), Capabilities::all());
        let info = match validator.validate(&module) {
            Ok(info) => info,
            Err(error) => {
                failures.push(format!(
                    "{name}: validate: {}",
                    error.emit_to_string(source)
                ));
                continue;
            }
        };
        let options = msl::Options {
            lang_version: (2, 4),
            ..Default::default()
        };
        let pipeline = msl::PipelineOptions::default();
        match msl::write_string(&module, &info, &options, &pipeline) {
            Ok((text, _)) => assert!(text.contains("kernel"), "{name}: no kernel in MSL"),
            Err(error) => failures.push(format!("{name}: msl: {error}")),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
