//! `runit embed -m FILE TEXT...`: the L2-normalised embedding of each text, pooled as the
//! model declares (mean when it declares none), one JSON array of floats per line.

use std::io::Write;

use runit_engine::{embed, Session};
use runit_model::Pooling;

use super::common::{load, ModelArgs};

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    /// The texts to embed, each on its own output line.
    #[arg(required = true)]
    pub texts: Vec<String>,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let loaded = load(&args.model)?;
    let pooling = loaded.model.config.pooling.unwrap_or(Pooling::Mean);
    let mut session = Session::new(loaded.model.clone(), &args.model.engine_config())?;
    let mut stdout = std::io::stdout().lock();
    for text in &args.texts {
        let tokens = loaded.tokenizer.encode(text, true, false);
        if tokens.is_empty() {
            anyhow::bail!("the text {text:?} has no tokens");
        }
        let vector = embed(&mut session, &tokens, pooling)?;
        writeln!(stdout, "{}", serde_json::to_string(&vector)?)?;
    }
    Ok(())
}
