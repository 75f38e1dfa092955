//! Chat templates: the model's Jinja template (`tokenizer.chat_template`) rendered with
//! minijinja the way Hugging Face renders it (`trim_blocks`, `lstrip_blocks`, Python string
//! methods, `raise_exception`), with `messages`, `add_generation_prompt`, `bos_token` and
//! `eos_token` in scope. A file without a template gets ChatML, with a warning.
//!
//! Templates come from model files, so they are not trusted: every rendering runs under
//! [`RenderLimits`] (fuel and output size), and a model's template is checked once when it is
//! loaded ([`ChatTemplate::check`]).

mod builtin;
mod content;
mod limits;
mod strftime;

use minijinja::value::Serde;
use minijinja::{Environment, ErrorKind, Value};

pub use builtin::{builtin_template, BUILTIN_TEMPLATES};
pub use content::RenderedPrompt;
pub use limits::{RenderLimits, TemplateLimit};

use crate::error::TokenizerError;
use crate::tokenizer::Tokenizer;
use limits::LimitedOutput;

/// ChatML, the format of Qwen2.5 / SmolLM2 without their default system message; used when a
/// model file has no template.
pub const CHATML_TEMPLATE: &str = "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

const TEMPLATE_NAME: &str = "chat_template";

/// One message of a conversation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChatMessage {
    /// `system`, `user`, `assistant` or `tool`.
    pub role: String,
    /// The message text.
    pub content: String,
    /// The tool calls of an assistant message, as OpenAI's `tool_calls` array with each
    /// call's `function.arguments` parsed into a JSON value (as templates expect them).
    pub tool_calls: Option<serde_json::Value>,
    /// The call a `tool` message answers.
    pub tool_call_id: Option<String>,
    /// The name of the message's author or tool, when given.
    pub name: Option<String>,
}

/// What a template receives besides the conversation: the tools a model may call (OpenAI's
/// `tools` array, as llama.cpp's `--jinja` passes it) and extra variables
/// (`chat_template_kwargs`, such as `enable_thinking`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TemplateInputs {
    /// OpenAI's `tools` array; absent from the template when `None`.
    pub tools: Option<serde_json::Value>,
    /// Variables set in the template's scope; they cannot replace the conversation's own
    /// (`messages`, `tools`, `add_generation_prompt`, `bos_token`, `eos_token`).
    pub variables: serde_json::Map<String, serde_json::Value>,
}

impl ChatMessage {
    /// A message with the given role.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> ChatMessage {
        ChatMessage {
            role: role.into(),
            content: content.into(),
            tool_calls: None,
            tool_call_id: None,
            name: None,
        }
    }
    /// A `system` message.
    pub fn system(content: impl Into<String>) -> ChatMessage {
        ChatMessage::new("system", content)
    }
    /// A `user` message.
    pub fn user(content: impl Into<String>) -> ChatMessage {
        ChatMessage::new("user", content)
    }
    /// An `assistant` message.
    pub fn assistant(content: impl Into<String>) -> ChatMessage {
        ChatMessage::new("assistant", content)
    }
}

/// A compiled chat template with the model's BOS/EOS texts and the limits its renderings
/// run under.
pub struct ChatTemplate {
    environment: Environment<'static>,
    source: String,
    bos_token: String,
    eos_token: String,
    limits: RenderLimits,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("ChatTemplate")
            .field("bos_token", &self.bos_token)
            .field("eos_token", &self.eos_token)
            .field("limits", &self.limits)
            .finish_non_exhaustive()
    }
}

