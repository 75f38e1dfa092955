//! The WGSL kernels: their sources (`shaders/*.wgsl`, composed per weight or cache type) and
//! the compute pipelines made from them on first use.

use runit_backend::KvType;
use runit_quant::GgmlType;

/// Helpers every dequantizing kernel starts with (byte access to packed blocks).
const BYTES: &str = include_str!("shaders/bytes.wgsl");
/// `weight_word(i)` over a kernel's one weight binding, `w`: every kernel with `BYTES` but
/// the matrix-vector kernels (their own binding of words or vectors, `matvec_words.wgsl` and
/// `matvec_vecs.wgsl`).
const ONE_WEIGHT: &str = include_str!("shaders/weight_one.wgsl");
/// `value_TYPE(base, i)` of every weight type.
const DEQUANT: &str = include_str!("shaders/dequant.wgsl");

/// A kernel as the pipeline cache knows it: a few words that every dispatch makes without
/// allocating. Its name and WGSL source ([`KernelSource::name`], [`KernelSource::source`])
/// are made only when the cache misses. The constructors below check what a variant takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KernelSource {
    /// One of [`PLAIN`], by name.
    Plain(&'static str),
    /// One of [`WEIGHT_KERNELS`], by name, reading a type of [`WEIGHT_TYPES`] ([`for_weight`]).
    Weight(&'static str, GgmlType),
    /// The matrix-vector kernel of `parts` weights ([`matvec`] for one, [`matvec_parts`]);
    /// `biased`: each part's output plus its bias; `int8`: on int8 activations
    /// (`matvec_int8.wgsl`) with that dot product, else on f32 ones (`matvec_dot.wgsl`);
    /// `staged`: Q6_K's rows staged through workgroup memory (`matvec_staged.wgsl`);
    /// `extra`: a norm prologue or a residual epilogue ([`MatVecExtra`]).
    MatVec {
        ty: GgmlType,
        reduction: Reduction,
        parts: usize,
        biased: bool,
        int8: Option<Dot4>,
        staged: bool,
        extra: MatVecExtra,
    },
    /// The exact matmuls ([`matmul_q0`], [`matmul_qk`], [`matmul_repack`], [`matmul_float`]).
    MatmulQ0(GgmlType),
    MatmulQk(GgmlType),
    MatmulRepack(GgmlType),
    MatmulFloat(GgmlType),
    /// The cache writer ([`kv_write`]) and attention ([`attention`]) of a key and a value type;
    /// attention's last field: whether it rounds its output for the next matmul too.
    KvWrite(KvType, KvType),
    Attention(KvType, KvType, AttentionPath, bool),
    /// RoPE of queries and keys with the cache write ([`rope_kv_write`]) of a key and a
    /// value type.
    RopeKvWrite(KvType, KvType),
    /// A one-off kernel (the backend's probes): its name and the parts of its source.
    Probe(&'static str, &'static [&'static str]),
    /// One of the norm kernels of [`PLAIN`] at its portable 256 invocations a workgroup
    /// ([`NORM_THREADS_PORTABLE`]) whatever the adapter grants: for short rows
    /// (`WgpuBackend::norm_kernel`).
    Narrow(&'static str),
}

impl KernelSource {
    /// The kernel's name (the pipeline's label).
    pub fn name(&self) -> String {
        match *self {
            KernelSource::Plain(name) | KernelSource::Probe(name, _) => name.to_string(),
            KernelSource::Narrow(name) => format!("{name}_narrow"),
            KernelSource::Weight(name, ty) => format!("{name}_{}", suffix(ty)),
            KernelSource::MatVec {
                ty,
                reduction,
                parts,
                biased,
                int8,
                staged,
                extra,
            } => {
                let variant = match reduction {
                    Reduction::Shared => "",
                    Reduction::Subgroup => "_subgroup",
                };
                let count = if parts == 1 {
                    String::new()
                } else {
                    parts.to_string()
                };
                let bias = if biased { "_bias" } else { "" };
                let input = match int8 {
                    None => "",
                    Some(Dot4::Builtin) => "_int8",
                    Some(Dot4::Plain) => "_int8plain",
                };
                let staging = if staged { "_staged" } else { "" };
                let around = match extra {
                    MatVecExtra::None => String::new(),
                    MatVecExtra::Norm { lanes, width } => format!("_norm{lanes}_{width}"),
                    MatVecExtra::Residual => "_residual".to_string(),
                    MatVecExtra::GatedResidual { width } => format!("_gated{width}_residual"),
                    MatVecExtra::Rope { head_dim, neox } => {
                        format!("_rope{head_dim}{}", if neox { "_neox" } else { "" })
                    }
                };
                format!(
                    "matvec{count}_{}{variant}{bias}{input}{staging}{around}",
                    suffix(ty)
                )
            }
            KernelSource::MatmulQ0(ty) => format!("matmul_q0_{}", suffix(ty)),
            KernelSource::MatmulQk(ty) => format!("matmul_qk_{}", suffix(ty)),
            KernelSource::MatmulRepack(ty) => format!("matmul_repack_{}", suffix(ty)),
            KernelSource::MatmulFloat(ty) => format!("matmul_float_{}", suffix(ty)),
            KernelSource::KvWrite(k, v) => format!("kv_write_{}_{}", cache_name(k), cache_name(v)),
            KernelSource::RopeKvWrite(k, v) => {
                format!("rope_kv_write_{}_{}", cache_name(k), cache_name(v))
            }
            KernelSource::Attention(k, v, path, rounds) => {
                let prefix = match path {
                    AttentionPath::Tiled => "attention",
                    AttentionPath::OneChunk => "attention_chunk",
                    AttentionPath::Split => "attention_split",
                    AttentionPath::SplitFinal => "attention_split_final",
                    AttentionPath::Merge => "attention_merge",
                };
                let rounding = if rounds { "_quantize" } else { "" };
                format!("{prefix}_{}_{}{rounding}", cache_name(k), cache_name(v))
            }
        }
    }

    /// The kernel's whole WGSL source.
    pub fn source(&self) -> String {
        match *self {
            KernelSource::Plain(name) | KernelSource::Narrow(name) => plain_body(name).to_string(),
            KernelSource::Probe(_, parts) => parts.join("\n"),
            KernelSource::Weight(name, ty) => weight_source(name, ty),
            KernelSource::MatVec {
                ty,
                reduction,
                parts,
                biased,
                int8,
                staged,
                extra,
            } => {
                let common = matvec_common(ty, reduction, int8, staged, extra);
                match parts {
                    1 => matvec_source(&common, extra),
                    _ => matvec_parts_source(&common, parts, biased),
                }
            }
            KernelSource::MatmulQ0(ty) => matmul_q0_source(ty),
            KernelSource::MatmulQk(ty) => matmul_qk_source(ty),
            KernelSource::MatmulRepack(ty) => matmul_repack_source(ty),
            KernelSource::MatmulFloat(ty) => matmul_float_source(ty),
            KernelSource::KvWrite(k, v) => kv_write_source(k, v, KV_WRITE_ONE),
            KernelSource::RopeKvWrite(k, v) => kv_write_source(k, v, ROPE_KV_WRITE),
            KernelSource::Attention(k, v, path, rounds) => attention_source(k, v, path, rounds),
        }
    }
}

/// The `value_` suffix of a type the constructors accepted.
fn suffix(ty: GgmlType) -> &'static str {
    weight_suffix(ty).expect("kernels are made only for the types WEIGHT_TYPES names")
}

/// The name of a cache type the constructors accepted.
fn cache_name(ty: KvType) -> &'static str {
    cache_code(ty)
        .expect("kernels are made only for the cache types CACHE_TYPES names")
        .1
}

/// The kernels that take no type.
pub const PLAIN: [(&str, &str); 15] = [
    ("add", include_str!("shaders/add.wgsl")),
    ("scale", include_str!("shaders/scale.wgsl")),
    ("add_bias", include_str!("shaders/add_bias.wgsl")),
    ("add_bias3", include_str!("shaders/add_bias3.wgsl")),
    (
        "gated",
        concat!(
            include_str!("shaders/gated.wgsl"),
            include_str!("shaders/gated_one.wgsl"),
            include_str!("shaders/precise.wgsl"),
            include_str!("shaders/expf.wgsl")
        ),
    ),
    (
        "gated_quantize",
        concat!(
            include_str!("shaders/gated.wgsl"),
            include_str!("shaders/quantize_x.wgsl"),
            include_str!("shaders/quantize_coop.wgsl"),
            include_str!("shaders/coop_reduce_shared.wgsl"),
            include_str!("shaders/gated_quantize.wgsl"),
            include_str!("shaders/precise.wgsl"),
            include_str!("shaders/expf.wgsl")
        ),
    ),
    ("gather_rows", include_str!("shaders/gather_rows.wgsl")),
    (
        "scatter_add_rows",
        include_str!("shaders/scatter_add_rows.wgsl"),
    ),
    (
        "rms_norm",
        concat!(
            include_str!("shaders/rms_norm.wgsl"),
            include_str!("shaders/norm_sum_shared.wgsl"),
            include_str!("shaders/rms_norm_one.wgsl"),
            include_str!("shaders/precise.wgsl")
        ),
    ),
    (
        "add_rms_norm",
        concat!(
            include_str!("shaders/rms_norm.wgsl"),
            include_str!("shaders/norm_sum_shared.wgsl"),
            include_str!("shaders/add_rms_norm.wgsl"),
            include_str!("shaders/add_rms_norm_one.wgsl"),
            include_str!("shaders/precise.wgsl")
        ),
    ),
    (
        "add_rms_norm_quantize",
        concat!(
            include_str!("shaders/rms_norm.wgsl"),
            include_str!("shaders/norm_sum_shared.wgsl"),
            include_str!("shaders/add_rms_norm.wgsl"),
            include_str!("shaders/quantize_x.wgsl"),
            include_str!("shaders/quantize_coop.wgsl"),
            include_str!("shaders/coop_reduce_shared.wgsl"),
            include_str!("shaders/add_rms_norm_quantize.wgsl"),
            include_str!("shaders/precise.wgsl")
        ),
    ),
    (
        "rope",
        concat!(
            include_str!("shaders/rope.wgsl"),
            include_str!("shaders/rotate.wgsl"),
            include_str!("shaders/rope_one.wgsl"),
            include_str!("shaders/precise.wgsl")
        ),
    ),
    (
        "rope_pair",
        concat!(
            include_str!("shaders/rope.wgsl"),
            include_str!("shaders/rotate.wgsl"),
            include_str!("shaders/rope_pair.wgsl"),
            include_str!("shaders/precise.wgsl")
        ),
    ),
    ("hadamard", include_str!("shaders/hadamard.wgsl")),
    (
        "quantize_x",
        concat!(
            include_str!("shaders/quantize_x.wgsl"),
            include_str!("shaders/quantize_coop.wgsl"),
            include_str!("shaders/coop_reduce_shared.wgsl"),
            include_str!("shaders/quantize_x_one.wgsl"),
            include_str!("shaders/precise.wgsl")
        ),
    ),
];

/// The matrix-vector kernel's body (`piece_xs`, `piece_dot` and the entry point come per
/// type and variant).
const MATVEC: &str = include_str!("shaders/matvec.wgsl");
/// The matrix-vector kernel's loop over a row's pieces (`partial`): reading the weights where
/// they lie, or (Q6_K under `RUNIT_WGPU_Q6K_ALIGNED=1`) staged through workgroup memory.
const MATVEC_PIECES: &str = include_str!("shaders/matvec_pieces.wgsl");
const MATVEC_STAGED: &str = include_str!("shaders/matvec_staged.wgsl");
/// `PIECE_TYPE`, `xs_TYPE` and `dot_TYPE` of every type in [`MATVEC_TYPES`] on f32
/// activations, and of every type in [`MATVEC_INT8_TYPES`] on int8 ones, with the weight-side
/// helpers both use.
const MATVEC_DOT: &str = include_str!("shaders/matvec_dot.wgsl");
const MATVEC_INT8: &str = include_str!("shaders/matvec_int8.wgsl");
/// matvec_int8.wgsl's x from its binding, or made in workgroup memory by the norm prologue.
const MATVEC_INT8_X: &str = include_str!("shaders/matvec_int8_x.wgsl");
const MATVEC_NORM: &str = concat!(
    include_str!("shaders/matvec_int8_wg.wgsl"),
    include_str!("shaders/matvec_norm.wgsl"),
    include_str!("shaders/quantize_x.wgsl"),
    include_str!("shaders/quantize_coop.wgsl"),
    include_str!("shaders/coop_reduce_shared.wgsl"),
    include_str!("shaders/precise.wgsl")
);
const MATVEC_GATED: &str = concat!(
    include_str!("shaders/matvec_int8_wg.wgsl"),
    include_str!("shaders/matvec_gated.wgsl"),
    include_str!("shaders/gated.wgsl"),
    include_str!("shaders/quantize_x.wgsl"),
    include_str!("shaders/precise.wgsl"),
    include_str!("shaders/expf.wgsl")
);
/// A workgroup's rows and their stores without a RoPE epilogue, and the epilogue.
const MATVEC_ROWS: &str = include_str!("shaders/matvec_rows.wgsl");
const MATVEC_ROPE: &str = concat!(
    include_str!("shaders/matvec_rope.wgsl"),
    include_str!("shaders/rotate.wgsl"),
    include_str!("shaders/precise.wgsl")
);
/// The prologue of a matrix-vector kernel without one.
const NO_PROLOGUE: &str = "fn prologue(wid: vec3<u32>, lid: u32) {}\n";
const MATVEC_BITS: &str = include_str!("shaders/matvec_bits.wgsl");
/// `dot4_i8(a, b)`, the dot product of the four signed bytes of two words, as WGSL's builtin
/// (an instruction where the device has one, e.g. Vulkan's `OpSDot`; naga writes the
/// arithmetic where it has none) or as plain arithmetic.
const DOT4_BUILTIN: &str =
    "fn dot4_i8(a: u32, b: u32) -> i32 {\n    return dot4I8Packed(a, b);\n}\n";
const DOT4_PLAIN: &str = "fn dot4_i8(a: u32, b: u32) -> i32 {\n\
    let shifts = vec4<u32>(24u, 16u, 8u, 0u);\n\
    let x = bitcast<vec4<i32>>(vec4<u32>(a) << shifts) >> vec4<u32>(24u);\n\
    let y = bitcast<vec4<i32>>(vec4<u32>(b) << shifts) >> vec4<u32>(24u);\n\
    return dot(x, y);\n}\n";
/// The matrix-vector kernel's part selection and output for one weight.
const MATVEC_ONE: &str = include_str!("shaders/matvec_one.wgsl");
/// The matrix-vector kernel's weight binding, as words or as 16-byte vectors.
const MATVEC_WORDS: &str = include_str!("shaders/matvec_words.wgsl");
const MATVEC_VECS: &str = include_str!("shaders/matvec_vecs.wgsl");
/// The matrix-vector entry points: a shared-memory reduction, or subgroup sums.
const REDUCE_SHARED: &str = include_str!("shaders/reduce_shared.wgsl");
const REDUCE_SUBGROUP: &str = include_str!("shaders/reduce_subgroup.wgsl");

/// The weight types with a word-reading matrix-vector kernel (`dot_TYPE` in
/// `matvec_dot.wgsl`); rows of other types use the generic `matmul` kernel.
pub const MATVEC_TYPES: [GgmlType; 10] = [
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q8_0,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
];

/// The weight types with a matrix-vector kernel on int8 activations (`matvec_int8.wgsl`):
/// those whose CPU dot products take Q8_0/Q8_1 or Q8_K activations, of the types in
/// [`MATVEC_TYPES`] (Q5_1 has no matrix-vector kernel).
pub const MATVEC_INT8_TYPES: [GgmlType; 7] = [
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q8_0,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
];

/// How the int8 matrix-vector kernels take the dot product of four bytes (`dot4_i8`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Dot4 {
    /// WGSL's `dot4I8Packed` (naga's own arithmetic where the device lacks the instruction).
    Builtin,
    /// Shifts and a dot product of four integers (for comparisons and tests).
    Plain,
}

/// How the matrix-vector kernel sums a row's lanes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Reduction {
    /// A shared-memory tree (every adapter).
    Shared,
    /// `subgroupAdd`, then shared memory across the workgroup's subgroups (adapters with
    /// subgroups of at most 32 invocations).
    Subgroup,
}

