//! Hostile chat templates: a template that loops for ever, builds a huge string or writes a
//! huge output stops with an error naming the limit it ran into, quickly and without taking
//! the process down; the check at load refuses a template that cannot render a plain
//! conversation.

use std::time::{Duration, Instant};

use runit_tokenizer::{
    ChatMessage, ChatTemplate, ModelKind, RenderLimits, TemplateLimit, Tokenizer, TokenizerError,
    VocabularySpec,
};

/// Three nested loops of 100,000 (10^15 iterations).
const NESTED_LOOPS: &str = "{% for a in range(100000) %}{% for b in range(100000) %}{% for c in range(100000) %}x{% endfor %}{% endfor %}{% endfor %}";
/// A string doubled 40 times (a terabyte).
const DOUBLING: &str = "{% set ns = namespace(s='xxxxxxxxxxxxxxxx') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s|length }}";
/// A loop of appends that builds a long string.
const APPENDS: &str = "{% set ns = namespace(s='') %}{% for i in range(100000) %}{% for j in range(100000) %}{% set ns.s = ns.s ~ 'a long piece of text, appended again and again' %}{% endfor %}{% endfor %}{{ ns.s }}";
/// Output written in a loop: gigabytes if nothing stops it.
const OUTPUT_FLOOD: &str = "{% for i in range(100000) %}{% for j in range(100000) %}{{ 'output output output output output output output output' }}{% endfor %}{% endfor %}";

fn conversation() -> Vec<ChatMessage> {
    vec![ChatMessage::system("Be brief."), ChatMessage::user("Hi")]
}

/// Renders `source` and returns the error with the time it took.
fn render_error(source: &str, limits: RenderLimits) -> (TokenizerError, Duration) {
    let mut template = ChatTemplate::new(source, "", "").expect("compiles");
    template.set_limits(limits);
    let start = Instant::now();
    let error = template
        .render(&conversation(), true)
        .expect_err("the template must be stopped");
    (error, start.elapsed())
}

fn assert_limit(error: &TokenizerError, expected: TemplateLimit) {
    match error {
        TokenizerError::TemplateLimit(limit) => assert_eq!(*limit, expected),
        other => panic!("expected {expected}, got {other}"),
    }
}

#[test]
fn nested_loops_run_out_of_fuel() {
    let (error, elapsed) = render_error(NESTED_LOOPS, RenderLimits::DEFAULT);
    assert_limit(&error, TemplateLimit::Fuel(RenderLimits::DEFAULT.fuel));
    assert!(
        error.to_string().contains("fuel limit of 2000000"),
        "{error}"
    );
    assert!(elapsed < Duration::from_secs(20), "took {elapsed:?}");
}

#[test]
fn doubling_a_string_runs_out_of_fuel() {
    let (error, _) = render_error(DOUBLING, RenderLimits::DEFAULT);
    assert_limit(&error, TemplateLimit::Fuel(RenderLimits::DEFAULT.fuel));
}

#[test]
fn appending_in_a_loop_runs_out_of_fuel() {
    let (error, _) = render_error(APPENDS, RenderLimits::DEFAULT);
    assert_limit(&error, TemplateLimit::Fuel(RenderLimits::DEFAULT.fuel));
}

#[test]
fn output_stops_at_its_limit() {
    let limits = RenderLimits {
        fuel: u64::MAX / 128,
        max_output_bytes: 1 << 20,
    };
    let (error, _) = render_error(OUTPUT_FLOOD, limits);
    assert_limit(&error, TemplateLimit::OutputBytes(1 << 20));
    assert!(
        error.to_string().contains("size limit of 1048576 bytes"),
        "{error}"
    );
}

#[test]
fn a_normal_template_renders_within_the_limits() {
    let mut template =
        ChatTemplate::new(runit_tokenizer::CHATML_TEMPLATE, "", "").expect("compiles");
    // A 4 MiB conversation, the server's default body limit, fits the default limits.
    let long = "word ".repeat(800_000);
    let messages = vec![
        ChatMessage::system(long.clone()),
        ChatMessage::user(long.clone()),
    ];
    let rendered = template.render(&messages, true).expect("renders");
    assert!(rendered.len() > 2 * long.len());
    template.set_limits(RenderLimits {
        fuel: 1000,
        ..RenderLimits::DEFAULT
    });
    assert_limit(
        &template
            .render(&messages, true)
            .expect_err("too little fuel"),
        TemplateLimit::Fuel(1000),
    );
}

fn tokenizer_with_template(source: &str) -> Tokenizer {
    let mut spec = VocabularySpec::new(
        ModelKind::SentencePiece,
        ["<unk>", "<s>", "</s>", "▁a"].map(String::from).to_vec(),
    );
    spec.scores = vec![0.0; 4];
    spec.chat_template = Some(source.to_string());
    Tokenizer::from_spec(&spec).expect("vocabulary")
}

#[test]
fn loading_refuses_a_runaway_template() {
    let error = ChatTemplate::from_tokenizer(&tokenizer_with_template(NESTED_LOOPS))
        .expect_err("refused at load");
    assert_limit(&error, TemplateLimit::Fuel(RenderLimits::DEFAULT.fuel));
}

#[test]
fn loading_refuses_a_template_that_always_fails() {
    let source = "{{ raise_exception('this template is broken') }}";
    let error =
        ChatTemplate::from_tokenizer(&tokenizer_with_template(source)).expect_err("refused");
    assert!(
        error.to_string().contains("this template is broken"),
        "{error}"
    );
}

#[test]
fn loading_accepts_a_template_without_system_messages() {
    let source = "{% for m in messages %}{% if m.role == 'system' %}{{ raise_exception('no system role') }}{% endif %}[{{ m.content }}]{% endfor %}";
    let template = ChatTemplate::from_tokenizer(&tokenizer_with_template(source)).expect("loads");
    assert_eq!(
        template
            .render(&[ChatMessage::user("Hi")], true)
            .expect("renders"),
        "[Hi]"
    );
}
