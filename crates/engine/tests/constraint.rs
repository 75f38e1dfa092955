//! Constrained decoding on SmolLM2-135M-Instruct: every output under a JSON schema parses
//! and validates against it (checked by the `jsonschema` crate), GBNF grammars hold, a
//! grammar that leaves no token ends the generation with an error, and the mean cost of one
//! token mask is reported.

mod common;

use std::sync::Arc;
use std::time::Duration;

use runit_engine::constraint::{Constraint, ConstraintError, Grammar, GrammarCompiler};
use runit_engine::Session;
use runit_engine::{generate, EngineConfig, EngineError, GenerateParams, Sampler, SamplerParams};
use runit_tokenizer::{ChatMessage, ChatTemplate, Tokenizer};
use serde_json::{json, Value};

const MODEL: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

struct Setup {
    model: Arc<runit_model::Model>,
    tokenizer: Arc<Tokenizer>,
    compiler: GrammarCompiler,
}

fn setup() -> Option<Setup> {
    let Some(path) = common::find_model(MODEL) else {
        eprintln!("skipping: {MODEL} not found");
        return None;
    };
    let model = common::load(&path, 2);
    let file = runit_gguf::GgufFile::open(&path).expect("model opens");
    let tokenizer = Arc::new(Tokenizer::from_gguf(&file).expect("tokenizer"));
    let compiler =
        GrammarCompiler::new(Arc::clone(&tokenizer), &tokenizer.eog_ids()).expect("compiler");
    Some(Setup {
        model,
        tokenizer,
        compiler,
    })
}

impl Setup {
    /// Greedy text for the chat `question` under `constraint`, and the mean mask time.
    fn answer(
        &self,
        question: &str,
        constraint: Constraint,
        bias: Vec<(u32, f32)>,
    ) -> Result<(String, Duration), EngineError> {
        let template = ChatTemplate::from_tokenizer(&self.tokenizer).expect("template");
        let text = template
            .render(&[ChatMessage::user(question)], true)
            .expect("render");
        let prompt = self.tokenizer.encode(&text, true, true);
        let config = EngineConfig {
            context_size: 1024,
            batch_size: 256,
            ..EngineConfig::default()
        };
        let mut session = Session::new(Arc::clone(&self.model), &config).expect("session");
        let mut sampler = Sampler::new(SamplerParams {
            constraint: Some(constraint),
            logit_bias: bias,
            ..SamplerParams::greedy()
        })
        .expect("sampler");
        let params = GenerateParams {
            max_tokens: 400,
            end_of_generation: self.tokenizer.eog_ids(),
            top_logprobs: 0,
        };
        let out = generate(&mut session, &mut sampler, &prompt, &params, |_| true)?;
        let bytes = self
            .tokenizer
            .decode_with(
                &out.tokens,
                runit_tokenizer::DecodeOptions {
                    skip_special: true,
                    strip_leading_space: false,
                },
            )
            .expect("decode");
        let mask = sampler
            .constraint()
            .expect("the sampler keeps its grammar")
            .mean_mask_time();
        Ok((String::from_utf8(bytes).expect("utf-8"), mask))
    }
}