/// The matrix-vector kernel for `ty` (one of [`MATVEC_TYPES`]) with `reduction`; with
/// `int8`, on int8 activations (`ty` one of [`MATVEC_INT8_TYPES`]); with `staged`, a Q6_K
/// weight's rows staged through workgroup memory (other types read theirs in place).
pub fn matvec(
    ty: GgmlType,
    reduction: Reduction,
    int8: Option<Dot4>,
    staged: bool,
) -> Option<KernelSource> {
    matvec_reads(ty, int8).then_some(KernelSource::MatVec {
        ty,
        reduction,
        parts: 1,
        biased: false,
        int8,
        staged: staged && ty == STAGED_TYPE,
        extra: MatVecExtra::None,
    })
}

/// What a matrix-vector kernel does besides its products.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MatVecExtra {
    None,
    /// The norm prologue (`matvec_norm.wgsl`, int8 activations, one token): x at binding 2
    /// is the residual stream's row of `width` values, normalized in each workgroup as a
    /// norm workgroup of `lanes` invocations sums it; the norm's weight and output are bound
    /// after the parts' bindings (and the biases).
    Norm {
        lanes: u32,
        width: u32,
    },
    /// The residual add in the epilogue (one part): each output also added to the buffer at
    /// binding 4, as `add.wgsl` adds it.
    Residual,
    /// The residual epilogue, and the gated activation in the prologue (`matvec_gated.wgsl`,
    /// int8 activations in blocks of 32, one token): x at binding 2 is the gate's `width`
    /// values, up and ggml's GELU table at bindings 5 and 6.
    GatedResidual {
        width: u32,
    },
    /// RoPE and the cache write in the epilogue (`matvec_rope.wgsl`, three parts, one
    /// token): heads of `head_dim` values, NEOX pairs or normal ones; the angles and the two
    /// caches bound after the parts (and the biases).
    Rope {
        head_dim: u32,
        neox: bool,
    },
}

