//! What the model-running subcommands share: model/backend/runtime flags and loading.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use runit_backend::{Backend, KvType, KvTypes};
use runit_engine::EngineConfig;
use runit_gguf::GgufFile;
use runit_model::{LoadStep, Model, WeightPlacement};
use runit_tokenizer::{
    builtin_template, ChatTemplate, RenderLimits, Tokenizer, BUILTIN_TEMPLATES, CHATML_TEMPLATE,
};

/// The flags that name a model: `-m` or `-hf`.
#[derive(clap::Args, Clone, Debug)]
pub struct ModelSource {
    /// The GGUF model file, or the name of a cached model (`runit list`).
    #[arg(short = 'm', long = "model", required_unless_present = "hf_repo")]
    pub model: Option<PathBuf>,
    /// OWNER/NAME[:QUANT] on the Hugging Face Hub (`-hf`, as llama.cpp): the cached copy, or
    /// downloaded first as `runit pull` does (QUANT picks the file; Q4_K_M by default).
    #[arg(
        long = "hf-repo",
        value_name = "REPO[:QUANT]",
        conflicts_with = "model"
    )]
    pub hf_repo: Option<String>,
}

impl ModelSource {
    /// The model file: `-m` (a path or a cached model's name) or `-hf` (pulled into the cache
    /// when absent).
    pub fn path(&self) -> anyhow::Result<PathBuf> {
        match (&self.model, &self.hf_repo) {
            (_, Some(reference)) => crate::hub::resolve_hub_model(reference),
            (Some(model), None) => crate::hub::resolve_model(&model.to_string_lossy()),
            (None, None) => {
                anyhow::bail!("name a model with -m FILE|NAME or -hf OWNER/NAME[:QUANT]")
            }
        }
    }
}

/// Flags naming the model and how to run it.
#[derive(clap::Args, Clone, Debug)]
pub struct ModelArgs {
    #[command(flatten)]
    pub source: ModelSource,
    /// Use this tokenizer.json (Hugging Face format) instead of the GGUF's vocabulary.
    #[arg(long)]
    pub tokenizer: Option<PathBuf>,
    /// Compute device: `cpu`, `cuda` / `cuda:N` (GPU N; builds with the `cuda` feature), or
    /// `wgpu` / `wgpu:N` (adapter N through Vulkan, Metal or DX12; the `wgpu` feature).
    #[arg(long, default_value = "cpu")]
    pub device: String,
    /// On a GPU, compute every op exactly as the CPU backend (and llama.cpp's CPU build)
    /// does, so outputs equal them bit for bit: greedy generations token for token. Each
    /// row is then also computed in an order that does not depend on the batch it is in (the
    /// CPU's), so a served request gets the same tokens alone or among many concurrent ones
    /// (`--batch-invariant` is this flag). Much slower than the default GPU kernels, whose
    /// sums follow the batch's row count; the CPU is always exact and batch-invariant.
    #[arg(long, visible_alias = "batch-invariant")]
    pub exact: bool,
    /// Worker threads (default: one per core).
    #[arg(short = 't', long)]
    pub threads: Option<usize>,
    /// KV cache size in tokens [default: 4096; `serve` on a GPU: the KV pool takes
    /// --gpu-memory-fraction of the free memory]. One sequence uses at most the model's
    /// training context; `serve`'s pool, shared by --parallel sequences, holds all the cells.
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
    /// half of the available memory). The copy is the default: a file changed on disk cannot
    /// change it, and prompts ran up to 13% faster on it (decode equal; scripts/mmap_vs_copy.sh),
    /// at the price of reading the whole file at start (0.4 s more to the first token from a
    /// cold cache for SmolLM2's 94 MiB) and holding a second copy in memory. The map starts at
    /// once and shares the page cache; the file must not change while runit runs.
    #[arg(long)]
    pub mmap: bool,
    /// llama.cpp's layer offload count (`-ngl`): any N > 0 runs on the GPU (`--device cuda`),
    /// where RunIT always places the whole model; 0 keeps the CPU.
    #[arg(long = "n-gpu-layers", value_name = "N")]
    pub n_gpu_layers: Option<u32>,
    /// Flash attention (`-fa`, as llama.cpp): accepted for compatibility; RunIT's attention
    /// is always fused, so `on` and `auto` change nothing and `off` is refused.
    #[arg(long = "flash-attn", value_name = "on|off|auto", num_args = 0..=1, default_missing_value = "on")]
    pub flash_attn: Option<String>,
}

