//! The backend parity suite on a wgpu adapter (Mesa's lavapipe in CI), with the CPU scalar
//! twin as the reference.
//!
//! Without an adapter the test prints a notice and passes, unless `RUNIT_REQUIRE_WGPU=1`,
//! where that fails. Every case must run and pass: a weight type without a kernel would show
//! as skipped and fail the test.

use runit_backend::testing::{run_parity, Rng};
use runit_backend_cpu::{CpuBackend, SimdLevel};
use runit_backend_wgpu::WgpuBackend;

fn require_wgpu() -> bool {
    std::env::var("RUNIT_REQUIRE_WGPU").is_ok_and(|v| v == "1")
}

/// Adapter 0, or `None` with a notice that `what` (the test's check) did not run; a failure
/// to open one when `RUNIT_REQUIRE_WGPU=1`.
fn adapter(what: &str) -> Option<WgpuBackend> {
    match WgpuBackend::new(0) {
        Ok(backend) => Some(backend),
        Err(error) => {
            assert!(!require_wgpu(), "RUNIT_REQUIRE_WGPU=1 but: {error}");
            println!("NOTICE: no wgpu adapter, {what}: {error}");
            None
        }
    }
}

/// The suite on adapter 0, with subgroup sums where the adapter grants them or not, and
/// matmul on the exact kernels (the CPU's arithmetic) or the fast ones.
fn parity(subgroups: bool, exact: bool) {
    let Some(backend) = adapter("parity not run") else {
        return;
    };
    let backend = if subgroups {
        backend
    } else {
        backend.without_subgroups()
    };
    let backend = if exact {
        backend.with_exact_matmul()
    } else {
        backend
    };
    let reference = CpuBackend::with_simd(1, SimdLevel::Scalar).expect("scalar backend");
    let report = run_parity(&reference, &backend);
    println!(
        "adapter: {}, matvec subgroup sums: {}",
        backend.adapter(),
        backend.uses_subgroups()
    );
    println!("{report}");
    assert!(report.all_passed(), "failures: {:#?}", report.failures());
    let skipped = report.skipped();
    assert!(skipped.is_empty(), "skipped: {skipped:#?}");
    if exact {
        // Equal to the CPU bit for bit (the reference is its scalar twin).
        let inexact: Vec<_> = report
            .cases
            .iter()
            .filter(|case| case.op == "matmul" && case.nmse != 0.0)
            .collect();
        assert!(inexact.is_empty(), "not exact: {inexact:#?}");
    }
}

#[test]
fn wgpu_matches_the_cpu_reference() {
    parity(true, false);
}

#[test]
fn wgpu_without_subgroups_matches_the_cpu_reference() {
    parity(false, false);
}

/// `RUNIT_WGPU_EXACT=1`'s kernels: every matmul case, and so every MoE case, in the CPU's
/// arithmetic.
#[test]
fn wgpu_exact_matmul_matches_the_cpu_reference() {
    parity(true, true);
}

/// The one-chunk attention's and SiLU's `expf` equals libm's (glibc's, which the CPU backend
/// calls), including where glibc's is not the correctly rounded value: exp(-4.381999) rounds
/// up (0.5007 ulp), which a correctly rounded exp on the device once moved an attention
/// output of the SmolLM2 Q4_0 requantization by an ulp (and its log-probabilities by 0.05).
/// Every 997th f32 of [-87.33, -0.5], then every 8191st of [-0.5, 0].
#[test]
fn wgpu_expf_matches_libm() {
    if !cfg!(all(target_os = "linux", target_env = "gnu")) {
        // The device repeats glibc's `expf`; other libms round otherwise now and then.
        println!("NOTICE: libm is not glibc's, expf not compared");
        return;
    }
    let Some(backend) = adapter("expf not checked") else {
        return;
    };
    let mut inputs: Vec<f32> = vec![f32::from_bits(0xc08c_3956), 0.0, -1.0];
    inputs.extend(
        (0.5f32.to_bits()..87.33f32.to_bits())
            .step_by(997)
            .map(|bits| -f32::from_bits(bits)),
    );
    inputs.extend(
        (0..0.5f32.to_bits())
            .step_by(8191)
            .map(|bits| -f32::from_bits(bits)),
    );
    let device = backend.expf_on_device(&inputs).expect("expf on the device");
    let differing: Vec<(f32, f32, f32)> = inputs
        .iter()
        .zip(&device)
        .filter(|(x, got)| x.exp().to_bits() != got.to_bits())
        .map(|(&x, &got)| (x, x.exp(), got))
        .collect();
    assert!(
        differing.is_empty(),
        "{} of {} differ (x, libm, device): {:?}",
        differing.len(),
        inputs.len(),
        &differing[..differing.len().min(8)]
    );
}