impl KernelSource {
    /// This matrix-vector kernel with `extra` (`None` for other kernels, or where the
    /// kernel cannot take it: a norm prologue needs int8 activations, two or three parts
    /// and no staging; a residual epilogue one part without biases).
    pub fn with_extra(self, extra: MatVecExtra) -> Option<KernelSource> {
        let mut kernel = self;
        let KernelSource::MatVec {
            parts,
            biased,
            int8,
            staged,
            extra: slot,
            ..
        } = &mut kernel
        else {
            return None;
        };
        let (parts, biased, int8, staged) = (*parts, *biased, *int8, *staged);
        *slot = extra;
        let fits = match extra {
            MatVecExtra::None => true,
            MatVecExtra::Norm { lanes, width } => {
                int8.is_some()
                    && parts >= 2
                    && !staged
                    && lanes.is_power_of_two()
                    && lanes >= MATVEC_THREADS
                    && width % 32 == 0
            }
            MatVecExtra::Residual => parts == 1 && !biased,
            MatVecExtra::GatedResidual { width } => {
                parts == 1 && !biased && int8.is_some() && !staged && width % 32 == 0
            }
            MatVecExtra::Rope { head_dim, .. } => parts == 3 && !staged && head_dim % 4 == 0,
        };
        fits.then_some(kernel)
    }
}

