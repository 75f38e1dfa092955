//! GBNF (llama.cpp's grammar format) rewritten into llguidance's Lark dialect, which has
//! the same building blocks: rules, literals, character classes, groups, alternatives and
//! repetitions (`*`, `+`, `?`, `{m}`, `{m,}`, `{m,n}`). `root` becomes `start`; every other
//! rule name is kept readable and made a lowercase Lark rule name.

/// One lexical element of a GBNF grammar.
#[derive(Debug, Clone, PartialEq)]
enum Piece {
    Name(String),
    Defines,
    /// A literal, decoded.
    Literal(String),
    /// A character class as a Lark regular expression.
    Class(String),
    AnyCharacter,
    /// `(`, `)`, `|`, `*`, `+`, `?`.
    Symbol(char),
    /// `{m}`, `{m,}` or `{m,n}`, as written.
    Repeat(String),
}

/// Rewrites the GBNF `source` into a Lark grammar; the message names what is wrong.
pub fn gbnf_to_lark(source: &str) -> Result<String, String> {
    let pieces = lex(source)?;
    let mut lark = String::new();
    let mut has_root = false;
    let mut index = 0;
    while index < pieces.len() {
        let (Piece::Name(name), Some(Piece::Defines)) = (&pieces[index], pieces.get(index + 1))
        else {
            return Err(format!(
                "expected a rule `name ::= ...`, found {:?}",
                pieces[index]
            ));
        };
        has_root |= name == "root";
        lark.push_str(&rule_name(name));
        lark.push(':');
        index += 2;
        let mut depth = 0usize;
        let mut empty = true;
        while index < pieces.len() {
            // A name followed by `::=` starts the next rule (outside any group).
            if depth == 0 && pieces.get(index + 1) == Some(&Piece::Defines) {
                break;
            }
            let piece = &pieces[index];
            match piece {
                Piece::Repeat(repeat) => lark.push_str(repeat),
                Piece::Symbol(symbol @ ('*' | '+' | '?')) => lark.push(*symbol),
                other => {
                    lark.push(' ');
                    match other {
                        Piece::Name(name) => lark.push_str(&rule_name(name)),
                        Piece::Literal(text) => lark.push_str(&lark_literal(text)),
                        Piece::Class(class) => lark.push_str(class),
                        Piece::AnyCharacter => lark.push_str("/(?s:.)/"),
                        Piece::Symbol(symbol) => {
                            match symbol {
                                '(' => depth += 1,
                                ')' => {
                                    depth = depth
                                        .checked_sub(1)
                                        .ok_or("a `)` closes no group".to_string())?
                                }
                                _ => {}
                            }
                            lark.push(*symbol);
                        }
                        Piece::Defines | Piece::Repeat(_) => {
                            return Err("`::=` inside a rule's body".into())
                        }
                    }
                }
            }
            empty = false;
            index += 1;
        }
        if depth != 0 {
            return Err(format!("a `(` in rule `{name}` is never closed"));
        }
        if empty {
            lark.push_str(" \"\"");
        }
        lark.push('\n');
    }
    if !has_root {
        return Err("the grammar has no `root` rule".into());
    }
    Ok(lark)
}

/// `root` is Lark's `start`; other names become lowercase (`Value` -> `r_-value`).
fn rule_name(name: &str) -> String {
    if name == "root" {
        return "start".into();
    }
    let mut lark = String::from("r_");
    for character in name.chars() {
        if character.is_ascii_uppercase() {
            lark.push('-');
            lark.push(character.to_ascii_lowercase());
        } else {
            lark.push(character);
        }
    }
    lark
}

/// A Lark literal: a JSON string, with DEL escaped too (Lark refuses it raw).
fn lark_literal(text: &str) -> String {
    serde_json::Value::String(text.into())
        .to_string()
        .replace('\u{7f}', "\\u007f")
}

fn lex(source: &str) -> Result<Vec<Piece>, String> {
    let characters: Vec<char> = source.chars().collect();
    let mut pieces = Vec::new();
    let mut at = 0;
    while at < characters.len() {
        let character = characters[at];
        match character {
            '#' => {
                while at < characters.len() && characters[at] != '\n' {
                    at += 1;
                }
            }
            c if c.is_whitespace() => at += 1,
            ':' if characters[at..].starts_with(&[':', ':', '=']) => {
                pieces.push(Piece::Defines);
                at += 3;
            }
            '"' => {
                let (text, next) = literal(&characters, at + 1)?;
                pieces.push(Piece::Literal(text));
                at = next;
            }
            '[' => {
                let (class, next) = class(&characters, at + 1)?;
                pieces.push(Piece::Class(class));
                at = next;
            }
            '.' => {
                pieces.push(Piece::AnyCharacter);
                at += 1;
            }
            '(' | ')' | '|' | '*' | '+' | '?' => {
                pieces.push(Piece::Symbol(character));
                at += 1;
            }
            '{' => {
                let end = characters[at..]
                    .iter()
                    .position(|&c| c == '}')
                    .ok_or("a `{` repetition is never closed")?;
                let repeat: String = characters[at..=at + end]
                    .iter()
                    .filter(|c| !c.is_whitespace())
                    .collect();
                let inner = &repeat[1..repeat.len() - 1];
                if inner.is_empty() || !inner.chars().all(|c| c.is_ascii_digit() || c == ',') {
                    return Err(format!("`{repeat}` is not a repetition"));
                }
                pieces.push(Piece::Repeat(repeat));
                at += end + 1;
            }
            c if c.is_ascii_alphanumeric() || c == '-' => {
                let start = at;
                while at < characters.len()
                    && (characters[at].is_ascii_alphanumeric() || characters[at] == '-')
                {
                    at += 1;
                }
                pieces.push(Piece::Name(characters[start..at].iter().collect()));
            }
            other => return Err(format!("unexpected `{other}` at character {at}")),
        }
    }
    Ok(pieces)
}

