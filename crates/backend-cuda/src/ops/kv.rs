//! (in progress)
use runit_backend::{BackendError, Buffer, KvCache, SequenceSpan};
use crate::CudaBackend;
pub fn kv_write(_b: &CudaBackend, _k: &Buffer, _v: &Buffer, _kc: &mut KvCache, _vc: &mut KvCache, _s: &[SequenceSpan]) -> Result<(), BackendError> { Err(BackendError::ForeignBuffer{op:"kv_write", what:"todo"}) }