/// Words of a row of `width` values rounded in the int8 kernels' layout (quantize_x.wgsl's
/// modes 7 and 8: 72 words a group of 256 values), which a prologue keeps in workgroup memory.
pub fn rounded_words(width: usize) -> usize {
    width.div_ceil(256) * 72
}

/// Invocations of a matrix-vector workgroup (matvec.wgsl's THREADS).
pub const MATVEC_THREADS: u32 = 128;

/// The one type whose matrix-vector kernel may stage its rows (`matvec_staged.wgsl`): its
/// 210-byte blocks start on 2-byte boundaries and a piece's runs lie apart.
pub const STAGED_TYPE: GgmlType = GgmlType::Q6_K;

/// Whether a matrix-vector kernel reads `ty` on the activations `int8` says.
fn matvec_reads(ty: GgmlType, int8: Option<Dot4>) -> bool {
    match int8 {
        None => MATVEC_TYPES.contains(&ty),
        Some(_) => MATVEC_INT8_TYPES.contains(&ty),
    }
}

/// The matrix-vector entry point of `reduction`.
fn reduce_entry(reduction: Reduction) -> &'static str {
    match reduction {
        Reduction::Shared => REDUCE_SHARED,
        Reduction::Subgroup => REDUCE_SUBGROUP,
    }
}

/// The matrix-vector kernel's weight binding for `ty`: 16-byte vectors where every row and
/// piece starts on a 16-byte boundary, else words.
fn matvec_weights(ty: GgmlType) -> &'static str {
    match ty {
        GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 | GgmlType::Q4_K | GgmlType::Q5_K => {
            MATVEC_VECS
        }
        _ => MATVEC_WORDS,
    }
}

/// What the matrix-vector kernel of `ty` takes from `matvec_dot.wgsl`, its loop over a row's
/// pieces and its entry point.
fn matvec_common(
    ty: GgmlType,
    reduction: Reduction,
    int8: Option<Dot4>,
    staged: bool,
    extra: MatVecExtra,
) -> String {
    let suffix = suffix(ty);
    let piece = format!("PIECE_{}", suffix.to_uppercase());
    let (weights, entry) = (matvec_weights(ty), reduce_entry(reduction));
    let pieces = if staged { MATVEC_STAGED } else { MATVEC_PIECES };
    let x = match extra {
        MatVecExtra::Norm { lanes, width } => format!(
            "{}\nconst NORM_LANES: u32 = {lanes}u;\n\
             const ROUNDED_WORDS: u32 = {}u;\n",
            MATVEC_NORM.replace("NORM_BINDING", "2"),
            rounded_words(width as usize)
        ),
        MatVecExtra::GatedResidual { width } => format!(
            "{MATVEC_GATED}\nconst ROUNDED_WORDS: u32 = {}u;\n",
            rounded_words(width as usize)
        ),
        _ => format!("{MATVEC_INT8_X}\n{NO_PROLOGUE}"),
    };
    let dot = match int8 {
        None => format!("{MATVEC_DOT}\n{NO_PROLOGUE}"),
        Some(Dot4::Builtin) => format!("{MATVEC_INT8}\n{DOT4_BUILTIN}\n{x}"),
        Some(Dot4::Plain) => format!("{MATVEC_INT8}\n{DOT4_PLAIN}\n{x}"),
    };
    let rows = match extra {
        MatVecExtra::Rope { head_dim, neox } => format!(
            "{MATVEC_ROPE}\nconst HEAD_DIM: u32 = {head_dim}u;\nconst NEOX: bool = {neox};\n"
        ),
        _ => MATVEC_ROWS.to_string(),
    };
    format!(
        "{MATVEC}\n{pieces}\n{weights}\n{entry}\n{rows}\n{BYTES}\n{MATVEC_BITS}\n{dot}\n\
         const PIECE: u32 = {piece};\nalias Xs = Xs_{suffix};\n\
         fn piece_xs(xi: u32, piece: u32) -> Xs {{ return xs_{suffix}(xi, piece); }}\n\
         fn piece_dot(row: u32, piece: u32, xs: Xs) -> f32 {{ return dot_{suffix}(row, piece, xs); }}\n"
    )
}

/// One weight's kernel: matvec_one.wgsl's output, or with the residual epilogue each
/// output also added to `residual` (binding 4) as add.wgsl adds it.
fn matvec_source(common: &str, extra: MatVecExtra) -> String {
    let write = match extra {
        MatVecExtra::Residual | MatVecExtra::GatedResidual { .. } => {
            "@group(0) @binding(4) var<storage, read_write> residual_sum: array<f32>;\n\
             fn write_out(i: u32, value: f32) {\n    out[i] = value;\n\
             \x20   residual_sum[i] += value;\n}\n"
        }
        _ => "fn write_out(i: u32, value: f32) {\n    out[i] = value;\n}\n",
    };
    format!("{common}\n{MATVEC_ONE}\n{write}")
}

/// Most weights [`matvec_parts`] takes in one dispatch.
pub const MAX_PARTS: usize = 3;

