//! Chat templates: the model's Jinja template (`tokenizer.chat_template`) rendered with
//! minijinja the way Hugging Face renders it (`trim_blocks`, `lstrip_blocks`, Python string
//! methods, `raise_exception`), with `messages`, `add_generation_prompt`, `bos_token` and
//! `eos_token` in scope. A file without a template gets ChatML, with a warning.

use minijinja::{Environment, ErrorKind, Value};

use crate::error::TokenizerError;
use crate::tokenizer::Tokenizer;

/// ChatML, the format of Qwen2.5 / SmolLM2 without their default system message; used when a
/// model file has no template.
pub const CHATML_TEMPLATE: &str = "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

const TEMPLATE_NAME: &str = "chat_template";

/// One message of a conversation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChatMessage {
    /// `system`, `user` or `assistant`.
    pub role: String,
    /// The message text.
    pub content: String,
}

impl ChatMessage {
    /// A message with the given role.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> ChatMessage {
        ChatMessage {
            role: role.into(),
            content: content.into(),
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

/// A compiled chat template with the model's BOS/EOS texts.
pub struct ChatTemplate {
    environment: Environment<'static>,
    bos_token: String,
    eos_token: String,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("ChatTemplate")
            .field("bos_token", &self.bos_token)
            .field("eos_token", &self.eos_token)
            .finish_non_exhaustive()
    }
}

impl ChatTemplate {
    /// Compiles `source`; a syntax error is reported with its template line.
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
            strftime_now(&format)
        });
        environment
            .add_template_owned(TEMPLATE_NAME, source.to_string())
            .map_err(template_error)?;
        Ok(ChatTemplate {
            environment,
            bos_token: bos_token.to_string(),
            eos_token: eos_token.to_string(),
        })
    }

    /// The tokenizer's template (`tokenizer.chat_template`), or ChatML with a warning when
    /// the file has none.
    pub fn from_tokenizer(tokenizer: &Tokenizer) -> Result<ChatTemplate, TokenizerError> {
        let bos = tokenizer.token_text(tokenizer.bos_id());
        let eos = tokenizer.token_text(tokenizer.eos_id());
        match tokenizer.chat_template() {
            Some(source) => ChatTemplate::new(source, &bos, &eos),
            None => {
                tracing::warn!("the model file has no tokenizer.chat_template; using ChatML");
                ChatTemplate::new(CHATML_TEMPLATE, &bos, &eos)
            }
        }
    }

    /// Renders the conversation; `add_generation_prompt` appends the assistant's turn header.
    /// A runtime error (`raise_exception`, a bad expression) names the template line.
    pub fn render(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String, TokenizerError> {
        let template = self
            .environment
            .get_template(TEMPLATE_NAME)
            .map_err(template_error)?;
        let messages: Vec<Value> = messages
            .iter()
            .map(|message| {
                minijinja::context! {
                    role => message.role.as_str(),
                    content => message.content.as_str(),
                }
            })
            .collect();
        let context = minijinja::context! {
            messages => messages,
            add_generation_prompt => add_generation_prompt,
            bos_token => self.bos_token.as_str(),
            eos_token => self.eos_token.as_str(),
        };
        template.render(context).map_err(template_error)
    }
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

/// `strftime_now(format)` for templates that print today's date (Llama 3.1+): supports
/// `%d`, `%m`, `%Y`, `%b`, `%B` and `%%`, in UTC.
fn strftime_now(format: &str) -> String {
    let seconds = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_secs());
    let (year, month, day) = civil_from_days((seconds / 86_400) as i64);
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    let month_name = MONTHS[(month - 1) as usize];
    let mut out = String::new();
    let mut characters = format.chars();
    while let Some(character) = characters.next() {
        if character != '%' {
            out.push(character);
            continue;
        }
        match characters.next() {
            Some('d') => out.push_str(&format!("{day:02}")),
            Some('m') => out.push_str(&format!("{month:02}")),
            Some('Y') => out.push_str(&year.to_string()),
            Some('b') => out.push_str(&month_name[..3]),
            Some('B') => out.push_str(month_name),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

/// Days since 1970-01-01 to (year, month, day), proleptic Gregorian.
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let shifted = days + 719_468;
    let era = shifted.div_euclid(146_097);
    let day_of_era = shifted.rem_euclid(146_097);
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_index = (5 * day_of_year + 2) / 153;
    let day = (day_of_year - (153 * month_index + 2) / 5 + 1) as u32;
    let month = if month_index < 10 {
        month_index + 3
    } else {
        month_index - 9
    } as u32;
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn civil_dates() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(19_723), (2024, 1, 1));
        assert_eq!(civil_from_days(19_783), (2024, 3, 1));
    }

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
