//! The tensor schema against files made by other tools: every model file in `models/` (fetched,
//! or rebuilt by the test script) holds exactly the tensors (names and shapes) its row's schema lists,
//! and the Gemma 3 row describes the real Gemma 3 270M file: its tensors and its per-layer
//! attention windows and RoPE bases.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use runit_backend::RopeStyle;
use runit_gguf::GgufFile;
use runit_model::arch::{
    Activation, AttentionScale, AttentionWindow, EmbeddingScale, NormPlacement, QkNorm,
};
use runit_model::schema::Presence;
use runit_model::ModelConfig;

fn model_files() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let Ok(entries) = std::fs::read_dir(root.join("../../models")) else {
        eprintln!("skipping: models/ is absent");
        return Vec::new();
    };
    let mut files: Vec<PathBuf> = entries
        .flatten()
        .map(|entry| entry.path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "gguf"))
        .collect();
    files.sort();
    files
}

type Table = BTreeMap<String, Vec<usize>>;

/// The file's tensors, by name.
fn file_table(file: &GgufFile) -> Table {
    file.tensors()
        .iter()
        .map(|info| {
            let shape = info.shape.iter().map(|&extent| extent as usize).collect();
            (info.name.clone(), shape)
        })
        .collect()
}

/// The tensors the schema expects in `file`: the required ones, and the optional ones it holds.
fn schema_table(config: &ModelConfig, file: &GgufFile) -> Table {
    config
        .arch
        .tensors(&config.dimensions(), config.block_count)
        .into_iter()
        .filter(|tensor| {
            tensor.spec.is_required(config.arch) || file.tensor(&tensor.name).is_some()
        })
        .map(|tensor| (tensor.name, tensor.shape))
        .collect()
}

#[test]
fn model_files_hold_exactly_their_rows_tensors() {
    let mut checked = 0;
    for path in model_files() {
        let file = GgufFile::open(&path).expect("model opens");
        let Some(arch) = file
            .get_str("general.architecture")
            .ok()
            .and_then(runit_model::arch::find)
        else {
            continue;
        };
        let config = ModelConfig::from_gguf(&file).expect("config");
        assert_eq!(config.arch, arch);
        assert_eq!(
            schema_table(&config, &file),
            file_table(&file),
            "{}",
            path.display()
        );
        checked += 1;
    }
    eprintln!("{checked} files checked");
}

#[test]
fn gemma3_is_a_row() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/gemma-3-270m-q4_k_m.gguf");
    if !path.exists() {
        eprintln!("skipping: {} is absent", path.display());
        return;
    }
    let file = GgufFile::open(&path).expect("model opens");
    // Gemma 3 as llama.cpp computes it (src/models/gemma3.cpp): norms before and after each
    // sublayer, GeGLU, embeddings scaled by sqrt(embd), queries scaled before the attention,
    // five local layers then one global one, local layers on RoPE base 10 000.
    let row = runit_model::arch::find("gemma3").expect("a gemma3 row");
    assert_eq!(row.rope_style, RopeStyle::Neox);
    assert_eq!(row.norm_placement, NormPlacement::PreAndPost);
    assert_eq!(row.activation, Activation::GeluTanh);
    assert_eq!(row.embedding_scale, EmbeddingScale::SqrtEmbd);
    assert_eq!(row.attention_scale, AttentionScale::Queries);
    assert_eq!(row.qk_norm, QkNorm::PerHead);
    assert_eq!(
        row.attention_window,
        AttentionWindow::Pattern { default_period: 6 }
    );
    let config = ModelConfig::from_gguf(&file).expect("config");
    assert_eq!(config.query_scale(), Some(1.0 / 16.0));
    assert_eq!(schema_table(&config, &file), file_table(&file));
    let output = config
        .arch
        .tensor_specs()
        .find(|spec| spec.name == "output.weight")
        .expect("an output head");
    assert_eq!(output.presence, Presence::TiedToEmbedding);
    assert!(file.tensor("output.weight").is_none(), "tied");

    assert_eq!(config.embedding_scale(), Some(640f32.sqrt()));
    assert_eq!((config.rope_theta, config.sliding_window), (1e6, Some(512)));
    let global_layers: Vec<usize> = (0..config.block_count)
        .filter(|&layer| config.layer(layer).sliding_window.is_none())
        .collect();
    assert_eq!(global_layers, [5, 11, 17]);
    for (index, layer) in config.layers().iter().enumerate() {
        let expected_theta = if global_layers.contains(&index) {
            1e6
        } else {
            1e4
        };
        assert_eq!(layer.rope_theta, expected_theta, "layer {index}");
        assert_eq!(layer.rope_freq_scale, 1.0, "layer {index}");
    }
}