/// The matrix-vector kernel for `ty` (one of [`MATVEC_TYPES`]) with `reduction` over `parts`
/// weights of one input (2 ..= [`MAX_PARTS`]: gate and up, the Q, K and V projections):
/// part k's weight and output at bindings 2k + 2 and 2k + 3 past part 0's (binding 1, and 3
/// after x at 2). Each row is summed as [`matvec`] sums it. `biased`: every part has a bias,
/// all of them one after another in one buffer at binding 2 · parts + 2, added to each
/// output as `add_bias` adds it (Qwen2's Q, K and V: a dispatch a layer fewer).
/// With `int8`, on int8 activations (`ty` one of [`MATVEC_INT8_TYPES`]); `staged` as
/// [`matvec`] takes it.
pub fn matvec_parts(
    ty: GgmlType,
    reduction: Reduction,
    parts: usize,
    biased: bool,
    int8: Option<Dot4>,
    staged: bool,
) -> Option<KernelSource> {
    let applies = (2..=MAX_PARTS).contains(&parts) && matvec_reads(ty, int8);
    applies.then_some(KernelSource::MatVec {
        ty,
        reduction,
        parts,
        biased,
        int8,
        staged: staged && ty == STAGED_TYPE,
        extra: MatVecExtra::None,
    })
}

/// Several weights' kernel (module `matvec_parts`'s); with the norm prologue, its weight and
/// output bound after the parts' bindings and the biases.
fn matvec_parts_source(common: &str, parts: usize, biased: bool) -> String {
    let mut bindings = String::new();
    let (mut elems, mut writes) = (String::new(), String::new());
    for k in 1..parts {
        bindings += &format!(
            "@group(0) @binding({}) var<storage, read> w{k}: array<WeightElem>;\n\
                 @group(0) @binding({}) var<storage, read_write> out{k}: array<f32>;\n",
            2 * k + 2,
            2 * k + 3
        );
        elems += &format!("    if part == {k}u {{ return w{k}[i]; }}\n");
        writes += &format!("    if part == {k}u {{ out{k}[i] = value; return; }}\n");
    }
    // With biases: the part's output element i is row i % out_stride of the part (parts
    // start at output row 0), its bias past the earlier parts' rows.
    let biasing = match biased {
        true => format!(
            "@group(0) @binding({}) var<storage, read> biases: array<f32>;\n\
             fn biased(i: u32, sum: f32) -> f32 {{\n\
             \x20   let q = part_params();\n\
             \x20   var first = 0u;\n\
             \x20   if part >= 1u {{ first += p.rows; }}\n\
             \x20   if part >= 2u {{ first += p.parts[0].x; }}\n\
             \x20   return sum + biases[first + i % q.out_stride];\n}}\n",
            2 * parts + 2
        ),
        false => "fn biased(i: u32, sum: f32) -> f32 {\n    return sum;\n}\n".to_string(),
    };
    let after = 2 * parts + 2 + usize::from(biased);
    let common = common
        .replace("NORM_WEIGHT_BINDING", &after.to_string())
        .replace("NORMED_BINDING", &(after + 1).to_string())
        .replace("ANGLES_BINDING", &after.to_string())
        .replace("K_CACHE_BINDING", &(after + 1).to_string())
        .replace("V_CACHE_BINDING", &(after + 2).to_string());
    format!(
            "{common}\n{bindings}\n{biasing}\n\
             fn part_of(group: u32) -> u32 {{\n    var found = 0u;\n\
             \x20   for (var k = 0u; k < {last}u; k++) {{\n\
             \x20       if group >= p.parts[k].w {{ found = k + 1u; }}\n    }}\n    return found;\n}}\n\
             fn weight_elem(i: u32) -> WeightElem {{\n{elems}    return w[i];\n}}\n\
             fn write_part(i: u32, value: f32) {{\n{writes}    out[i] = value;\n}}\n\
             fn write_out(i: u32, sum: f32) {{\n    write_part(i, biased(i, sum));\n}}\n",
            last = parts - 1
        )
}

/// rms_norm.wgsl's workgroup size as written (every adapter grants it), and as the backend
/// writes it where the adapter grants more (`WgpuBackend::norm_threads`).
pub const NORM_THREADS_PORTABLE: &str = "const THREADS: u32 = 256u;";
/// The norms' workgroup sum and the roundings' block reductions as written (workgroup memory,
/// every adapter) and on subgroups (`WgpuBackend::with_subgroup_reductions`), which the
/// backend puts in their place.
pub const NORM_SUM_SHARED: &str = include_str!("shaders/norm_sum_shared.wgsl");
pub const NORM_SUM_SUBGROUP: &str = include_str!("shaders/norm_sum_subgroup.wgsl");
pub const COOP_REDUCE_SHARED: &str = include_str!("shaders/coop_reduce_shared.wgsl");
pub const COOP_REDUCE_SUBGROUP: &str = include_str!("shaders/coop_reduce_subgroup.wgsl");

/// `source` with its workgroup-memory reductions replaced by their subgroup twins.
pub fn on_subgroups(source: &str) -> String {
    source
        .replace(NORM_SUM_SHARED, NORM_SUM_SUBGROUP)
        .replace(COOP_REDUCE_SHARED, COOP_REDUCE_SUBGROUP)
}
pub fn norm_threads(threads: u32) -> String {
    format!("const THREADS: u32 = {threads}u;")
}

/// The kernels that read packed weights, composed per type.
pub const WEIGHT_KERNELS: [(&str, &str); 3] = [
    ("matmul", include_str!("shaders/matmul.wgsl")),
    ("matmat", include_str!("shaders/matmat.wgsl")),
    ("embedding", include_str!("shaders/embedding.wgsl")),
];

/// The exact matmul of the weights paired with Q8_0 activations (`matmul_q0.wgsl`).
const MATMUL_Q0: &str = include_str!("shaders/matmul_q0.wgsl");
/// Float arithmetic kept from the shader compiler's algebra, an exact fused multiply-add.
pub(crate) const PRECISE: &str = include_str!("shaders/precise.wgsl");
/// precise.wgsl's switch, as written and as the backend sets it where the adapter's `fma`
/// rounds once (`WgpuBackend::fma_is_fused`).
pub const FMA_UNFUSED: &str = "const FMA_FUSED: bool = false;";
pub const FMA_FUSED: &str = "const FMA_FUSED: bool = true;";

/// The weight types [`matmul_q0`] takes, with their order (`ORDER` in the shader: lanes,
/// IQ4_NL's pairs of blocks, lanes and minimums).
pub const MATMUL_Q0_TYPES: [(GgmlType, u32); 6] = [
    (GgmlType::Q8_0, 0),
    (GgmlType::Q5_0, 0),
    (GgmlType::Q4_0, 0),
    (GgmlType::IQ4_NL, 1),
    (GgmlType::Q4_1, 2),
    (GgmlType::Q5_1, 2),
];

