//! Bad input on the wgpu backend comes back as errors naming what is missing, never a panic:
//! a missing adapter, a weight type without a kernel, a KV type it does not store, a cache
//! or a whole-bound buffer past the adapter's limits. Runs only where an adapter exists (as `parity.rs`).

use std::sync::Arc;

use runit_backend::{
    BackendError, Device, HostMemory, KvRole, KvType, Op, PrimitiveOps, WeightRole, WeightSource,
};
use runit_backend_wgpu::{WgpuBackend, WgpuError};
use runit_quant::GgmlType;

fn backend() -> Option<WgpuBackend> {
    match WgpuBackend::new(0) {
        Ok(backend) => Some(backend),
        Err(error) => {
            let required = std::env::var("RUNIT_REQUIRE_WGPU").is_ok_and(|v| v == "1");
            assert!(!required, "RUNIT_REQUIRE_WGPU=1 but: {error}");
            println!("NOTICE: no wgpu adapter, not run: {error}");
            None
        }
    }
}

#[test]
fn an_adapter_past_the_list_is_named() {
    let count = runit_backend_wgpu::adapters().len();
    match WgpuBackend::new(count) {
        Err(WgpuError::NoSuchAdapter { ordinal, count: c }) => {
            assert_eq!((ordinal, c), (count, count))
        }
        Err(WgpuError::NoAdapter) => assert_eq!(count, 0),
        Err(other) => panic!("unexpected error: {other}"),
        Ok(_) => panic!("opened adapter {count} of {count}"),
    }
}

#[test]
fn a_type_without_a_kernel_is_refused() {
    let Some(backend) = backend() else { return };
    let ty = GgmlType::IQ2_XXS;
    assert!(!backend.supports(Op::MatMul, ty));
    let row_bytes = ty.row_bytes(256).expect("whole blocks") as usize;
    let memory: Arc<dyn HostMemory> = Arc::new(vec![0u8; row_bytes * 4]);
    let weight = backend
        .load_weight(WeightSource {
            name: "w.iq2",
            role: WeightRole::Matrix,
            ty,
            shape: &[256, 4],
            memory,
            range: 0..row_bytes * 4,
        })
        .expect("packed bytes load whatever their type");
    let x = backend.alloc(256).expect("x");
    let mut out = backend.alloc(4).expect("out");
    match backend.matmul(&weight, &x, 1, &mut out) {
        Err(BackendError::Unsupported { ty: t, tensor, .. }) => {
            assert_eq!((t, tensor.as_str()), (ty, "w.iq2"))
        }
        other => panic!("expected Unsupported, got {other:?}"),
    }
}

#[test]
fn turbo_caches_and_oversized_buffers_are_refused() {
    let Some(backend) = backend() else { return };
    match backend.alloc_kv(16, 64, 64, KvType::Tq4, KvRole::Keys) {
        Err(BackendError::UnsupportedKv { ty, .. }) => assert_eq!(ty, KvType::Tq4),
        Err(other) => panic!("expected UnsupportedKv, got {other}"),
        Ok(_) => panic!("accepted a TurboQuant cache"),
    }
    let limit = backend.adapter().max_binding as usize;
    // A cache is bound whole by attention: one past the limit is refused when it is made.
    match backend.alloc_kv(limit / 128 + 1, 64, 64, KvType::F16, KvRole::Keys) {
        Err(BackendError::Device { message, .. }) => {
            assert!(message.contains("binding limit"), "{message}")
        }
        Err(other) => panic!("expected a limit error, got {other}"),
        Ok(_) => panic!("allocated a cache past the binding limit"),
    }
    // A buffer may outgrow one binding, but an op that binds it whole says so.
    let len = limit / 4 + 64;
    let mut big = backend.alloc(len).expect("a buffer past one binding");
    let small = backend.alloc(len).expect("another");
    match backend.add(&mut big, &small, len) {
        Err(BackendError::Device { message, .. }) => {
            assert!(message.contains("binding limit"), "{message}")
        }
        other => panic!("expected a limit error, got {other:?}"),
    }
}

/// Matmul outputs past one storage binding (the logits of a long batch over a large
/// vocabulary): the tokens are split into groups that bind, and every group's values are
/// right.
#[test]
fn matmul_outputs_past_one_binding_are_split_by_tokens() {
    let Some(backend) = backend() else { return };
    let (n, rows) = (32usize, 65_536usize);
    let tokens = backend.adapter().max_binding as usize / (rows * 4) + 8;
    let weights: Vec<f32> = (0..n * rows)
        .map(|i| ((i * 7919 % 1000) as f32 - 500.0) / 256.0)
        .collect();
    let inputs: Vec<f32> = (0..tokens * n)
        .map(|i| ((i * 104_729 % 997) as f32 - 498.0) / 128.0)
        .collect();
    let memory: Arc<dyn HostMemory> = Arc::new(bytemuck::cast_slice::<f32, u8>(&weights).to_vec());
    let weight = backend
        .load_weight(WeightSource {
            name: "w.f32",
            role: WeightRole::Matrix,
            ty: GgmlType::F32,
            shape: &[n, rows],
            memory,
            range: 0..n * rows * 4,
        })
        .expect("weight");
    let mut x = backend.alloc(tokens * n).expect("x");
    backend.upload(&mut x, &inputs).expect("upload");
    let mut out = backend.alloc(tokens * rows).expect("out past one binding");
    backend
        .matmul(&weight, &x, tokens, &mut out)
        .expect("matmul split by tokens");
    let mut got = vec![0.0f32; tokens * rows];
    backend.download(&out, &mut got).expect("download");
    for t in [0, 1, tokens / 2, tokens - 9, tokens - 8, tokens - 1] {
        for r in [0, 1, 4_097, rows - 1] {
            let want: f64 = (0..n)
                .map(|i| f64::from(weights[r * n + i]) * f64::from(inputs[t * n + i]))
                .sum();
            let value = f64::from(got[t * rows + r]);
            assert!(
                (value - want).abs() <= 1e-4 * want.abs().max(1.0),
                "token {t} row {r}: {value} vs {want}"
            );
        }
    }
}
