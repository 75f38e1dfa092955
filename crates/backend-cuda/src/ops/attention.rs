//! (in progress)
use runit_backend::{AttentionParams, BackendError, Buffer, KvCache, SequenceSpan};
use crate::CudaBackend;
pub fn attention(_b: &CudaBackend, _q: &Buffer, _k: &KvCache, _v: &KvCache, _s: &[SequenceSpan], _p: &AttentionParams, _o: &mut Buffer) -> Result<(), BackendError> { Err(BackendError::ForeignBuffer{op:"attention", what:"todo"}) }