/// The exact matmul for `ty` (one of [`MATMUL_Q0_TYPES`]): the CPU's order of operations.
pub fn matmul_q0(ty: GgmlType) -> Option<KernelSource> {
    let known = MATMUL_Q0_TYPES.iter().any(|(t, _)| *t == ty);
    known.then_some(KernelSource::MatmulQ0(ty))
}

fn matmul_q0_source(ty: GgmlType) -> String {
    let (_, order) = MATMUL_Q0_TYPES
        .iter()
        .find(|(t, _)| *t == ty)
        .expect("matmul_q0 checked the type");
    let (suffix, bytes) = (suffix(ty), ty.type_size());
    format!(
        "const BLOCK_BYTES: u32 = {bytes}u;\nconst ORDER: u32 = {order}u;\n{MATMUL_Q0}\n\
         {BYTES}\n{ONE_WEIGHT}\n{PRECISE}\n\
         fn quant(block: u32, j: u32) -> i32 {{ return quant_{suffix}(block, j); }}\n"
    )
}

/// The exact matmul of the K-quants and IQ4_XS against Q8_K activations (`matmul_qk.wgsl`).
const MATMUL_QK: &str = include_str!("shaders/matmul_qk.wgsl");

/// The weight types [`matmul_qk`] takes, with the minimum accumulators of their dot
/// (`MINIMUMS` in the shader: none, four lanes or one).
pub const MATMUL_QK_TYPES: [(GgmlType, u32); 6] = [
    (GgmlType::Q2_K, 0),
    (GgmlType::Q3_K, 0),
    (GgmlType::Q4_K, 4),
    (GgmlType::Q5_K, 1),
    (GgmlType::Q6_K, 0),
    (GgmlType::IQ4_XS, 0),
];

/// The exact matmul for `ty` (one of [`MATMUL_QK_TYPES`]): the CPU's `vec_dot` order on a
/// plain (not repacked) buffer.
pub fn matmul_qk(ty: GgmlType) -> Option<KernelSource> {
    let known = MATMUL_QK_TYPES.iter().any(|(t, _)| *t == ty);
    known.then_some(KernelSource::MatmulQk(ty))
}

fn matmul_qk_source(ty: GgmlType) -> String {
    let (_, minimums) = MATMUL_QK_TYPES
        .iter()
        .find(|(t, _)| *t == ty)
        .expect("matmul_qk checked the type");
    let (suffix, bytes) = (suffix(ty), ty.type_size());
    format!(
        "const BLOCK_BYTES: u32 = {bytes}u;\nconst MINIMUMS: u32 = {minimums}u;\n{MATMUL_QK}\n\
         {BYTES}\n{ONE_WEIGHT}\n{PRECISE}\n\
         fn block_dot(block: u32, xb: u32, dy: f32) {{ block_dot_{suffix}(block, xb, dy); }}\n"
    )
}

/// The exact matmul of weights in ggml's REPACK buffer (`matmul_repack.wgsl`).
const MATMUL_REPACK: &str = include_str!("shaders/matmul_repack.wgsl");

/// The weight types [`matmul_repack`] takes (those ggml-cpu repacks).
pub const MATMUL_REPACK_TYPES: [GgmlType; 4] = [
    GgmlType::Q4_0,
    GgmlType::IQ4_NL,
    GgmlType::Q2_K,
    GgmlType::Q4_K,
];

/// The exact matmul for `ty` (one of [`MATMUL_REPACK_TYPES`]) in ggml's repacked orders.
pub fn matmul_repack(ty: GgmlType) -> Option<KernelSource> {
    MATMUL_REPACK_TYPES
        .contains(&ty)
        .then_some(KernelSource::MatmulRepack(ty))
}

fn matmul_repack_source(ty: GgmlType) -> String {
    let suffix = suffix(ty);
    let (values, bytes) = (ty.block_size(), ty.type_size());
    format!(
        "const BLOCK_VALUES: u32 = {values}u;\nconst BLOCK_BYTES: u32 = {bytes}u;\n\
         {MATMUL_REPACK}\n{BYTES}\n{ONE_WEIGHT}\n{PRECISE}\n\
         fn block_dot(block: u32, xb: u32, dx: f32, gemm: bool) {{ \
         block_dot_{suffix}(block, xb, dx, gemm); }}\n"
    )
}

/// The exact matmul of F32, F16 and BF16 weights (`matmul_float.wgsl`).
const MATMUL_FLOAT: &str = include_str!("shaders/matmul_float.wgsl");

/// The exact matmul for F32, F16 or BF16 weights: the CPU's tinyBLAS or `vec_dot` order.
pub fn matmul_float(ty: GgmlType) -> Option<KernelSource> {
    float_code(ty).map(|_| KernelSource::MatmulFloat(ty))
}

/// `FLOAT_TYPE` of `matmul_float.wgsl`.
fn float_code(ty: GgmlType) -> Option<u32> {
    match ty {
        GgmlType::F32 => Some(0),
        GgmlType::F16 => Some(1),
        GgmlType::BF16 => Some(2),
        _ => None,
    }
}

fn matmul_float_source(ty: GgmlType) -> String {
    let code = float_code(ty).expect("matmul_float checked the type");
    format!("const FLOAT_TYPE: u32 = {code}u;\n{MATMUL_FLOAT}\n{PRECISE}\n")
}

