//! Encoding speed: 1 MB of mixed English (the GPL-3 text of the golden data) and Rust code
//! (this crate's sources) with the SmolLM2 vocabulary. Reports MB/s through criterion's
//! throughput; skips with a notice when the model file is absent.

use std::path::Path;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use runit_tokenizer::Tokenizer;

const MEGABYTE: usize = 1 << 20;

fn corpus() -> String {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut parts = Vec::new();
    if let Ok(english) =
        std::fs::read_to_string(root.join("../../tests/golden/perplexity/ppl_text_GPL-3.txt"))
    {
        parts.push(english);
    }
    for file in [
        "bpe.rs",
        "pretokenize/splitters.rs",
        "tokenizer.rs",
        "vocab.rs",
        "chat.rs",
    ] {
        if let Ok(code) = std::fs::read_to_string(root.join("src").join(file)) {
            parts.push(code);
        }
    }
    let mut text = String::with_capacity(MEGABYTE + 64 * 1024);
    while text.len() < MEGABYTE {
        for part in &parts {
            text.push_str(part);
        }
    }
    let mut end = MEGABYTE;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text.truncate(end);
    text
}

fn encode(criterion: &mut Criterion) {
    let model =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/SmolLM2-135M-Instruct.Q4_1.gguf");
    if !model.exists() {
        println!(
            "skipping: {} is absent (run scripts/fetch_models.py)",
            model.display()
        );
        return;
    }
    let file = runit_gguf::GgufFile::open(&model).expect("model opens");
    let tokenizer = Tokenizer::from_gguf(&file).expect("tokenizer loads");
    let text = corpus();
    let n_tokens = tokenizer.encode(&text, false, true).len();
    println!("corpus: {} bytes, {n_tokens} tokens", text.len());
    let mut group = criterion.benchmark_group("encode");
    group.sample_size(10);
    group.throughput(Throughput::Bytes(text.len() as u64));
    group.bench_function("smollm2_1MB_mixed", |bencher| {
        bencher.iter(|| tokenizer.encode(&text, false, true))
    });
    group.finish();
}

criterion_group!(benches, encode);
criterion_main!(benches);
