//! `runit chat`: an interactive conversation rendered with the model's chat template, with line
//! editing and saved history (rustyline), multi-line input (`"""` ... `"""`, or Alt-Enter),
//! and `/` commands that are never sent to the model. Ctrl-C stops an answer (the partial
//! answer is kept, marked as stopped) or, at an empty prompt, quits. When the context fills,
//! the oldest turns are dropped (the system message never is).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use anyhow::{bail, Context};
use runit_engine::speculative::Speculation;
use runit_engine::{generate_with, GenerateParams, Sampler, Session, StopReason};
use runit_tokenizer::{
    ChatMessage, ChatTemplate, RenderLimits, StreamDecoder, StreamOptions, Tokenizer,
};
use rustyline::error::ReadlineError;
use rustyline::{
    Cmd, ConditionalEventHandler, Event, EventContext, EventHandler, KeyCode, KeyEvent, Modifiers,
    RepeatCount,
};
use serde_json::json;

use super::common::{chat_template, load, parse_n_predict, ModelArgs};
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
    /// System message that starts the conversation (`-sys`, as llama.cpp).
    #[arg(long, visible_alias = "system-prompt")]
    pub system: Option<String>,
    /// Most tokens per answer; -1: until the context is full.
    #[arg(short = 'n', long = "n-predict", default_value = "1024", allow_hyphen_values = true,
          value_parser = parse_n_predict)]
    pub n_predict: usize,
    /// Accepted for llama-cli's `-cnv`: `runit chat` is always a conversation.
    #[arg(long)]
    pub conversation: bool,
    /// Chat template: a built-in name (chatml, llama3, mistral, gemma, qwen3) or a Jinja file,
    /// instead of the model's own.
    #[arg(long, value_name = "NAME|FILE")]
    pub chat_template: Option<String>,
}

const HELP: &str = "\
/help            this list
/clear           forget the conversation (the system message stays)
/system TEXT     set the system message (empty TEXT removes it)
/save FILE       write the conversation as JSON
/load FILE       read a conversation written by /save
/exit, /bye      quit (also Ctrl-D, or Ctrl-C at an empty prompt)
\"\"\"              start or end a multi-line message (Alt-Enter also adds a line)
//TEXT           send a message that starts with /
Ctrl-C while the model answers stops the answer; the part written so far is kept.";

/// Tokens kept free for the answer when old turns are dropped to make room.
const ANSWER_ROOM: usize = 256;

/// What the user typed, read as a command or a message.
#[derive(Debug, PartialEq, Eq)]
enum Input {
    Message(String),
    Help,
    Clear,
    System(String),
    Save(PathBuf),
    Load(PathBuf),
    Exit,
    Unknown(String),
}

fn parse_input(line: &str) -> Input {
    if let Some(rest) = line.strip_prefix("//") {
        return Input::Message(format!("/{rest}"));
    }
    let Some(command) = line.trim().strip_prefix('/') else {
        return Input::Message(line.to_string());
    };
    let (name, argument) = match command.split_once(char::is_whitespace) {
        Some((name, argument)) => (name, argument.trim()),
        None => (command, ""),
    };
    match name {
        "help" | "?" => Input::Help,
        "clear" => Input::Clear,
        "system" => Input::System(argument.to_string()),
        "save" if !argument.is_empty() => Input::Save(PathBuf::from(argument)),
        "load" if !argument.is_empty() => Input::Load(PathBuf::from(argument)),
        "exit" | "bye" | "quit" => Input::Exit,
        _ => Input::Unknown(line.trim().to_string()),
    }
}

/// Ctrl-C at the prompt: clears a line being typed, or quits at an empty one.
struct CtrlC;

impl ConditionalEventHandler for CtrlC {
    fn handle(&self, _: &Event, _: RepeatCount, _: bool, context: &EventContext) -> Option<Cmd> {
        if context.line().is_empty() {
            Some(Cmd::Interrupt)
        } else {
            Some(Cmd::Kill(rustyline::Movement::WholeLine))
        }
    }
}

/// The conversation and what of it the session's cache holds.
#[derive(Debug)]
struct Conversation {
    system: Option<String>,
    /// User and assistant turns, oldest first.
    turns: Vec<ChatMessage>,
}

impl Conversation {
    fn messages(&self) -> Vec<ChatMessage> {
        let system = self
            .system
            .iter()
            .map(|text| ChatMessage::system(text.clone()));
        system.chain(self.turns.iter().cloned()).collect()
    }