/// `div_rn` and `sqrt_rn` (precise.wgsl), the divisions and square roots of the norm and of
/// the activations' rounding, equal the CPU's correctly rounded `a / b` and `sqrt(|a|)` when
/// their corrections start up to three ulps off the driver's results (drivers may be that far
/// off: Vulkan allows 2.5 ulps, and lavapipe's are exact, so the offsets stand in for a GPU's):
/// quotients and roots across magnitudes, the rounding's 127 / amax and amax / 127, powers of
/// two (whose neighbour below is half an ulp away) and exact quotients.
#[test]
fn wgpu_division_and_root_round_to_nearest() {
    let Some(backend) = adapter("division and root not checked") else {
        return;
    };
    let mut pairs: Vec<(f32, f32)> = Vec::new();
    let mut rng = Rng::new(0x9e37_79b9_7f4a_7c15);
    for _ in 0..4000 {
        let bits = rng.next_u64();
        let magnitude = |e: u64| 2f32.powi((e % 60) as i32 - 30);
        let a = (1.0 + (bits & 0xff_ffff) as f32 / 16_777_216.0) * magnitude(bits >> 24);
        let b = (1.0 + ((bits >> 32) & 0xff_ffff) as f32 / 16_777_216.0) * magnitude(bits >> 56);
        pairs.push((
            if bits & 1 == 0 { a } else { -a },
            if bits & 2 == 0 { b } else { -b },
        ));
    }
    for k in 1..600 {
        let amax = k as f32 * 0.0173;
        pairs.push((127.0, amax));
        pairs.push((amax, 127.0));
        pairs.push((-127.0, -amax));
        pairs.push((1.0, -127.0 / amax));
    }
    for e in -20..20 {
        let two = 2f32.powi(e);
        pairs.push((two, 1.0));
        pairs.push((two * 3.0, 3.0));
        pairs.push((1.0, two));
        pairs.push((two, 1.0 + f32::EPSILON));
    }
    for shift in [-3, -2, -1, 0, 1, 2, 3] {
        let device = backend
            .rounded_on_device(&pairs, shift)
            .expect("division and root on the device");
        let differing: Vec<_> = pairs
            .iter()
            .zip(&device)
            .filter(|((a, b), [q, s])| {
                (a / b).to_bits() != q.to_bits() || a.abs().sqrt().to_bits() != s.to_bits()
            })
            .map(|(&(a, b), &[q, s])| (a, b, a / b, q, a.abs().sqrt(), s))
            .collect();
        assert!(
            differing.is_empty(),
            "start {shift} ulps off: {} of {} differ (a, b, a / b, device, sqrt(|a|), device): {:?}",
            differing.len(),
            pairs.len(),
            &differing[..differing.len().min(6)]
        );
    }
}

/// `f16_bits_rn` (precise.wgsl), the f16 rounding of the activations' scales, the f16 cache
/// and the exact kernels' f16 sums, equals the CPU's round-to-nearest-even conversion
/// (`half`, as F16C) on ties, subnormals, overflow, NaN and random values; how often the
/// driver's own `pack2x16float` (rounding left to the implementation) differs is printed.
#[test]
fn wgpu_f16_conversion_rounds_to_nearest_even() {
    let Some(backend) = adapter("f16 conversion not checked") else {
        return;
    };
    let mut inputs: Vec<f32> = Vec::new();
    for h in 0..=0xffffu16 {
        // Every f16, its midpoint to the next (a tie) and points just either side of it.
        let x = half::f16::from_bits(h).to_f32();
        if !x.is_finite() {
            continue;
        }
        let next = half::f16::from_bits(h.wrapping_add(1)).to_f32();
        inputs.push(x);
        if next.is_finite() && next.abs() > x.abs() {
            let mid = (x as f64 + next as f64) / 2.0;
            inputs.push(mid as f32);
            inputs.push(f32::from_bits((mid as f32).to_bits() + 1));
            inputs.push(f32::from_bits((mid as f32).to_bits() - 1));
        }
    }
    let mut rng = Rng::new(0x2545_f491_4f6c_dd1d);
    for _ in 0..20_000 {
        let x = f32::from_bits(rng.next_u64() as u32);
        if x.is_finite() {
            inputs.push(x);
        }
    }
    inputs.extend([
        65504.0,
        65519.99,
        65520.0,
        1e6,
        -1e6,
        f32::INFINITY,
        f32::NEG_INFINITY,
        0.0,
        -0.0,
    ]);
    inputs.extend([
        1e-10,
        -3e-8,
        2f32.powi(-25),
        2f32.powi(-25) * 1.0001,
        2f32.powi(-24) * 1.5,
    ]);
    let device = backend.f16_rounded_on_device(&inputs).expect("f16 probe");
    let wrong: Vec<_> = inputs
        .iter()
        .zip(&device)
        .filter(|(x, [ours, _])| half::f16::from_f32(**x).to_bits() != *ours)
        .map(|(x, [ours, _])| (*x, half::f16::from_f32(*x).to_bits(), *ours))
        .collect();
    let driver = inputs
        .iter()
        .zip(&device)
        .filter(|(x, [_, theirs])| half::f16::from_f32(**x).to_bits() != *theirs)
        .count();
    println!(
        "NOTICE: the driver's pack2x16float differs from round-to-nearest-even on {driver} of {} inputs",
        inputs.len()
    );
    assert!(
        wrong.is_empty(),
        "{} of {} differ (x, CPU bits, device bits): {:?}",
        wrong.len(),
        inputs.len(),
        &wrong[..wrong.len().min(8)]
    );
    let nan = backend
        .f16_rounded_on_device(&[f32::NAN])
        .expect("f16 probe");
    assert!(half::f16::from_bits(nan[0][0]).is_nan());
}

