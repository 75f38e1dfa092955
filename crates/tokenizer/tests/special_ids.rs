//! Special-token ids are checked against the vocabulary before they are trusted: an id that
//! generation starts or stops on, outside the vocabulary, is an error naming its key.

use runit_tokenizer::{ModelKind, Tokenizer, TokenizerError, VocabularySpec};

fn spec() -> VocabularySpec {
    let tokens = ["<unk>", "<s>", "</s>", "a", "b"];
    let mut spec = VocabularySpec::new(ModelKind::SentencePiece, tokens.map(String::from).to_vec());
    spec.scores = vec![0.0; tokens.len()];
    spec.token_types = vec![2, 3, 3, 1, 1];
    spec
}

#[test]
fn in_range_ids_build() {
    let mut spec = spec();
    spec.eos = Some(2);
    spec.eot = Some(2);
    Tokenizer::from_spec(&spec).expect("a valid vocabulary");
}

#[test]
fn an_out_of_range_generation_id_is_refused_by_name() {
    type Field = fn(&mut VocabularySpec) -> &mut Option<u32>;
    let cases: [(&str, Field); 4] = [
        ("tokenizer.ggml.bos_token_id", |s| &mut s.bos),
        ("tokenizer.ggml.eos_token_id", |s| &mut s.eos),
        ("tokenizer.ggml.eot_token_id", |s| &mut s.eot),
        ("tokenizer.ggml.eom_token_id", |s| &mut s.eom),
    ];
    for (key, field) in cases {
        let mut spec = spec();
        *field(&mut spec) = Some(5);
        let error = match Tokenizer::from_spec(&spec) {
            Err(error) => error,
            Ok(_) => panic!("{key} = 5 of 5 tokens was accepted"),
        };
        let message = error.to_string();
        assert!(
            matches!(error, TokenizerError::InvalidMetadata { .. }),
            "{key}: {message}"
        );
        assert!(message.contains(key) && message.contains('5'), "{message}");
    }
}
