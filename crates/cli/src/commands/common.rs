//! What the model-running subcommands share: model/backend/runtime flags and loading.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use runit_backend::{Backend, KvType, KvTypes};
use runit_engine::EngineConfig;
use runit_gguf::GgufFile;
use runit_model::{Model, WeightPlacement};
use runit_tokenizer::Tokenizer;

/// Flags naming the model and how to run it.
#[derive(clap::Args, Clone, Debug)]
pub struct ModelArgs {
    /// The GGUF model file.
    #[arg(short = 'm', long = "model")]
    pub model: PathBuf,
    /// Use this tokenizer.json (Hugging Face format) instead of the GGUF's vocabulary.
    #[arg(long)]
    pub tokenizer: Option<PathBuf>,
    /// Compute device: `cpu`, or `cuda` / `cuda:N` (GPU N; builds with the `cuda` feature).
    #[arg(long, default_value = "cpu")]
    pub device: String,
    /// On a GPU, compute every op exactly as the CPU backend (and llama.cpp's CPU build)
    /// does, so outputs equal them bit for bit: greedy generations token for token. Much
    /// slower than the default GPU kernels; the CPU is always exact.
    #[arg(long)]
    pub exact: bool,
    /// Worker threads (default: one per core).
    #[arg(short = 't', long)]
    pub threads: Option<usize>,
    /// KV cache size in tokens (capped at the model's training context) [default: 4096;
    /// `serve` on a GPU: the KV pool takes --gpu-memory-fraction of the free memory].
    #[arg(short = 'c', long = "ctx-size")]
    pub ctx_size: Option<usize>,
    /// Most prompt tokens evaluated in one forward pass.
    #[arg(short = 'b', long = "batch-size", default_value_t = EngineConfig::DEFAULT.batch_size)]
    pub batch_size: usize,
    /// KV cache type of keys and values: f16, f32, q8_0, q4_0 (ggml's blocks, as
    /// llama.cpp's `-ctk`/`-ctv`), tq4, tq3 (TurboQuant) [default: f16].
    #[arg(long = "kv-type", value_name = "TYPE")]
    pub kv_type: Option<KvType>,
    /// KV cache type of the keys (overrides --kv-type for them; `-ctk` as in llama.cpp).
    #[arg(long = "kv-type-k", alias = "cache-type-k", value_name = "TYPE")]
    pub kv_type_k: Option<KvType>,
    /// KV cache type of the values (overrides --kv-type for them; `-ctv` as in llama.cpp).
    #[arg(long = "kv-type-v", alias = "cache-type-v", value_name = "TYPE")]
    pub kv_type_v: Option<KvType>,
    /// TurboQuant KV cache: keys tq4, values tq3 (`KvTypes::TURBO`).
    #[arg(long, conflicts_with_all = ["kv_type", "kv_type_k", "kv_type_v"])]
    pub tq: bool,
    /// On the CPU, compute from the file's memory map instead of a copy of the weights in
    /// huge pages (made when the system has transparent huge pages and the file takes at most
    /// half of the available memory). The copy decodes faster; the map uses no extra memory.
    #[arg(long)]
    pub mmap: bool,
}

/// llama.cpp's one-dash KV type flags (`-ctk`, `-ctv`), which clap cannot take as short
/// options: rewritten to `--kv-type-k` and `--kv-type-v` before parsing.
pub fn llama_cpp_flags(args: impl Iterator<Item = std::ffi::OsString>) -> Vec<std::ffi::OsString> {
    args.map(|arg| match arg.to_str() {
        Some("-ctk") => "--kv-type-k".into(),
        Some("-ctv") => "--kv-type-v".into(),
        _ => arg,
    })
    .collect()
}

impl ModelArgs {
    /// `--ctx-size`, or the engine's default.
    pub fn context_size(&self) -> usize {
        self.ctx_size.unwrap_or(EngineConfig::DEFAULT.context_size)
    }

    /// The engine settings these flags ask for (the others at their defaults).
    pub fn engine_config(&self) -> EngineConfig {
        EngineConfig {
            context_size: self.context_size(),
            batch_size: self.batch_size,
            kv_types: self.kv_types(),
            ..EngineConfig::DEFAULT
        }
    }

    /// The KV cache types the flags ask for.
    pub fn kv_types(&self) -> KvTypes {
        if self.tq {
            return KvTypes::TURBO;
        }
        let both = self.kv_type.unwrap_or(EngineConfig::DEFAULT.kv_types.keys);
        KvTypes {
            keys: self.kv_type_k.unwrap_or(both),
            values: self.kv_type_v.unwrap_or(both),
        }
    }

    /// Worker threads to use.
    pub fn thread_count(&self) -> usize {
        self.threads
            .filter(|&n| n > 0)
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
    }
}

/// A loaded model with its tokenizer.
pub struct Loaded {
    pub model: Arc<Model>,
    pub tokenizer: Arc<Tokenizer>,
    pub file: Arc<GgufFile>,
}

/// Opens the file, builds the tokenizer and backend, and loads the weights.
pub fn load(args: &ModelArgs) -> anyhow::Result<Loaded> {
    let file = Arc::new(GgufFile::open(&args.model)?);
    let tokenizer = match &args.tokenizer {
        Some(path) => Tokenizer::from_tokenizer_json(path, &file)?,
        None => Tokenizer::from_gguf(&file)?,
    };
    let backend = make_backend(&args.device, args.thread_count(), args.exact)?;
    let placement = if args.mmap {
        WeightPlacement::Mapped
    } else {
        WeightPlacement::Auto
    };
    let model = Model::load_placed(Arc::clone(&file), backend, placement)
        .with_context(|| format!("loading {}", args.model.display()))?;
    if tokenizer.n_vocab() > model.config.vocab_size {
        anyhow::bail!(
            "the tokenizer has {} tokens but the model's output has {}; they do not belong together",
            tokenizer.n_vocab(),
            model.config.vocab_size
        );
    }
    Ok(Loaded {
        model: Arc::new(model),
        tokenizer: Arc::new(tokenizer),
        file,
    })
}

/// The backend named by `--device` (with `--exact` numerics on a GPU).
pub fn make_backend(device: &str, threads: usize, exact: bool) -> anyhow::Result<Arc<dyn Backend>> {
    if device == "cpu" {
        return Ok(Arc::new(runit_backend_cpu::CpuBackend::new(threads)?));
    }
    let ordinal = match device.strip_prefix("cuda") {
        Some("") => 0,
        Some(rest) => rest
            .strip_prefix(':')
            .and_then(|n| n.parse::<usize>().ok())
            .with_context(|| format!("bad device `{device}`; expected cuda or cuda:N"))?,
        None => anyhow::bail!("unknown device `{device}`; available: cpu, cuda, cuda:N"),
    };
    cuda_backend(ordinal, exact)
}

#[cfg(feature = "cuda")]
fn cuda_backend(ordinal: usize, exact: bool) -> anyhow::Result<Arc<dyn Backend>> {
    let backend = runit_backend_cuda::CudaBackend::new(ordinal)?;
    let backend = if exact {
        backend.with_exact_numerics(true)
    } else {
        backend
    };
    backend.warm_up()?;
    Ok(Arc::new(backend))
}

#[cfg(not(feature = "cuda"))]
fn cuda_backend(_ordinal: usize, _exact: bool) -> anyhow::Result<Arc<dyn Backend>> {
    anyhow::bail!(
        "this runit was built without CUDA support; rebuild with `cargo build --release --features cuda`"
    )
}