impl ModelArgs {
    /// The compute device: `--device`, or a GPU when `-ngl N` asks for one.
    fn device(&self) -> anyhow::Result<String> {
        match self.flash_attn.as_deref() {
            None | Some("on" | "auto") => {}
            Some("off") => anyhow::bail!(
                "--flash-attn off: RunIT's attention is always fused; there is no unfused path to turn on"
            ),
            Some(other) => anyhow::bail!("--flash-attn {other}: expected on, off or auto"),
        }
        match self.n_gpu_layers {
            Some(layers) if layers > 0 && self.device == "cpu" => {
                if !cfg!(feature = "cuda") {
                    anyhow::bail!(
                        "-ngl {layers} asks for a GPU, but this runit was built without CUDA \
                         (rebuild with `--features cuda`, or leave -ngl out to run on the CPU)"
                    );
                }
                eprintln!("note: -ngl {layers}: RunIT places the whole model on the GPU (cuda:0)");
                Ok("cuda".to_string())
            }
            Some(0) if self.device != "cpu" => anyhow::bail!(
                "-ngl 0 keeps the model on the CPU but --device is {}; give one of them",
                self.device
            ),
            _ => Ok(self.device.clone()),
        }
    }

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
    /// The model file (the cache's copy for `-hf` or a cached name).
    pub path: PathBuf,
}

/// Opens the file, builds the tokenizer and backend, and loads the weights.
pub fn load(args: &ModelArgs) -> anyhow::Result<Loaded> {
    load_on(args, None)
}

/// [`load`], onto `backend` when given (a draft model shares the target's CPU threads
/// rather than starting a second team that would compete with them for the cores).
pub fn load_on(args: &ModelArgs, backend: Option<Arc<dyn Backend>>) -> anyhow::Result<Loaded> {
    let device = args.device()?;
    let path = args.source.path()?;
    let file = Arc::new(GgufFile::open(&path)?);
    if let Some(count) = file.get_u32_opt("split.count")?.filter(|&count| count > 1) {
        anyhow::bail!(
            "{} is one of the {count} parts of a split model; RunIT loads single files (merge \
             the parts with llama-gguf-split --merge)",
            path.display()
        );
    }
    let tokenizer = match &args.tokenizer {
        Some(path) => Tokenizer::from_tokenizer_json(path, &file)?,
        None => Tokenizer::from_gguf(&file)?,
    };
    let backend = match backend {
        Some(backend) => backend,
        None => make_backend(&device, args.thread_count(), args.exact)?,
    };
    let placement = if args.mmap {
        WeightPlacement::Mapped
    } else {
        WeightPlacement::Auto
    };
    let started = std::time::Instant::now();
    let bar = indicatif::ProgressBar::new(file.file_size());
    if let Ok(style) = indicatif::ProgressStyle::with_template(
        "{msg} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec}",
    ) {
        bar.set_style(style.progress_chars("=> "));
    }
    let progress = |step: LoadStep| {
        let (message, bytes, total) = match step {
            LoadStep::Copied { bytes, total } => ("copying weights", bytes, total),
            LoadStep::Loaded { bytes, total } => ("loading weights", bytes, total),
        };
        bar.set_message(message);
        bar.set_length(total);
        bar.set_position(bytes);
    };
    let model = Model::load_reporting(Arc::clone(&file), backend, placement, &progress)
        .with_context(|| format!("loading {}", path.display()))?;
    bar.finish_and_clear();
    eprintln!(
        "loaded {} ({}) in {:.2} s",
        path.display(),
        crate::units::human_bytes(file.file_size()),
        started.elapsed().as_secs_f64()
    );
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
        path,
    })
}