/// How attention reads a cache of each element type.
const ATTENTION_CACHE: &str = include_str!("shaders/attention_cache.wgsl");
/// The cache writer, for every element type, and its entry points: the write alone, and
/// RoPE of queries and keys first.
const KV_WRITE: &str = include_str!("shaders/kv_write.wgsl");
const KV_WRITE_ONE: &str = concat!(
    include_str!("shaders/kv_write_one.wgsl"),
    include_str!("shaders/precise.wgsl")
);
const ROPE_KV_WRITE: &str = concat!(
    include_str!("shaders/rope.wgsl"),
    include_str!("shaders/rotate.wgsl"),
    include_str!("shaders/rope_kv_write.wgsl"),
    include_str!("shaders/precise.wgsl")
);
/// Attention, for every pair of key and value cache types: tiled (spans of 64 rows and more)
/// and ggml's one-chunk path (shorter spans), or for those where matmul is not exact the
/// split path's two passes; the last three share their parameters.
const ATTENTION: &str = include_str!("shaders/attention.wgsl");
const ATTENTION_PARAMS: &str = include_str!("shaders/attention_params.wgsl");
const ATTENTION_CHUNK: &str = include_str!("shaders/attention_chunk.wgsl");
const ATTENTION_SPLIT: &str = include_str!("shaders/attention_split.wgsl");
/// The split path's first pass ends: a record for the merge, or (one chunk) the output.
const ATTENTION_SPLIT_RECORD: &str = include_str!("shaders/attention_split_record.wgsl");
const ATTENTION_SPLIT_FINAL: &str = include_str!("shaders/attention_split_final.wgsl");
const ATTENTION_SPLIT_PLAIN: &str = include_str!("shaders/attention_split_plain.wgsl");
const ATTENTION_SPLIT_QUANTIZE: &str = concat!(
    include_str!("shaders/quantize_x.wgsl"),
    include_str!("shaders/quantize_coop.wgsl"),
    include_str!("shaders/coop_reduce_shared.wgsl"),
    include_str!("shaders/attention_split_quantize.wgsl"),
    include_str!("shaders/precise.wgsl")
);
const ATTENTION_MERGE: &str = include_str!("shaders/attention_merge.wgsl");
/// The one-chunk path's end and the merge's: the output as it is, or rounded for the next
/// matmul.
const ATTENTION_CHUNK_PLAIN: &str = include_str!("shaders/attention_chunk_plain.wgsl");
const ATTENTION_CHUNK_QUANTIZE: &str = concat!(
    include_str!("shaders/quantize_x.wgsl"),
    include_str!("shaders/attention_chunk_quantize.wgsl")
);
const ATTENTION_MERGE_PLAIN: &str = include_str!("shaders/attention_merge_plain.wgsl");
const ATTENTION_MERGE_QUANTIZE: &str = concat!(
    include_str!("shaders/quantize_x.wgsl"),
    include_str!("shaders/quantize_coop.wgsl"),
    include_str!("shaders/coop_reduce_shared.wgsl"),
    include_str!("shaders/attention_merge_quantize.wgsl"),
    include_str!("shaders/precise.wgsl")
);
/// `expf` as glibc computes it (the CPU backend calls libm's), with the exact float
/// helpers it needs.
pub(crate) const EXPF: &str = concat!(
    include_str!("shaders/precise.wgsl"),
    include_str!("shaders/expf.wgsl")
);

/// The KV cache element types the kernels store: their code in the shaders and name.
pub const CACHE_TYPES: [(KvType, u32, &str); 4] = [
    (KvType::F32, 0, "f32"),
    (KvType::F16, 1, "f16"),
    (KvType::Q8_0, 2, "q8_0"),
    (KvType::Q4_0, 3, "q4_0"),
];

/// The shader code of cache type `ty`, or `None` when no kernel stores it.
pub fn cache_code(ty: KvType) -> Option<(u32, &'static str)> {
    CACHE_TYPES
        .iter()
        .find(|(t, _, _)| *t == ty)
        .map(|(_, code, name)| (*code, *name))
}

/// The writer of keys into a `keys` cache and values into a `values` cache (each one of
/// [`CACHE_TYPES`]).
pub fn kv_write(keys: KvType, values: KvType) -> Option<KernelSource> {
    cache_code(keys)?;
    cache_code(values)?;
    Some(KernelSource::KvWrite(keys, values))
}

/// The shader codes of two cache types the constructors accepted.
fn cache_codes(keys: KvType, values: KvType) -> (u32, u32) {
    let code = |ty| {
        cache_code(ty)
            .expect("kernels are made only for CACHE_TYPES")
            .0
    };
    (code(keys), code(values))
}

/// RoPE of queries and keys, then the write of keys into a `keys` cache and values into a
/// `values` cache, in one dispatch (`rope_kv_write.wgsl`).
pub fn rope_kv_write(keys: KvType, values: KvType) -> Option<KernelSource> {
    cache_code(keys)?;
    cache_code(values)?;
    Some(KernelSource::RopeKvWrite(keys, values))
}

fn kv_write_source(keys: KvType, values: KvType, entry: &str) -> String {
    let (k, v) = cache_codes(keys, values);
    format!("const K_TYPE: u32 = {k}u;\nconst V_TYPE: u32 = {v}u;\n{KV_WRITE}\n{entry}")
}

/// Which attention kernel runs a span.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AttentionPath {
    /// `attention.wgsl`: keys in tiles of 64, an online softmax per tile.
    Tiled,
    /// `attention_chunk.wgsl`: ggml's one-chunk path, keys one by one.
    OneChunk,
    /// `attention_split.wgsl`: the keys cut into chunks, a workgroup each (pass 1).
    Split,
    /// `attention_split.wgsl` where a query's keys are one chunk: the output itself (and its
    /// rounding), no merge.
    SplitFinal,
    /// `attention_merge.wgsl`: the chunks of each query and head combined (pass 2).
    Merge,
}

/// Attention over `keys` and `values` caches (each one of [`CACHE_TYPES`]) by `path`; with
/// `rounds`, the one-chunk path or the merge that also rounds its output for the next
/// matmul (`attention_chunk_quantize.wgsl`).
pub fn attention(
    keys: KvType,
    values: KvType,
    path: AttentionPath,
    rounds: bool,
) -> Option<KernelSource> {
    cache_code(keys)?;
    cache_code(values)?;
    if rounds
        && !matches!(
            path,
            AttentionPath::OneChunk | AttentionPath::Merge | AttentionPath::SplitFinal
        )
    {
        return None;
    }
    Some(KernelSource::Attention(keys, values, path, rounds))
}

fn attention_source(keys: KvType, values: KvType, path: AttentionPath, rounds: bool) -> String {
    let (k, v) = cache_codes(keys, values);
    let types = format!("const K_TYPE: u32 = {k}u;\nconst V_TYPE: u32 = {v}u;");
    // The tail of a kernel that may round its output for the next matmul.
    let end = |quantize, plain| if rounds { quantize } else { plain };
    match (path, rounds) {
        (AttentionPath::Tiled, _) => format!("{types}\n{ATTENTION}\n{ATTENTION_CACHE}\n"),
        (AttentionPath::OneChunk, _) => {
            let end = end(ATTENTION_CHUNK_QUANTIZE, ATTENTION_CHUNK_PLAIN);
            format!(
                "{types}\n{ATTENTION_PARAMS}\n{ATTENTION_CHUNK}\n{ATTENTION_CACHE}\n{end}\n{EXPF}"
            )
        }
        (AttentionPath::Split, _) => format!(
            "{types}\n{ATTENTION_PARAMS}\n{ATTENTION_SPLIT}\n{ATTENTION_CACHE}\n{ATTENTION_SPLIT_RECORD}\n"
        ),
        (AttentionPath::SplitFinal, _) => {
            let end = end(ATTENTION_SPLIT_QUANTIZE, ATTENTION_SPLIT_PLAIN);
            format!(
                "{types}\n{ATTENTION_PARAMS}\n{ATTENTION_SPLIT}\n{ATTENTION_CACHE}\n{ATTENTION_SPLIT_FINAL}\n{end}\n"
            )
        }
        (AttentionPath::Merge, _) => {
            let end = match rounds {
                true => ATTENTION_MERGE_QUANTIZE,
                false => ATTENTION_MERGE_PLAIN,
            };
            format!("{ATTENTION_PARAMS}\n{ATTENTION_MERGE}\n{end}")
        }
    }
}