    fn save(&self, path: &Path) -> anyhow::Result<()> {
        let messages: Vec<_> = self
            .messages()
            .iter()
            .map(|message| json!({"role": message.role, "content": message.content}))
            .collect();
        std::fs::write(path, serde_json::to_vec_pretty(&messages)?)
            .with_context(|| format!("cannot write {}", path.display()))
    }

    fn load(path: &Path) -> anyhow::Result<Conversation> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read {}", path.display()))?;
        let messages: serde_json::Value =
            serde_json::from_str(&text).with_context(|| format!("{}: not JSON", path.display()))?;
        let Some(messages) = messages.as_array() else {
            bail!(
                "{}: expected a JSON array of {{role, content}} messages",
                path.display()
            );
        };
        let mut conversation = Conversation {
            system: None,
            turns: Vec::new(),
        };
        for (index, message) in messages.iter().enumerate() {
            let (Some(role), Some(content)) =
                (message["role"].as_str(), message["content"].as_str())
            else {
                bail!(
                    "{}: message {index} lacks a string `role` or `content`",
                    path.display()
                );
            };
            match role {
                "system" if index == 0 => conversation.system = Some(content.to_string()),
                "user" | "assistant" => conversation.turns.push(ChatMessage::new(role, content)),
                _ => bail!(
                    "{}: message {index} has role `{role}`; expected user or assistant (system first only)",
                    path.display()
                ),
            }
        }
        Ok(conversation)
    }
}

/// Where the history of typed lines is kept.
fn history_path() -> Option<PathBuf> {
    crate::hub::cache::runit_home()
        .ok()
        .map(|home| home.join("chat_history"))
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let params = args.sampling.params()?;
    let loaded = load(&args.model)?;
    let drafts = args.speculative.load(&args.model, &loaded)?;
    let mut speculation = drafts
        .as_ref()
        .map(|drafts| drafts.speculation())
        .transpose()?;
    // The tokens the session holds (the conversation so far), which a drafter sees.
    let mut held: Vec<u32> = Vec::new();
    let tokenizer = Arc::clone(&loaded.tokenizer);
    let template = chat_template(
        &loaded,
        args.chat_template.as_deref(),
        RenderLimits::DEFAULT,
    )?;
    let mut session = Session::new(loaded.model.clone(), &args.model.engine_config())?;
    // Each answer starts the grammar afresh.
    let constraint = args.sampling.constraint(&loaded.tokenizer)?;
    let mut sampler = Sampler::new(params)?;
    let interrupted = Arc::new(AtomicBool::new(false));
    {
        let flag = Arc::clone(&interrupted);
        ctrlc::set_handler(move || flag.store(true, Ordering::SeqCst))?;
    }
    let mut editor = rustyline::DefaultEditor::new()?;
    editor.bind_sequence(
        KeyEvent(KeyCode::Char('C'), Modifiers::CTRL),
        EventHandler::Conditional(Box::new(CtrlC)),
    );
    editor.bind_sequence(
        KeyEvent(KeyCode::Enter, Modifiers::ALT),
        EventHandler::Simple(Cmd::Newline),
    );
    let history = history_path();
    if let Some(path) = &history {
        let _ = editor.load_history(path);
    }
    let mut conversation = Conversation {
        system: args.system.clone(),
        turns: Vec::new(),
    };
    // Text of the conversation already evaluated in the session (its rendered prefix).
    let mut evaluated = String::new();
    eprintln!(
        "runit chat: {} ({} tokens of context). Type a message; /help lists commands, /bye quits.",
        loaded.path.display(),
        session.context_size()
    );
    loop {
        let line = match read_message(&mut editor) {
            Ok(Some(line)) => line,
            Ok(None) => break,
            Err(error) => return Err(error),
        };
        if line.trim().is_empty() {
            continue;
        }
        let _ = editor.add_history_entry(line.as_str());
        match parse_input(&line) {
            Input::Message(text) => {
                conversation.turns.push(ChatMessage::user(text));
                let answered = answer(
                    &mut Turn {
                        session: &mut session,
                        sampler: &mut sampler,
                        tokenizer: &tokenizer,
                        template: &template,
                        interrupted: &interrupted,
                        max_tokens: args.n_predict,
                        speculation: speculation.as_mut(),
                        held: &mut held,
                    },
                    &mut conversation,
                    &mut evaluated,
                    &constraint,
                );
                if let Err(error) = answered {
                    eprintln!("error: {error:#}");
                }
            }
            Input::Help => eprintln!("{HELP}"),
            Input::Clear => {
                conversation.turns.clear();
                eprintln!("(conversation cleared)");
            }
            Input::System(text) => {
                conversation.system = (!text.is_empty()).then_some(text);
                eprintln!(
                    "(system message {})",
                    if conversation.system.is_some() {
                        "set"
                    } else {
                        "removed"
                    }
                );
            }
            Input::Save(path) => match conversation.save(&path) {
                Ok(()) => eprintln!(
                    "(saved {} messages to {})",
                    conversation.messages().len(),
                    path.display()
                ),
                Err(error) => eprintln!("error: {error:#}"),
            },
            Input::Load(path) => match Conversation::load(&path) {
                Ok(loaded) => {
                    conversation = loaded;
                    eprintln!(
                        "(loaded {} messages from {})",
                        conversation.messages().len(),
                        path.display()
                    );
                }
                Err(error) => eprintln!("error: {error:#}"),
            },
            Input::Exit => break,
            Input::Unknown(command) => {
                eprintln!("unknown command {command}; /help lists the commands (start with // to send a /)")
            }
        }
    }
    if let Some(path) = &history {
        if let Some(folder) = path.parent() {
            let _ = std::fs::create_dir_all(folder);
        }
        if let Err(error) = editor.save_history(path) {
            eprintln!(
                "warning: cannot save the history to {}: {error}",
                path.display()
            );
        }
    }
    Ok(())
}