/// Twenty-four schemas: nested objects, arrays, enums, bounded numbers, optional fields,
/// `anyOf`, `$ref`, `const`, patterns.
fn schemas() -> Vec<(&'static str, Value)> {
    let name = json!({"type": "string", "maxLength": 20});
    vec![
        (
            "a person",
            json!({"type": "object", "properties": {"name": name, "age": {"type": "integer", "minimum": 0, "maximum": 120}}, "required": ["name", "age"], "additionalProperties": false}),
        ),
        (
            "a colour",
            json!({"type": "string", "enum": ["red", "green", "blue"]}),
        ),
        (
            "a score",
            json!({"type": "number", "minimum": 0, "maximum": 10}),
        ),
        ("a yes/no answer", json!({"type": "boolean"})),
        (
            "three integers",
            json!({"type": "array", "items": {"type": "integer", "minimum": -5, "maximum": 5}, "minItems": 3, "maxItems": 3}),
        ),
        (
            "a list of fruits",
            json!({"type": "array", "items": {"type": "string", "enum": ["apple", "pear", "plum"]}, "minItems": 1, "maxItems": 4}),
        ),
        (
            "a book",
            json!({"type": "object", "properties": {"title": name, "author": {"type": "object", "properties": {"first": name, "last": name}, "required": ["first", "last"], "additionalProperties": false}, "year": {"type": "integer", "minimum": 1450, "maximum": 2030}}, "required": ["title", "author", "year"], "additionalProperties": false}),
        ),
        (
            "a point",
            json!({"type": "object", "properties": {"x": {"type": "number"}, "y": {"type": "number"}}, "required": ["x", "y"], "additionalProperties": false}),
        ),
        (
            "an optional nickname",
            json!({"type": "object", "properties": {"name": name, "nickname": name}, "required": ["name"], "additionalProperties": false}),
        ),
        (
            "an id that is a number or a string",
            json!({"type": "object", "properties": {"id": {"anyOf": [{"type": "integer"}, {"type": "string", "maxLength": 8}]}}, "required": ["id"], "additionalProperties": false}),
        ),
        (
            "a shape",
            json!({"anyOf": [{"type": "object", "properties": {"kind": {"const": "circle"}, "radius": {"type": "number", "minimum": 0}}, "required": ["kind", "radius"], "additionalProperties": false}, {"type": "object", "properties": {"kind": {"const": "square"}, "side": {"type": "number", "minimum": 0}}, "required": ["kind", "side"], "additionalProperties": false}]}),
        ),
        (
            "a matrix of two rows",
            json!({"type": "array", "items": {"type": "array", "items": {"type": "integer"}, "minItems": 2, "maxItems": 2}, "minItems": 2, "maxItems": 2}),
        ),
        (
            "a nullable note",
            json!({"type": "object", "properties": {"note": {"type": ["string", "null"], "maxLength": 10}}, "required": ["note"], "additionalProperties": false}),
        ),
        (
            "a date",
            json!({"type": "string", "pattern": "^[0-9]{4}-[0-9]{2}-[0-9]{2}$"}),
        ),
        (
            "an order",
            json!({"type": "object", "properties": {"items": {"type": "array", "items": {"type": "object", "properties": {"sku": {"type": "string", "maxLength": 6}, "quantity": {"type": "integer", "minimum": 1, "maximum": 9}}, "required": ["sku", "quantity"], "additionalProperties": false}, "minItems": 1, "maxItems": 2}, "paid": {"type": "boolean"}}, "required": ["items", "paid"], "additionalProperties": false}),
        ),
        (
            "a temperature reading",
            json!({"type": "object", "properties": {"celsius": {"type": "number", "exclusiveMinimum": -274, "maximum": 100}, "unit": {"enum": ["C"]}}, "required": ["celsius", "unit"], "additionalProperties": false}),
        ),
        (
            "a tree of two levels",
            json!({"$defs": {"leaf": {"type": "object", "properties": {"value": {"type": "integer"}}, "required": ["value"], "additionalProperties": false}, "node": {"type": "object", "properties": {"value": {"type": "integer"}, "children": {"type": "array", "items": {"$ref": "#/$defs/leaf"}, "maxItems": 2}}, "required": ["value", "children"], "additionalProperties": false}}, "$ref": "#/$defs/node"}),
        ),
        (
            "a city",
            json!({"type": "object", "properties": {"city": name, "country": {"type": "string", "enum": ["France", "Japan", "Peru"]}, "population": {"type": "integer", "minimum": 0}}, "required": ["city", "country"], "additionalProperties": false}),
        ),
        (
            "an empty object",
            json!({"type": "object", "properties": {}, "additionalProperties": false}),
        ),
        (
            "a rating",
            json!({"type": "integer", "minimum": 1, "maximum": 5}),
        ),
        (
            "tags",
            json!({"type": "object", "properties": {"tags": {"type": "array", "items": {"type": "string", "maxLength": 8}, "maxItems": 3}}, "required": ["tags"], "additionalProperties": false}),
        ),
        (
            "a weather report",
            json!({"type": "object", "properties": {"sky": {"enum": ["sunny", "cloudy", "rain"]}, "wind": {"type": "object", "properties": {"speed": {"type": "number", "minimum": 0, "maximum": 200}, "direction": {"enum": ["N", "E", "S", "W"]}}, "required": ["speed", "direction"], "additionalProperties": false}}, "required": ["sky", "wind"], "additionalProperties": false}),
        ),
        (
            "a step count",
            json!({"type": "object", "properties": {"steps": {"type": "integer", "minimum": 0, "maximum": 100000}, "goal_met": {"type": "boolean"}}, "required": ["steps", "goal_met"], "additionalProperties": false}),
        ),
        (
            "a pair of a word and a number",
            json!({"type": "array", "prefixItems": [{"type": "string", "maxLength": 10}, {"type": "integer"}], "items": false, "minItems": 2}),
        ),
    ]
}

#[test]
fn every_output_validates_against_its_schema() {
    let Some(setup) = setup() else { return };
    let schemas = schemas();
    assert!(schemas.len() >= 20);
    let mut mask_times = Vec::new();
    for (subject, schema) in schemas {
        let validator = jsonschema::validator_for(&schema).expect("the schema is valid");
        let constraint = setup
            .compiler
            .compile(&Grammar::JsonSchema(schema.clone()))
            .unwrap_or_else(|error| panic!("{subject}: {error}"));
        let (text, mask) = setup
            .answer(
                &format!("Answer in JSON: {subject}."),
                constraint,
                Vec::new(),
            )
            .unwrap_or_else(|error| panic!("{subject}: {error}"));
        let value: Value = serde_json::from_str(&text)
            .unwrap_or_else(|error| panic!("{subject}: {text:?} is not JSON: {error}"));
        assert!(
            validator.is_valid(&value),
            "{subject}: {text} does not match {schema}"
        );
        mask_times.push(mask);
    }
    let mean = mask_times.iter().sum::<Duration>() / mask_times.len() as u32;
    let slowest = mask_times.iter().max().expect("times");
    eprintln!(
        "token mask over the {}-token vocabulary: mean {mean:?} per step, slowest schema {slowest:?}",
        setup.tokenizer.n_vocab()
    );
}

