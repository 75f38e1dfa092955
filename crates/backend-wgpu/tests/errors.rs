//! Bad input on the wgpu backend comes back as errors naming what is missing, never a panic:
//! a missing adapter, a weight type without a kernel, a KV type it does not store, a buffer
//! past the adapter's limits. Runs only where an adapter exists (as `parity.rs`).

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
    match backend.alloc(limit / 4 + 1) {
        Err(BackendError::Device { message, .. }) => {
            assert!(message.contains("binding limit"), "{message}")
        }
        Err(other) => panic!("expected a limit error, got {other}"),
        Ok(_) => panic!("allocated past the binding limit"),
    }
}
