//! `--dump-layers`: every intermediate tensor of a prompt pass, printed like llama.cpp's
//! eval-callback (name, shape, sum, first values) so the two can be diffed.

use std::fmt::Write as _;
use std::path::Path;

use anyhow::Context;
use runit_engine::Session;
use runit_model::LayerObserver;

struct TextDump {
    out: String,
}

impl LayerObserver for TextDump {
    fn observe(&mut self, name: &str, rows: usize, width: usize, data: &[f32]) {
        if std::env::var("RUNIT_DUMP_FULL").is_ok_and(|v| v.split(',').any(|n| n == name)) {
            let _ = writeln!(self.out, "FULL {name} {width} {data:?}");
        }
        let sum: f64 = data.iter().map(|&x| x as f64).sum();
        let first: Vec<String> = data.iter().take(6).map(|x| format!("{x:.4}")).collect();
        let _ = writeln!(
            self.out,
            "{name} = {{{width}, {rows}}} sum = {sum:.6} first = [{}]",
            first.join(", ")
        );
    }
}

/// Evaluates `prompt` in `session` and writes the dump to `path`.
pub fn dump_prompt_layers(
    session: &mut Session,
    prompt: &[u32],
    path: &Path,
) -> anyhow::Result<()> {
    let mut dump = TextDump {
        out: format!("tokens = {prompt:?}\n"),
    };
    session.eval(prompt, false, Some(&mut dump))?;
    std::fs::write(path, dump.out).with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}
