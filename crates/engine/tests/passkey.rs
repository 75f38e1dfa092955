//! Long-context retrieval with compressed KV caches: a pass key hidden in about 1,500
//! tokens of filler, asked for at the end. SmolLM2 retrieves it with the f16 cache; every
//! compressed cache type (q8_0, q4_0, TurboQuant tq4, tq3 and the `--tq` pair) must
//! retrieve whatever f16 retrieves. `scripts/passkey.sh` runs the same check at lengths up
//! to 7,000 tokens through the CLI.

mod common;

use runit_backend::{KvType, KvTypes};
use runit_engine::{generate, EngineConfig, GenerateParams, Sampler, SamplerParams, Session};

const FILLER: &str =
    "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. ";

/// The prompt: `repeats` fillers with the key stated a third of the way in.
fn prompt(key: u32, repeats: usize) -> String {
    let mut text = String::from(
        "There is an important piece of information hidden inside a lot of irrelevant text. \
         Find it and memorize it. I will quiz you about it.\n",
    );
    for i in 0..repeats {
        if i == repeats / 3 {
            text.push_str(&format!(
                "The pass key is {key}. Remember it. {key} is the pass key. "
            ));
        }
        text.push_str(FILLER);
    }
    text.push_str("\nWhat is the pass key? The pass key is");
    text
}

#[test]
fn compressed_caches_retrieve_the_pass_key_f16_retrieves() {
    let name = "SmolLM2-135M-Instruct.Q4_1.gguf";
    let Some(path) = common::find_model(name) else {
        println!("skip: {name} not found");
        return;
    };
    let file = runit_gguf::GgufFile::open(&path).expect("opens");
    let tokenizer = runit_tokenizer::Tokenizer::from_gguf(&file).expect("tokenizer");
    let model = common::load(&path, 2);
    let key = 68237;
    let tokens = tokenizer.encode(&prompt(key, 60), true, false);
    println!("prompt: {} tokens", tokens.len());
    assert!(tokens.len() >= 1500, "{} tokens", tokens.len());
    let answer = |types: KvTypes| {
        let config = EngineConfig {
            context_size: 2048,
            kv_types: types,
            ..Default::default()
        };
        let mut session = Session::new(model.clone(), &config).expect("session");
        let mut sampler = Sampler::new(SamplerParams::greedy()).expect("sampler");
        let params = GenerateParams {
            max_tokens: 6,
            end_of_generation: Vec::new(),
            top_logprobs: 0,
        };
        let output =
            generate(&mut session, &mut sampler, &tokens, &params, |_| true).expect("generates");
        let text = tokenizer.decode(&output.tokens).expect("decodes");
        String::from_utf8_lossy(&text).into_owned()
    };
    let f16 = answer(KvTypes::default());
    println!("f16: {f16:?}");
    if !f16.contains(&key.to_string()) {
        println!("the f16 cache does not retrieve the key: nothing to compare");
        return;
    }
    let both = |t: KvType| KvTypes { keys: t, values: t };
    let cases = [
        ("q8_0", both(KvType::Q8_0)),
        ("q4_0", both(KvType::Q4_0)),
        ("tq4", both(KvType::Tq4)),
        (
            "tq4/tq3",
            KvTypes {
                keys: KvType::Tq4,
                values: KvType::Tq3,
            },
        ),
        ("tq3", both(KvType::Tq3)),
    ];
    let mut lost = Vec::new();
    for (label, types) in cases {
        let text = answer(types);
        println!("{label}: {text:?}");
        if !text.contains(&key.to_string()) {
            lost.push(format!("{label}: {text:?}"));
        }
    }
    assert!(lost.is_empty(), "the key is lost with: {lost:?}");
}
