//! Timing of the several-weight-rows tile kernel alone (the decode-batch hot spot), on
//! tables that stay in cache: ns and cycles per weight block for a batch of activation rows,
//! the best of nine trials.
//! For kernel experiments; the end-to-end figure is `runit-engine`'s `batch_decode`.
//!
//! `cargo run --release -p runit-quant --example tile_rows_time -- [TYPE] [N] [ROWS] [TOKENS] [GHZ] [avx2]`
//! (defaults: Q4_1, 576 inputs, 1536 weight rows, 8 tokens, cycles at 3.75 GHz, the best
//! SIMD level of this CPU; `avx2` forces the AVX2 kernels).

use std::time::Instant;

use runit_quant::dot::{
    activation_format, activation_row_bytes, block_offsets, block_quants, block_quants_len,
    block_scales, block_scales_len, quantize_activation, tile_rows_fn, ActivationFormat,
    BlockScales, QuantLayout, SimdLevel, TileOut,
};
use runit_quant::{quantize, GgmlType};

fn values(count: usize, state: &mut u64) -> Vec<f32> {
    (0..count)
        .map(|_| {
            *state ^= *state << 13;
            *state ^= *state >> 7;
            *state ^= *state << 17;
            ((*state >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 2.0
        })
        .collect()
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let arg = |i: usize, default: &str| args.get(i).cloned().unwrap_or(default.into());
    let ty = GgmlType::from_name(&arg(0, "Q4_1")).expect("a ggml type name");
    let n: usize = arg(1, "576").parse().expect("N");
    let rows: usize = arg(2, "1536").parse().expect("ROWS");
    let tokens: usize = arg(3, "8").parse().expect("TOKENS");
    let ghz: f64 = arg(4, "3.75").parse().expect("GHZ");
    let mut state = 0x5eed;
    let mut weights = vec![0u8; ty.row_bytes(n as u64).expect("whole blocks") as usize * rows];
    quantize(ty, &values(n * rows, &mut state), &mut weights).expect("quantizable type");
    let format = activation_format(ty).expect("a type with a dot product");
    let row_bytes = activation_row_bytes(format, n);
    let x = values(n * tokens, &mut state);
    let mut activations = vec![0u8; row_bytes * tokens];
    for (row, out) in x.chunks(n).zip(activations.chunks_mut(row_bytes)) {
        quantize_activation(format, row, out);
    }
    let len = block_scales_len(n, tokens);
    let (mut d, mut s) = (vec![0.0f32; len], vec![0.0f32; len]);
    let level = if arg(5, "") == "avx2" {
        SimdLevel::Avx2
    } else {
        SimdLevel::detect()
    };
    let layout = QuantLayout::for_level(level);
    let mut table = vec![0u8; block_quants_len(n, tokens) + 64];
    let skip = table.as_ptr().align_offset(64);
    let quants = &mut table[skip..skip + block_quants_len(n, tokens)];
    let filled = block_scales(format, &activations, tokens, n, &mut d, &mut s)
        && block_quants(format, &activations, tokens, n, quants, layout);
    assert!(filled, "{ty} has no tile tables");
    let mut offsets = vec![0.0f32; d.len()];
    let offsets: &[f32] = if block_offsets(&d, &mut offsets) {
        &offsets
    } else {
        &[]
    };
    let scales = BlockScales {
        offsets,
        d: &d,
        s: if format == ActivationFormat::Q8_1 {
            &s
        } else {
            &[]
        },
        quants,
        stride: tokens,
        layout,
    };
    let kernel = tile_rows_fn(ty, level).expect("a tile-rows kernel at this level");
    let mut out = vec![0.0f32; rows * tokens];
    // The best of several trials: the machine's other work only ever slows a trial down.
    let reps = (600_000 / rows).max(1);
    let seconds = (0..9)
        .map(|_| {
            let start = Instant::now();
            for _ in 0..reps {
                kernel(
                    n,
                    &weights,
                    &activations,
                    scales,
                    TileOut::new(&mut out, rows),
                );
            }
            start.elapsed().as_secs_f64() / reps as f64
        })
        .fold(f64::INFINITY, f64::min);
    let blocks = (n / 32 * rows) as f64;
    println!(
        "{ty} {level:?} {layout:?} {n}x{rows}, {tokens} tokens: {:.1} us per call, {:.2} ns \
         ({:.2} cycles at {ghz} GHz) per weight block",
        seconds * 1e6,
        seconds * 1e9 / blocks,
        seconds * ghz * 1e9 / blocks
    );
}