impl ChatTemplate {
    /// Compiles `source` to render under [`RenderLimits::DEFAULT`]; a syntax error is
    /// reported with its template line.
    pub fn new(
        source: &str,
        bos_token: &str,
        eos_token: &str,
    ) -> Result<ChatTemplate, TokenizerError> {
        let mut environment = Environment::new();
        let syntax = minijinja::syntax::SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .build()
            .map_err(template_error)?;
        environment.set_syntax(syntax);
        environment
            .set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        minijinja_contrib::add_to_environment(&mut environment);
        environment.add_function(
            "raise_exception",
            |message: String| -> Result<Value, minijinja::Error> {
                Err(minijinja::Error::new(ErrorKind::InvalidOperation, message))
            },
        );
        environment.add_function("strftime_now", |format: String| -> String {
            strftime::strftime_now(&format)
        });
        environment
            .add_template_owned(TEMPLATE_NAME, source.to_string())
            .map_err(template_error)?;
        let mut template = ChatTemplate {
            environment,
            source: source.to_string(),
            bos_token: bos_token.to_string(),
            eos_token: eos_token.to_string(),
            limits: RenderLimits::DEFAULT,
        };
        template.set_limits(RenderLimits::DEFAULT);
        Ok(template)
    }

    /// Renders under `limits` from now on.
    pub fn set_limits(&mut self, limits: RenderLimits) {
        self.environment.set_fuel(Some(limits.fuel));
        self.limits = limits;
    }

    /// The limits renderings run under.
    pub fn limits(&self) -> RenderLimits {
        self.limits
    }

    /// The tokenizer's template (`tokenizer.chat_template`), or ChatML with a warning when
    /// the file has none, rendering under `limits` and [checked](ChatTemplate::check).
    pub fn from_tokenizer_limited(
        tokenizer: &Tokenizer,
        limits: RenderLimits,
    ) -> Result<ChatTemplate, TokenizerError> {
        let source = tokenizer.chat_template().unwrap_or_else(|| {
            tracing::warn!("the model file has no tokenizer.chat_template; using ChatML");
            CHATML_TEMPLATE
        });
        ChatTemplate::from_source_limited(source, tokenizer, limits)
    }

    /// The template `source` (instead of the model's, as llama.cpp's
    /// `--chat-template-file`) with `tokenizer`'s BOS/EOS texts, rendering under `limits` and
    /// [checked](ChatTemplate::check).
    pub fn from_source_limited(
        source: &str,
        tokenizer: &Tokenizer,
        limits: RenderLimits,
    ) -> Result<ChatTemplate, TokenizerError> {
        let bos = tokenizer.token_text(tokenizer.bos_id());
        let eos = tokenizer.token_text(tokenizer.eos_id());
        let mut template = ChatTemplate::new(source, &bos, &eos)?;
        template.set_limits(limits);
        template.check()?;
        Ok(template)
    }

    /// [`ChatTemplate::from_tokenizer_limited`] with [`RenderLimits::DEFAULT`].
    pub fn from_tokenizer(tokenizer: &Tokenizer) -> Result<ChatTemplate, TokenizerError> {
        ChatTemplate::from_tokenizer_limited(tokenizer, RenderLimits::DEFAULT)
    }

    /// Checks that the template renders a plain conversation (a system and a user message)
    /// within its limits, so that a broken or runaway template refuses to load instead of
    /// failing every request. A template that refuses system messages (Mistral's, Gemma 1's
    /// raise an error for them) passes when it renders the user message alone.
    pub fn check(&self) -> Result<(), TokenizerError> {
        let user = ChatMessage::user("Hello!");
        let conversation = [
            ChatMessage::system("You are a helpful assistant."),
            user.clone(),
        ];
        match self.render(&conversation, true) {
            Ok(_) => Ok(()),
            Err(error @ TokenizerError::TemplateLimit(_)) => Err(error),
            Err(error) => match self.render(&[user], true) {
                Ok(_) => {
                    tracing::info!("the chat template refuses system messages ({error})");
                    Ok(())
                }
                Err(_) => Err(error),
            },
        }
    }