/// The activations' rounding (a workgroup over 256 values, quantize_coop.wgsl) where its
/// reductions could part from the CPU's loops: Q8_K blocks whose largest magnitude occurs
/// twice with both signs (the first one sets the scale), all-zero blocks of 32 and of 256,
/// values on rounding ties, a row narrower than 256 values. The exact matmuls of every
/// packed mode (Q8_0, Q4_1, Q4_K: modes 4, 6, 5) equal the CPU's bit for bit.
#[test]
fn exact_matmul_rounds_edge_blocks_as_the_cpu() {
    use runit_backend::testing::make_weight;
    use runit_backend::{Backend, Buffer};
    use runit_quant::GgmlType;
    let Some(gpu) = adapter("not checked") else {
        return;
    };
    let gpu = gpu.with_exact_matmul();
    // The same roundings with their block reductions on subgroups (where the adapter's serve).
    let subgroups = WgpuBackend::new(0)
        .expect("adapter")
        .with_exact_matmul()
        .with_subgroup_reductions(true);
    let cpu = CpuBackend::with_simd(1, SimdLevel::Scalar).expect("scalar backend");
    let mut rng = Rng::new(61);
    for width in [256usize, 512] {
        let tokens = 3;
        let mut x = rng.normal(tokens * width, 0.5);
        // Row 0: the largest magnitude twice in its first 256, negative first.
        x[7] = -3.0;
        x[200] = 3.0;
        // Row 1: its first 32 values and (where the row has two) its second 256 all zero.
        x[width..width + 32].fill(0.0);
        if width == 512 {
            x[width + 256..2 * width].fill(0.0);
        }
        // Row 2: values on rounding ties of a block whose amax is 127 (scale 1).
        let row = 2 * width;
        x[row] = 127.0;
        for j in 1..32 {
            x[row + j] = j as f32 - 0.5;
        }
        for ty in [GgmlType::Q8_0, GgmlType::Q4_1, GgmlType::Q4_K] {
            let rows_out = 8;
            let values = rng.values(width * rows_out, -1.0, 1.0);
            let mut outs: Vec<Vec<u32>> = Vec::new();
            for device in [&gpu as &dyn Backend, &cpu, &subgroups] {
                let w = make_weight(device, "w", ty, &[width, rows_out], &values).expect("weight");
                let mut input: Buffer = device.alloc(x.len()).expect("alloc");
                device.upload(&mut input, &x).expect("upload");
                let mut out = device.alloc(tokens * rows_out).expect("alloc");
                device.matmul(&w, &input, tokens, &mut out).expect("matmul");
                let mut host = vec![0.0f32; tokens * rows_out];
                device.download(&out, &mut host).expect("download");
                outs.push(host.iter().map(|v| v.to_bits()).collect());
            }
            assert_eq!(outs[0], outs[1], "{ty:?}, width {width}");
            assert_eq!(
                outs[2], outs[1],
                "{ty:?}, width {width}, reductions on subgroups"
            );
        }
    }
}