/// The backend named by `--device` (with `--exact` numerics on a CUDA GPU).
pub fn make_backend(device: &str, threads: usize, exact: bool) -> anyhow::Result<Arc<dyn Backend>> {
    if device == "cpu" {
        return Ok(Arc::new(runit_backend_cpu::CpuBackend::new(threads)?));
    }
    let ordinal = |prefix: &str| -> anyhow::Result<Option<usize>> {
        match device.strip_prefix(prefix) {
            Some("") => Ok(Some(0)),
            Some(rest) => rest
                .strip_prefix(':')
                .and_then(|n| n.parse::<usize>().ok())
                .map(Some)
                .with_context(|| format!("bad device `{device}`; expected {prefix} or {prefix}:N")),
            None => Ok(None),
        }
    };
    if let Some(ordinal) = ordinal("cuda")? {
        return cuda_backend(ordinal, exact);
    }
    if let Some(ordinal) = ordinal("wgpu")? {
        anyhow::ensure!(
            !exact,
            "--exact (--batch-invariant) is a CUDA mode; the wgpu backend has no exact numerics"
        );
        return wgpu_backend(ordinal);
    }
    anyhow::bail!("unknown device `{device}`; available: cpu, cuda, cuda:N, wgpu, wgpu:N")
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

#[cfg(feature = "wgpu")]
fn wgpu_backend(ordinal: usize) -> anyhow::Result<Arc<dyn Backend>> {
    Ok(Arc::new(runit_backend_wgpu::WgpuBackend::new(ordinal)?))
}

#[cfg(not(feature = "wgpu"))]
fn wgpu_backend(_ordinal: usize) -> anyhow::Result<Arc<dyn Backend>> {
    anyhow::bail!(
        "this runit was built without the wgpu backend; rebuild with `cargo build --release --features wgpu`"
    )
}

/// `-n` values: a token count, or `-1` for "until the context ends" (llama.cpp's convention).
pub fn parse_n_predict(text: &str) -> Result<usize, String> {
    match text.trim() {
        "-1" => Ok(usize::MAX),
        other => other.parse::<usize>().map_err(|_| {
            format!("`{other}` is not a token count; expected a number, or -1 for no limit")
        }),
    }
}

/// The chat template to render with: `choice` (`--chat-template`: a built-in name or a Jinja
/// file), else the model's own; a model without one gets ChatML with a warning.
pub fn chat_template(
    loaded: &Loaded,
    choice: Option<&str>,
    limits: RenderLimits,
) -> anyhow::Result<ChatTemplate> {
    let tokenizer = &loaded.tokenizer;
    let Some(choice) = choice else {
        return match tokenizer.chat_template() {
            Some(source) => ChatTemplate::from_source_limited(source, tokenizer, limits)
                .context("the model's chat template"),
            None => {
                eprintln!(
                    "warning: {} has no chat template; using ChatML (choose one with --chat-template {})",
                    loaded.path.display(),
                    builtin_names()
                );
                Ok(ChatTemplate::from_source_limited(
                    CHATML_TEMPLATE,
                    tokenizer,
                    limits,
                )?)
            }
        };
    };
    if let Some(source) = builtin_template(choice) {
        return Ok(ChatTemplate::from_source_limited(
            source, tokenizer, limits,
        )?);
    }
    let path = std::path::Path::new(choice);
    if !path.is_file() {
        anyhow::bail!(
            "--chat-template {choice}: neither a built-in template ({}) nor a file",
            builtin_names()
        );
    }
    let source =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    ChatTemplate::from_source_limited(&source, tokenizer, limits)
        .with_context(|| format!("the chat template {}", path.display()))
}

/// `chatml|llama3|...`.
fn builtin_names() -> String {
    BUILTIN_TEMPLATES
        .iter()
        .map(|(name, _)| *name)
        .collect::<Vec<_>>()
        .join("|")
}

/// A line naming the cap `RUNIT_CPU_ISA` puts on the CPU kernels, the SIMD level it leaves
/// and the x86 extensions in use; `None` without a cap.
pub fn cpu_isa_cap_note() -> Option<String> {
    let cap = runit_quant::cpu::cap_setting()?;
    let features: Vec<&str> = runit_quant::cpu::usable()
        .into_iter()
        .map(runit_quant::cpu::Feature::name)
        .collect();
    let level = runit_quant::dot::SimdLevel::detect();
    let f16 = match level.half_sums() {
        runit_quant::dot::HalfSums::Lanes8 => "; F16 rows summed in llama.cpp's AVX2 order",
        runit_quant::dot::HalfSums::Reference => "",
    };
    Some(format!(
        "CPU kernels capped by {cap}: SIMD level {level:?}, x86 extensions used: {}{f16}",
        features.join(" ")
    ))
}