    /// Renders the conversation and marks the special-token text that came from message
    /// contents, for [`Tokenizer::encode_prompt`] to tokenize as plain text (so that a
    /// message cannot forge turns). A template whose output depends on such text is
    /// refused with [`TokenizerError::SpecialTextInContent`].
    pub fn render_prompt(
        &self,
        tokenizer: &Tokenizer,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<RenderedPrompt, TokenizerError> {
        self.render_prompt_with(
            tokenizer,
            messages,
            add_generation_prompt,
            &TemplateInputs::default(),
        )
    }

    /// [`ChatTemplate::render_prompt`] with tools and extra variables in scope.
    pub fn render_prompt_with(
        &self,
        tokenizer: &Tokenizer,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
        inputs: &TemplateInputs,
    ) -> Result<RenderedPrompt, TokenizerError> {
        content::render_prompt(self, tokenizer, messages, add_generation_prompt, inputs)
    }

    /// The template's source text.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Renders the conversation; `add_generation_prompt` appends the assistant's turn header.
    /// A runtime error (`raise_exception`, a bad expression) names the template line; a
    /// rendering that passes the fuel or output limit is [`TokenizerError::TemplateLimit`].
    pub fn render(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String, TokenizerError> {
        self.render_with(messages, add_generation_prompt, &TemplateInputs::default())
    }

    /// [`ChatTemplate::render`] with tools and extra variables in scope.
    pub fn render_with(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
        inputs: &TemplateInputs,
    ) -> Result<String, TokenizerError> {
        let template = self
            .environment
            .get_template(TEMPLATE_NAME)
            .map_err(template_error)?;
        let messages: Vec<Value> = messages.iter().map(message_value).collect();
        let context = minijinja::context! {
            messages => messages,
            tools => inputs.tools.as_ref().map(|tools| Value::from(Serde(tools))),
            add_generation_prompt => add_generation_prompt,
            bos_token => self.bos_token.as_str(),
            eos_token => self.eos_token.as_str(),
            ..Value::from(Serde(&inputs.variables))
        };
        let mut output = LimitedOutput::new(self.limits.max_output_bytes);
        match template.render_captured_to(context, &mut output) {
            Ok(_) => output
                .into_string()
                .map_err(|error| TokenizerError::Template {
                    line: 0,
                    message: format!("the rendered text is not UTF-8: {error}"),
                }),
            Err(_) if output.exceeded() => Err(TokenizerError::TemplateLimit(
                TemplateLimit::OutputBytes(self.limits.max_output_bytes),
            )),
            Err(error) if error.kind() == ErrorKind::OutOfFuel => Err(
                TokenizerError::TemplateLimit(TemplateLimit::Fuel(self.limits.fuel)),
            ),
            Err(error) => Err(template_error(error)),
        }
    }
}

/// A message as templates see it: `role` and `content`, and `tool_calls`, `tool_call_id`
/// and `name` when it has them.
fn message_value(message: &ChatMessage) -> Value {
    let mut fields = vec![
        ("role", Value::from(message.role.as_str())),
        ("content", Value::from(message.content.as_str())),
    ];
    if let Some(calls) = &message.tool_calls {
        fields.push(("tool_calls", Value::from(Serde(calls))));
    }
    if let Some(id) = &message.tool_call_id {
        fields.push(("tool_call_id", Value::from(id.as_str())));
    }
    if let Some(name) = &message.name {
        fields.push(("name", Value::from(name.as_str())));
    }
    Value::from_pairs(fields)
}

fn template_error(error: minijinja::Error) -> TokenizerError {
    let mut message = error.to_string();
    let mut source = std::error::Error::source(&error);
    while let Some(cause) = source {
        message.push_str(": ");
        message.push_str(&cause.to_string());
        source = cause.source();
    }
    TokenizerError::Template {
        line: error.line().unwrap_or(0),
        message,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn syntax_errors_name_the_line() {
        let error = ChatTemplate::new("line one\n{% if %}\n", "", "").expect_err("bad syntax");
        match error {
            TokenizerError::Template { line, .. } => assert_eq!(line, 2),
            other => panic!("unexpected {other}"),
        }
    }

    #[test]
    fn raise_exception_names_the_line() {
        let source = "{% for m in messages %}\n{% if m.role == 'tool' %}\n{{ raise_exception('no tools') }}\n{% endif %}{% endfor %}";
        let template = ChatTemplate::new(source, "", "").expect("compiles");
        let error = template
            .render(&[ChatMessage::new("tool", "x")], false)
            .expect_err("raises");
        match error {
            TokenizerError::Template { line, message } => {
                assert_eq!(line, 3);
                assert!(message.contains("no tools"), "{message}");
            }
            other => panic!("unexpected {other}"),
        }
    }
}