/// RMS norms equal the CPU's bit for bit (the goldens need it; the parity suite's bound is
/// an NMSE) at model widths, rows held in registers by workgroups of 1,024 invocations
/// (where the adapter grants them) and of 256, and rows looped over (a width past 8,192, and
/// every width on a backend that does not hold rows): the sums of squares part from the
/// CPU's f64 order, and from each other, but are float-floats, so the mean rounds to the same
/// f32.
#[test]
fn rms_norm_equals_the_cpu_bit_for_bit() {
    use runit_backend::testing::make_weight;
    use runit_backend::{Backend, RmsNorm};
    use runit_quant::GgmlType;
    let Some(gpu) = adapter("not checked") else {
        return;
    };
    let gpu = gpu.with_norm_threads(1024);
    let looping = WgpuBackend::new(0).expect("adapter").without_held_norms();
    let portable = WgpuBackend::new(0).expect("adapter").with_norm_threads(256);
    // The sums on subgroups, held and looped (where the adapter's subgroups serve; else the
    // same as the first two).
    let subgroups = WgpuBackend::new(0)
        .expect("adapter")
        .with_norm_threads(1024)
        .with_subgroup_reductions(true);
    let subgroups_looping = WgpuBackend::new(0)
        .expect("adapter")
        .without_held_norms()
        .with_subgroup_reductions(true);
    println!(
        "norm invocations a workgroup: {} and {}; on subgroups: {}",
        gpu.norm_threads(),
        portable.norm_threads(),
        subgroups.subgroup_reductions()
    );
    let cpu = CpuBackend::with_simd(1, SimdLevel::Scalar).expect("scalar backend");
    let mut rng = Rng::new(67);
    for (width, rows) in [
        (896, 16),
        (2048, 8),
        (3584, 8),
        (4096, 4),
        (5120, 2),
        (8192, 2),
        (8448, 2),
    ] {
        let x = rng.normal(rows * width, 1.5);
        let w = rng.values(width, 0.5, 1.5);
        let mut outs: Vec<Vec<u32>> = Vec::new();
        for device in [
            &gpu as &dyn Backend,
            &looping,
            &portable,
            &cpu,
            &subgroups,
            &subgroups_looping,
        ] {
            let weight = make_weight(device, "norm", GgmlType::F32, &[width], &w).expect("weight");
            let norm = RmsNorm {
                weight: &weight,
                eps: 1e-6,
            };
            let mut input = device.alloc(x.len()).expect("alloc");
            device.upload(&mut input, &x).expect("upload");
            let mut out = device.alloc(x.len()).expect("alloc");
            device
                .rms_norm(&input, norm, rows, &mut out)
                .expect("rms_norm");
            let mut host = vec![0.0f32; x.len()];
            device.download(&out, &mut host).expect("download");
            outs.push(host.iter().map(|v| v.to_bits()).collect());
        }
        assert_eq!(outs[0], outs[3], "held rows, width {width}");
        assert_eq!(outs[1], outs[3], "looped rows, width {width}");
        assert_eq!(
            outs[2], outs[3],
            "held rows of 256 invocations, width {width}"
        );
        assert_eq!(outs[4], outs[3], "held rows on subgroups, width {width}");
        assert_eq!(outs[5], outs[3], "looped rows on subgroups, width {width}");
    }
}

/// Embedding rows several steps of the kernel's invocations long (256 a row: a row of
/// 1,536 values is 6 steps; the parity suite's rows of 256 are one) equal the CPU's
/// dequantization for a K-quant, a 32-value block type and F16.
#[test]
fn embedding_of_wide_rows_matches_the_cpu() {
    use runit_backend::testing::{make_weight_as, nmse};
    use runit_backend::{Backend, WeightRole};
    use runit_quant::GgmlType;
    let Some(gpu) = adapter("not checked") else {
        return;
    };
    let cpu = CpuBackend::with_simd(1, SimdLevel::Scalar).expect("scalar backend");
    let (width, rows) = (1536, 5);
    let ids = [4u32, 0, 2];
    for ty in [GgmlType::Q4_K, GgmlType::Q8_0, GgmlType::F16] {
        let table = Rng::new(0x0e3b + ty.id() as u64).normal(width * rows, 0.5);
        let mut outs: Vec<Vec<f32>> = Vec::new();
        for device in [&gpu as &dyn Backend, &cpu] {
            let role = WeightRole::TokenEmbedding;
            let weight = make_weight_as(device, role, "token_embd", ty, &[width, rows], &table)
                .expect("weight");
            let mut out = device.alloc(ids.len() * width).expect("alloc");
            device
                .embedding(&weight, &ids, &mut out)
                .expect("embedding");
            let mut host = vec![0.0f32; ids.len() * width];
            device.download(&out, &mut host).expect("download");
            outs.push(host);
        }
        let error = nmse(&outs[1], &outs[0]);
        assert!(error <= 1e-12, "{ty:?}: NMSE {error:e}");
    }
}