/// Decodes one escape after a backslash at `at`; returns the character and the next index.
fn escape(characters: &[char], at: usize) -> Result<(char, usize), String> {
    let hex = |digits: usize| -> Result<(char, usize), String> {
        let text: String = characters
            .get(at + 1..at + 1 + digits)
            .ok_or("a cut escape")?
            .iter()
            .collect();
        let value = u32::from_str_radix(&text, 16).map_err(|_| format!("bad escape `{text}`"))?;
        let character = char::from_u32(value).ok_or(format!("`{text}` is no character"))?;
        Ok((character, at + 1 + digits))
    };
    match characters.get(at) {
        Some('n') => Ok(('\n', at + 1)),
        Some('t') => Ok(('\t', at + 1)),
        Some('r') => Ok(('\r', at + 1)),
        Some('x') => hex(2),
        Some('u') => hex(4),
        Some('U') => hex(8),
        Some(&other) => Ok((other, at + 1)),
        None => Err("the grammar ends in an escape".into()),
    }
}

/// A literal's text from just after its opening quote; returns it and the index after it.
fn literal(characters: &[char], mut at: usize) -> Result<(String, usize), String> {
    let mut text = String::new();
    loop {
        match characters.get(at) {
            None => return Err("a literal is never closed".into()),
            Some('"') => return Ok((text, at + 1)),
            Some('\\') => {
                let (character, next) = escape(characters, at + 1)?;
                text.push(character);
                at = next;
            }
            Some(&character) => {
                text.push(character);
                at += 1;
            }
        }
    }
}

/// A character class from just after its `[`, as a Lark regular expression whose every
/// character is a `\x{..}` escape; returns it and the index after the `]`.
fn class(characters: &[char], mut at: usize) -> Result<(String, usize), String> {
    let mut regex = String::from("/[");
    if characters.get(at) == Some(&'^') {
        regex.push('^');
        at += 1;
    }
    loop {
        let character = match characters.get(at) {
            None => return Err("a character class is never closed".into()),
            Some(']') => {
                regex.push_str("]/");
                return Ok((regex, at + 1));
            }
            Some('-') if regex.ends_with('}') && characters.get(at + 1) != Some(&']') => {
                regex.push('-');
                at += 1;
                continue;
            }
            Some('\\') => {
                let (character, next) = escape(characters, at + 1)?;
                at = next;
                character
            }
            Some(&character) => {
                at += 1;
                character
            }
        };
        regex.push_str(&format!("\\x{{{:x}}}", character as u32));
    }
}

#[cfg(test)]
mod tests {
    use super::gbnf_to_lark;

    #[test]
    fn rewrites_rules_literals_classes_and_repetitions() {
        let gbnf = "root ::= \"yes\" | \"no\" ws Answer{1,3}\n# a comment\nAnswer ::= [a-z0-9-]+ (\",\" .)?\nws ::= [ \\t\\n]*";
        let lark = gbnf_to_lark(gbnf).expect("converts");
        assert_eq!(
            lark,
            "start: \"yes\" | \"no\" r_ws r_-answer{1,3}\n\
             r_-answer: /[\\x{61}-\\x{7a}\\x{30}-\\x{39}\\x{2d}]/+ ( \",\" /(?s:.)/ )?\n\
             r_ws: /[\\x{20}\\x{9}\\x{a}]/*\n"
        );
    }

    #[test]
    fn refuses_what_is_not_gbnf() {
        assert!(gbnf_to_lark("answer ::= \"x\"")
            .unwrap_err()
            .contains("root"));
        assert!(gbnf_to_lark("root ::= (\"x\"")
            .unwrap_err()
            .contains("never closed"));
        assert!(gbnf_to_lark("root ::= \"x")
            .unwrap_err()
            .contains("never closed"));
        assert!(gbnf_to_lark("root = \"x\"")
            .unwrap_err()
            .contains("unexpected"));
    }
}
