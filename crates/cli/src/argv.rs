//! llama.cpp's multi-letter short flags (`-ngl 99`, `-hf REPO`, `-sys TEXT`, `-cnv`, `-fa`,
//! `-md FILE`, `-ctk TYPE`, `-ctv TYPE`)
//! rewritten to their long forms before clap parses, which would read `-ngl` as `-n gl`; any
//! other `-word` is refused with the nearest known flag named, instead of being misparsed.

use clap::Command;

/// llama.cpp's short forms and the long flags they stand for.
const SHORT_FORMS: [(&str, &str); 8] = [
    ("-hf", "--hf-repo"),
    ("-md", "--model-draft"),
    ("-ctk", "--kv-type-k"),
    ("-ctv", "--kv-type-v"),
    ("-ngl", "--n-gpu-layers"),
    ("-sys", "--system-prompt"),
    ("-cnv", "--conversation"),
    ("-fa", "--flash-attn"),
];

/// `args` with llama.cpp's short forms spelled out (also as `-ngl=99`); an error message for a
/// `-word` that is none of them and that clap would split into single-letter flags.
pub fn rewrite(args: Vec<String>, command: &Command) -> Result<Vec<String>, String> {
    let subcommand = args
        .get(1)
        .and_then(|name| command.find_subcommand(name.as_str()));
    let mut out = Vec::with_capacity(args.len());
    let mut rest_is_positional = false;
    for arg in args {
        if rest_is_positional {
            out.push(arg);
            continue;
        }
        if arg == "--" {
            rest_is_positional = true;
            out.push(arg);
            continue;
        }
        let (flag, value) = match arg.split_once('=') {
            Some((flag, value)) => (flag, Some(value)),
            None => (arg.as_str(), None),
        };
        if let Some((_, long)) = SHORT_FORMS.iter().find(|(short, _)| *short == flag) {
            out.push(match value {
                Some(value) => format!("{long}={value}"),
                None => long.to_string(),
            });
            continue;
        }
        let word = flag.strip_prefix('-').unwrap_or("");
        let is_word_flag = !flag.starts_with("--")
            && word.len() >= 2
            && word.chars().all(|c| c.is_ascii_alphabetic() || c == '-');
        if let (true, Some(subcommand)) = (is_word_flag, subcommand) {
            return Err(unknown_flag(flag, subcommand));
        }
        out.push(arg);
    }
    Ok(out)
}

/// "unknown flag `-temp`; did you mean `--temp`?" with the closest of the command's flags.
fn unknown_flag(flag: &str, command: &Command) -> String {
    let word = flag.trim_start_matches('-');
    let mut known: Vec<String> = command
        .get_arguments()
        .flat_map(|arg| {
            let mut names: Vec<String> = arg
                .get_long()
                .map(|l| format!("--{l}"))
                .into_iter()
                .collect();
            names.extend(
                arg.get_all_aliases()
                    .into_iter()
                    .flatten()
                    .map(|alias| format!("--{alias}")),
            );
            names
        })
        .collect();
    known.extend(
        SHORT_FORMS
            .iter()
            .filter(|(_, long)| {
                command
                    .get_arguments()
                    .any(|arg| arg.get_long() == long.strip_prefix("--"))
            })
            .map(|(short, _)| short.to_string()),
    );
    let nearest = known
        .iter()
        .map(|name| {
            (
                strsim::damerau_levenshtein(word, name.trim_start_matches('-')),
                name,
            )
        })
        .min();
    match nearest {
        Some((distance, name)) if distance <= word.len().max(3) / 2 + 1 => format!(
            "unknown flag `{flag}` for `runit {}`; did you mean `{name}`? (`runit {} --help` lists every flag)",
            command.get_name(),
            command.get_name()
        ),
        _ => format!(
            "unknown flag `{flag}` for `runit {}` (`runit {} --help` lists every flag)",
            command.get_name(),
            command.get_name()
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{Arg, ArgAction};

    fn command() -> Command {
        Command::new("runit").subcommand(
            Command::new("generate")
                .arg(Arg::new("temp").long("temp").short('t'))
                .arg(Arg::new("ngl").long("n-gpu-layers"))
                .arg(Arg::new("hf").long("hf-repo"))
                .arg(Arg::new("n").short('n').action(ArgAction::Set)),
        )
    }

    fn strings(args: &[&str]) -> Vec<String> {
        args.iter().map(|arg| arg.to_string()).collect()
    }

    #[test]
    fn llama_cpp_short_forms_become_long_flags() {
        let args = rewrite(
            strings(&[
                "runit",
                "generate",
                "-ngl",
                "99",
                "-hf=a/b:Q8_0",
                "-n",
                "-1",
                "-t4",
            ]),
            &command(),
        )
        .expect("rewritten");
        assert_eq!(
            args,
            strings(&[
                "runit",
                "generate",
                "--n-gpu-layers",
                "99",
                "--hf-repo=a/b:Q8_0",
                "-n",
                "-1",
                "-t4"
            ])
        );
    }

    #[test]
    fn an_unknown_word_flag_names_the_nearest_one() {
        let error = rewrite(strings(&["runit", "generate", "-tmep", "1"]), &command()).unwrap_err();
        assert!(
            error.contains("`-tmep`") && error.contains("`--temp`"),
            "{error}"
        );
        let error = rewrite(strings(&["runit", "generate", "-ngll", "1"]), &command()).unwrap_err();
        assert!(error.contains("`-ngl`"), "{error}");
        // After `--` everything is positional.
        assert!(rewrite(strings(&["runit", "generate", "--", "-xyz"]), &command()).is_ok());
    }
}
