//! `runit tokenize -m FILE TEXT`: the token ids and pieces of a text (like llama-tokenize),
//! as `id -> 'piece'` lines or one JSON object `{"ids": [...], "pieces": [...]}`.

use std::io::Write;
use std::path::PathBuf;

use anyhow::Context;
use runit_gguf::GgufFile;
use runit_tokenizer::Tokenizer;
use serde_json::{json, Value as Json};

use super::common::ModelSource;

#[derive(clap::Args)]
pub struct Args {
    /// The model whose vocabulary is used.
    #[command(flatten)]
    pub source: ModelSource,
    /// The text to tokenize (or use -f).
    #[arg(required_unless_present = "file", conflicts_with = "file")]
    pub text: Option<String>,
    /// Read the text from this file, or from standard input with `-f -` (bytes as they are;
    /// invalid UTF-8 is tokenized too).
    #[arg(short = 'f', long = "file")]
    pub file: Option<PathBuf>,
    /// Do not add BOS/EOS even when the vocabulary asks for them.
    #[arg(long)]
    pub no_bos: bool,
    /// Tokenize special-token text (`<|im_start|>` ...) as plain text.
    #[arg(long)]
    pub no_parse_special: bool,
    /// Print one JSON object `{"ids": [...], "pieces": [...]}`.
    #[arg(long)]
    pub json: bool,
    /// Encode with this tokenizer.json (HF `tokenizers`) instead of the GGUF vocabulary.
    #[arg(long)]
    pub tokenizer: Option<PathBuf>,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let model = args.source.path()?;
    let file = GgufFile::open(&model).with_context(|| format!("opening {}", model.display()))?;
    let tokenizer = match &args.tokenizer {
        Some(path) => Tokenizer::from_tokenizer_json(path, &file),
        None => Tokenizer::from_gguf(&file),
    }
    .with_context(|| format!("building the tokenizer of {}", model.display()))?;
    let text = match (&args.text, &args.file) {
        (Some(text), _) => text.as_bytes().to_vec(),
        (None, Some(path)) if path.as_os_str() == "-" => {
            let mut bytes = Vec::new();
            std::io::Read::read_to_end(&mut std::io::stdin(), &mut bytes)
                .context("reading the text from standard input")?;
            bytes
        }
        (None, Some(path)) => {
            std::fs::read(path).with_context(|| format!("reading {}", path.display()))?
        }
        (None, None) => anyhow::bail!("give the text as an argument or with -f FILE"),
    };
    let ids = tokenizer.encode_bytes(&text, !args.no_bos, !args.no_parse_special);
    let pieces = ids
        .iter()
        .map(|&id| tokenizer.token_piece(id))
        .collect::<Result<Vec<_>, _>>()?;

    let mut out = std::io::stdout().lock();
    if args.json {
        // A piece that is not valid UTF-8 (part of a character) is given as its byte values.
        let pieces: Vec<Json> = pieces
            .iter()
            .map(|piece| match std::str::from_utf8(piece) {
                Ok(text) => json!(text),
                Err(_) => json!(piece),
            })
            .collect();
        writeln!(out, "{}", json!({ "ids": ids, "pieces": pieces }))?;
    } else {
        for (id, piece) in ids.iter().zip(&pieces) {
            writeln!(
                out,
                "{id:6} -> '{}'",
                String::from_utf8_lossy(piece).escape_debug()
            )?;
        }
    }
    Ok(())
}