/// The weight types the kernels dequantize, with the name of their `value_` function.
pub const WEIGHT_TYPES: [(GgmlType, &str); 15] = [
    (GgmlType::F32, "f32"),
    (GgmlType::F16, "f16"),
    (GgmlType::BF16, "bf16"),
    (GgmlType::Q4_0, "q4_0"),
    (GgmlType::Q4_1, "q4_1"),
    (GgmlType::Q5_0, "q5_0"),
    (GgmlType::Q5_1, "q5_1"),
    (GgmlType::Q8_0, "q8_0"),
    (GgmlType::Q4_K, "q4_k"),
    (GgmlType::Q5_K, "q5_k"),
    (GgmlType::Q6_K, "q6_k"),
    (GgmlType::Q2_K, "q2_k"),
    (GgmlType::Q3_K, "q3_k"),
    (GgmlType::IQ4_NL, "iq4_nl"),
    (GgmlType::IQ4_XS, "iq4_xs"),
];

/// The `value_` suffix of `ty`, or `None` when no kernel reads it.
pub fn weight_suffix(ty: GgmlType) -> Option<&'static str> {
    WEIGHT_TYPES
        .iter()
        .find(|(t, _)| *t == ty)
        .map(|(_, name)| *name)
}

/// The kernel `name` (one of [`PLAIN`]).
pub fn plain(name: &'static str) -> KernelSource {
    KernelSource::Plain(name)
}

/// The source of the plain kernel `name`.
fn plain_body(name: &str) -> &'static str {
    let (_, body) = PLAIN
        .iter()
        .find(|(n, _)| *n == name)
        .expect("plain kernel names are the table's");
    body
}

/// The weight kernel `name` (one of [`WEIGHT_KERNELS`]) reading `ty` (one of
/// [`WEIGHT_TYPES`]).
pub fn for_weight(name: &str, ty: GgmlType) -> Option<KernelSource> {
    weight_suffix(ty)?;
    let (name, _) = WEIGHT_KERNELS.iter().find(|(n, _)| *n == name)?;
    Some(KernelSource::Weight(name, ty))
}

fn weight_source(name: &str, ty: GgmlType) -> String {
    let (_, body) = WEIGHT_KERNELS
        .iter()
        .find(|(n, _)| *n == name)
        .expect("for_weight checked the name");
    let suffix = suffix(ty);
    let (values, bytes) = (ty.block_size(), ty.type_size());
    format!(
        "const BLOCK_VALUES: u32 = {values}u;\nconst BLOCK_BYTES: u32 = {bytes}u;\n{body}\n\
         {BYTES}\n{ONE_WEIGHT}\n{DEQUANT}\n\
         fn value(base: u32, i: u32) -> f32 {{ return value_{suffix}(base, i); }}\n"
    )
}

/// Every kernel source, for the shader validation test.
pub fn all() -> Vec<KernelSource> {
    let mut all: Vec<KernelSource> = PLAIN.iter().map(|(name, _)| plain(name)).collect();
    for (name, _) in WEIGHT_KERNELS {
        for (ty, _) in WEIGHT_TYPES {
            all.extend(for_weight(name, ty));
        }
    }
    all.extend(MATMUL_Q0_TYPES.iter().filter_map(|(ty, _)| matmul_q0(*ty)));
    all.extend(MATMUL_QK_TYPES.iter().filter_map(|(ty, _)| matmul_qk(*ty)));
    all.extend(
        [GgmlType::F32, GgmlType::F16]
            .into_iter()
            .filter_map(matmul_float),
    );
    for ty in MATVEC_TYPES {
        for reduction in [Reduction::Shared, Reduction::Subgroup] {
            for int8 in [None, Some(Dot4::Builtin), Some(Dot4::Plain)] {
                for staged in [false, true]
                    .into_iter()
                    .filter(|s| !s || ty == STAGED_TYPE)
                {
                    let one = matvec(ty, reduction, int8, staged);
                    all.extend(one);
                    all.extend(one.and_then(|k| k.with_extra(MatVecExtra::Residual)));
                    let gated = MatVecExtra::GatedResidual { width: 4864 };
                    all.extend(one.and_then(|k| k.with_extra(gated)));
                    for parts in 2..=MAX_PARTS {
                        for biased in [false, true] {
                            let kernel = matvec_parts(ty, reduction, parts, biased, int8, staged);
                            all.extend(kernel);
                            if parts == 3 {
                                for (head_dim, neox) in [(64, true), (128, false)] {
                                    let extra = MatVecExtra::Rope { head_dim, neox };
                                    all.extend(kernel.and_then(|k| k.with_extra(extra)));
                                }
                            }
                            // The norm prologue at the two norm widths the backend launches.
                            for (lanes, width) in [(256, 896), (1024, 3584)] {
                                let extra = MatVecExtra::Norm { lanes, width };
                                all.extend(kernel.and_then(|k| k.with_extra(extra)));
                            }
                        }
                    }
                }
            }
        }
    }
    for (keys, _, _) in CACHE_TYPES {
        for (values, _, _) in CACHE_TYPES {
            all.extend(kv_write(keys, values));
            all.extend(rope_kv_write(keys, values));
            for path in [
                AttentionPath::Tiled,
                AttentionPath::OneChunk,
                AttentionPath::Split,
                AttentionPath::SplitFinal,
                AttentionPath::Merge,
            ] {
                for rounds in [false, true] {
                    all.extend(attention(keys, values, path, rounds));
                }
            }
        }
    }
    all
}