/// One message from the editor: a line, or the lines between `"""` markers; `None` at the end
/// of input, `/exit`-like Ctrl-C or Ctrl-D.
fn read_message(editor: &mut rustyline::DefaultEditor) -> anyhow::Result<Option<String>> {
    let first = match editor.readline("> ") {
        Ok(line) => line,
        Err(ReadlineError::Interrupted | ReadlineError::Eof) => return Ok(None),
        Err(error) => return Err(error.into()),
    };
    if first.trim() != "\"\"\"" && !first.trim_start().starts_with("\"\"\"") {
        return Ok(Some(first));
    }
    let mut lines = vec![first.trim_start().trim_start_matches("\"\"\"").to_string()];
    loop {
        match editor.readline("... ") {
            Ok(line) if line.trim_end().ends_with("\"\"\"") => {
                lines.push(line.trim_end().trim_end_matches("\"\"\"").to_string());
                break;
            }
            Ok(line) => lines.push(line),
            Err(ReadlineError::Interrupted) => return Ok(Some(String::new())),
            Err(ReadlineError::Eof) => break,
            Err(error) => return Err(error.into()),
        }
    }
    Ok(Some(lines.join("\n").trim_matches('\n').to_string()))
}

/// What one answer needs.
struct Turn<'a> {
    session: &'a mut Session,
    sampler: &'a mut Sampler,
    tokenizer: &'a Tokenizer,
    template: &'a ChatTemplate,
    interrupted: &'a AtomicBool,
    max_tokens: usize,
    /// The drafter of speculative decoding, when one is asked for.
    speculation: Option<&'a mut Speculation>,
    /// The tokens the session holds (what the drafter may look up).
    held: &'a mut Vec<u32>,
}

