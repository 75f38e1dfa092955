//! (in progress)
use runit_backend::{BackendError, Buffer, RopeParams, Weight};
use crate::CudaBackend;
pub fn rope(_b: &CudaBackend, _x: &mut Buffer, _p: &[u32], _params: &RopeParams, _f: Option<&Weight>) -> Result<(), BackendError> { Err(BackendError::ForeignBuffer{op:"rope", what:"todo"}) }