#[test]
fn json_object_and_gbnf_outputs_hold() {
    let Some(setup) = setup() else { return };
    let any = setup
        .compiler
        .compile(&Grammar::JsonObject)
        .expect("compiles");
    let (text, _) = setup
        .answer("Describe a cat in JSON.", any, Vec::new())
        .expect("generates");
    let value: Value = serde_json::from_str(&text).expect("JSON");
    assert!(value.is_object(), "{text}");

    let gbnf = "root ::= answer \".\"\nanswer ::= \"yes\" | \"no\" | [0-9]{1,3}";
    let constraint = setup
        .compiler
        .compile(&Grammar::Gbnf(gbnf.into()))
        .expect("compiles");
    let (text, _) = setup
        .answer("Is the sky blue?", constraint, Vec::new())
        .expect("generates");
    let body = text.strip_suffix('.').expect("ends in a period");
    assert!(
        body == "yes"
            || body == "no"
            || (1..=3).contains(&body.len()) && body.bytes().all(|b| b.is_ascii_digit()),
        "{text:?}"
    );
}

#[test]
fn a_grammar_with_no_token_left_ends_with_an_error() {
    let Some(setup) = setup() else { return };
    // The grammar admits only "a"; banning every token that spells it leaves nothing.
    let constraint = setup
        .compiler
        .compile(&Grammar::Gbnf("root ::= \"a\"".into()))
        .expect("compiles");
    let banned: Vec<(u32, f32)> = (0..setup.tokenizer.n_vocab() as u32)
        .filter(|&id| setup.tokenizer.token_piece(id).ok() == Some(b"a".as_slice()))
        .map(|id| (id, -100.0))
        .collect();
    assert!(!banned.is_empty());
    let error = setup
        .answer("Say a.", constraint, banned)
        .expect_err("no token is left");
    assert!(
        matches!(
            error,
            EngineError::Constraint(ConstraintError::NoTokenAllowed { generated: 0, .. })
        ),
        "{error}"
    );
}

#[test]
fn schemas_that_do_not_compile_are_refused() {
    let Some(setup) = setup() else { return };
    for bad in [
        json!({"type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}, "required": ["a"]}),
        json!({"type": "integer", "minimum": 5, "maximum": 1}),
        json!({"type": "strange"}),
        json!({"type": "array", "items": {"type": "integer"}, "uniqueItems": true}),
    ] {
        let error = setup
            .compiler
            .compile(&Grammar::JsonSchema(bad.clone()))
            .expect_err("refused");
        assert!(
            matches!(error, ConstraintError::Compile { .. }),
            "{bad}: {error}"
        );
    }
    let error = setup
        .compiler
        .compile(&Grammar::Gbnf("root ::= missing".into()))
        .expect_err("an undefined rule");
    assert!(matches!(error, ConstraintError::Compile { .. }), "{error}");
}

/// A mask computed ahead (`prepare`, as the scheduler does during the forward pass) equals
/// the one computed on demand at every step, and a token accepted after it makes the next
/// mask the new state's.
#[test]
fn prepared_masks_equal_masks_computed_on_demand() {
    let Some(setup) = setup() else { return };
    let schema = json!({
        "type": "object",
        "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
        "required": ["name", "age"]
    });
    let grammar = Grammar::JsonSchema(schema);
    let mut ahead = setup.compiler.compile(&grammar).expect("compiles");
    let mut on_demand = setup.compiler.compile(&grammar).expect("compiles");
    let vocab = setup.tokenizer.n_vocab();
    let text = "{\"name\": \"Ada\", \"age\": 36}";
    let tokens = setup.tokenizer.encode(text, false, false);
    for (step, &token) in tokens.iter().enumerate() {
        let (mut a, mut b) = (vec![0.0f32; vocab], vec![0.0f32; vocab]);
        ahead.prepare();
        ahead.prepare(); // a second call keeps the first mask
        ahead.mask(&mut a).expect("admits a token");
        on_demand.mask(&mut b).expect("admits a token");
        assert_eq!(a, b, "step {step}");
        assert!(
            a[token as usize].is_finite(),
            "step {step}: token {token} masked"
        );
        // A mask prepared and then overtaken by a token is not used for the next state.
        ahead.prepare();
        ahead.accept(token).expect("follows");
        on_demand.accept(token).expect("follows");
    }
    let (mut a, mut b) = (vec![0.0f32; vocab], vec![0.0f32; vocab]);
    ahead.mask(&mut a).expect("end of generation admitted");
    on_demand.mask(&mut b).expect("end of generation admitted");
    assert_eq!(a, b);
}