/// Answers the conversation's last (user) message, streaming the answer to stdout, and adds the
/// answer to the conversation. Old turns are dropped first when the prompt and room for an
/// answer do not fit the context.
fn answer(
    turn: &mut Turn<'_>,
    conversation: &mut Conversation,
    evaluated: &mut String,
    constraint: &Option<runit_engine::constraint::Constraint>,
) -> anyhow::Result<()> {
    let context = turn.session.context_size();
    let room = ANSWER_ROOM.min(turn.max_tokens).min(context / 4);
    let mut dropped = 0;
    let rendered = loop {
        let rendered = match turn.template.render(&conversation.messages(), true) {
            Ok(rendered) => rendered,
            Err(error) => {
                conversation.turns.pop();
                return Err(error.into());
            }
        };
        let tokens = turn.tokenizer.encode(&rendered, true, true).len();
        if tokens + room <= context {
            break rendered;
        }
        if conversation.turns.len() <= 1 {
            conversation.turns.pop();
            bail!("the message takes {tokens} tokens with the system message; the context holds {context} (with {room} for the answer): shorten it or raise -c");
        }
        // Drop the oldest user turn and the answer after it.
        let cut = conversation
            .turns
            .iter()
            .skip(1)
            .position(|m| m.role == "user")
            .map_or(1, |at| at + 1);
        conversation.turns.drain(..cut);
        dropped += cut;
    };
    if dropped > 0 {
        eprintln!("(context full: dropped the {dropped} oldest messages)");
    }
    // Evaluate only what is new when the rendering extends what the cache holds.
    let new_text = match rendered.strip_prefix(evaluated.as_str()) {
        Some(rest) if turn.session.n_past() > 0 => rest.to_string(),
        _ => {
            turn.session.reset();
            rendered.clone()
        }
    };
    let prompt = turn
        .tokenizer
        .encode(&new_text, turn.session.n_past() == 0, true);
    turn.interrupted.store(false, Ordering::SeqCst);
    let mut stream = StreamDecoder::new(turn.tokenizer, StreamOptions::default());
    let mut text = String::new();
    let params = GenerateParams {
        max_tokens: turn.max_tokens,
        end_of_generation: turn.tokenizer.eog_ids(),
        top_logprobs: 0,
    };
    turn.sampler.set_constraint(constraint.clone());
    let mut stdout = std::io::stdout();
    let interrupted = turn.interrupted;
    if turn.session.n_past() == 0 {
        turn.held.clear();
    }
    if let Some(speculation) = turn.speculation.as_deref_mut() {
        speculation.context = turn.held.clone();
    }
    let mut answer_tokens = Vec::new();
    let output = generate_with(
        turn.session,
        turn.sampler,
        &prompt,
        &params,
        turn.speculation.as_deref_mut(),
        |token| {
            answer_tokens.push(token.id);
            if let Ok(piece) = stream.push(token.id) {
                text.push_str(&piece);
                let _ = stdout.write_all(piece.as_bytes());
                let _ = stdout.flush();
            }
            !interrupted.load(Ordering::SeqCst)
        },
    );
    turn.held.extend_from_slice(&prompt);
    turn.held.extend_from_slice(&answer_tokens);
    text.push_str(&stream.finish());
    println!();
    let output = match output {
        Ok(output) => output,
        Err(error) => {
            turn.session.reset();
            evaluated.clear();
            conversation.turns.pop();
            return Err(error.into());
        }
    };
    match output.stop {
        StopReason::Cancelled => eprintln!("[stopped: the partial answer is kept]"),
        StopReason::Limit if turn.session.n_past() + 2 > context => {
            eprintln!("[cut: the context is full; older turns are dropped before the next answer]")
        }
        StopReason::Limit => eprintln!("[cut at -n {} tokens]", turn.max_tokens),
        StopReason::EndOfGeneration => {}
    }
    conversation.turns.push(ChatMessage::assistant(text));
    // The cache now holds the prompt and the answer; the next rendering must extend it.
    let with_answer = turn.template.render(&conversation.messages(), false)?;
    *evaluated = if with_answer.starts_with(&rendered) {
        with_answer
    } else {
        turn.session.reset();
        String::new()
    };
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slash_commands_are_never_messages() {
        assert_eq!(parse_input("hello"), Input::Message("hello".into()));
        assert_eq!(parse_input("/bye"), Input::Exit);
        assert_eq!(parse_input(" /exit "), Input::Exit);
        assert_eq!(
            parse_input("/system Be brief."),
            Input::System("Be brief.".into())
        );
        assert_eq!(
            parse_input("/save chat.json"),
            Input::Save("chat.json".into())
        );
        assert_eq!(parse_input("/save"), Input::Unknown("/save".into()));
        assert_eq!(parse_input("/helpme"), Input::Unknown("/helpme".into()));
        assert_eq!(
            parse_input("//etc/hosts?"),
            Input::Message("/etc/hosts?".into())
        );
    }

    #[test]
    fn a_saved_conversation_loads_back() {
        let path = std::env::temp_dir().join(format!("runit-chat-{}.json", std::process::id()));
        let conversation = Conversation {
            system: Some("Be brief.".into()),
            turns: vec![ChatMessage::user("Hi"), ChatMessage::assistant("Hello")],
        };
        conversation.save(&path).expect("saved");
        let loaded = Conversation::load(&path).expect("loaded");
        assert_eq!(loaded.messages(), conversation.messages());
        std::fs::write(&path, r#"[{"role": "tool", "content": "x"}]"#).expect("write");
        assert!(Conversation::load(&path)
            .unwrap_err()
            .to_string()
            .contains("role `tool`"));
        let _ = std::fs::remove_file(&path);
    }
}
