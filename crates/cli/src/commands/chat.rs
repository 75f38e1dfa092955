//! `runit chat`: an interactive multi-turn conversation rendered with the model's chat
//! template. Ctrl-C stops the current answer without leaving; `/exit` (or end of input) quits.

use std::io::{BufRead, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use runit_engine::{generate_with, GenerateParams, Sampler, Session};
use runit_tokenizer::{ChatMessage, ChatTemplate, StreamDecoder, StreamOptions};

use super::common::{load, ModelArgs};
use super::sampling::SamplingArgs;
use super::speculative::SpeculativeArgs;

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub sampling: SamplingArgs,
    #[command(flatten)]
    pub speculative: SpeculativeArgs,
    /// System message that starts the conversation.
    #[arg(long)]
    pub system: Option<String>,
    /// Most tokens per answer.
    #[arg(short = 'n', long = "n-predict", default_value_t = 1024)]
    pub n_predict: usize,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let params = args.sampling.params()?;
    let loaded = load(&args.model)?;
    let drafts = args.speculative.load(&args.model, &loaded)?;
    let mut speculation = drafts
        .as_ref()
        .map(|drafts| drafts.speculation())
        .transpose()?;
    // The tokens the session holds (the conversation so far), which the drafter sees.
    let mut conversation: Vec<u32> = Vec::new();
    let tokenizer = &loaded.tokenizer;
    let template = ChatTemplate::from_gguf(&loaded.file)?;
    let mut session = Session::new(loaded.model.clone(), &args.model.engine_config())?;
    // Each answer starts the grammar afresh.
    let constraint = args.sampling.constraint(&loaded.tokenizer)?;
    let mut sampler = Sampler::new(params)?;
    let interrupted = Arc::new(AtomicBool::new(false));
    {
        let flag = Arc::clone(&interrupted);
        ctrlc::set_handler(move || flag.store(true, Ordering::SeqCst))?;
    }
    let mut messages = Vec::new();
    if let Some(system) = &args.system {
        messages.push(ChatMessage::system(system.clone()));
    }
    // Text of the conversation already evaluated in the session (its rendered prefix).
    let mut evaluated = String::new();
    eprintln!("runit chat: type a message and press Enter; /exit quits, Ctrl-C stops an answer.");
    let stdin = std::io::stdin();
    let mut stdout = std::io::stdout();
    loop {
        eprint!("> ");
        let mut line = String::new();
        if stdin.lock().read_line(&mut line)? == 0 {
            break;
        }
        let line = line.trim_end_matches(['\n', '\r']);
        if line.trim() == "/exit" {
            break;
        }
        if line.trim().is_empty() {
            continue;
        }
        messages.push(ChatMessage::user(line));
        // A template that fails on this message (an error it raises, or its fuel or output
        // limit) leaves the conversation as it was.
        let rendered = match template.render(&messages, true) {
            Ok(rendered) => rendered,
            Err(error) => {
                eprintln!("error: {error}");
                messages.pop();
                continue;
            }
        };
        // Evaluate only what is new when the rendering extends what the cache holds.
        let new_text = match rendered.strip_prefix(&evaluated) {
            Some(rest) if session.n_past() > 0 => rest.to_string(),
            _ => {
                session.reset();
                rendered.clone()
            }
        };
        let prompt = tokenizer.encode(&new_text, session.n_past() == 0, true);
        interrupted.store(false, Ordering::SeqCst);
        let mut stream = StreamDecoder::new(tokenizer, StreamOptions::default());
        let mut answer = String::new();
        let gen = GenerateParams {
            max_tokens: args.n_predict,
            end_of_generation: tokenizer.eog_ids(),
            top_logprobs: 0,
        };
        sampler.set_constraint(constraint.clone());
        if session.n_past() == 0 {
            conversation.clear();
        }
        if let Some(speculation) = &mut speculation {
            speculation.context = conversation.clone();
        }
        let mut answer_tokens = Vec::new();
        let result = generate_with(
            &mut session,
            &mut sampler,
            &prompt,
            &gen,
            speculation.as_mut(),
            |token| {
                answer_tokens.push(token.id);
                if let Ok(text) = stream.push(token.id) {
                    answer.push_str(&text);
                    let _ = stdout.write_all(text.as_bytes());
                    let _ = stdout.flush();
                }
                !interrupted.load(Ordering::SeqCst)
            },
        );
        answer.push_str(&stream.finish());
        println!();
        conversation.extend_from_slice(&prompt);
        conversation.extend_from_slice(&answer_tokens);
        match result {
            Ok(_) => {}
            Err(runit_engine::EngineError::PromptTooLong { .. })
            | Err(runit_engine::EngineError::ContextFull { .. }) => {
                eprintln!("(the context is full; starting a new conversation)");
                messages.clear();
                if let Some(system) = &args.system {
                    messages.push(ChatMessage::system(system.clone()));
                }
                session.reset();
                evaluated.clear();
                continue;
            }
            Err(e) => return Err(e.into()),
        }
        messages.push(ChatMessage::assistant(answer));
        // The cache now holds the prompt and the answer; the next rendering must extend it.
        let with_answer = template.render(&messages, false)?;
        evaluated = if with_answer.starts_with(&rendered) {
            with_answer
        } else {
            session.reset();
            String::new()
        };
    }
    Ok(())
}
