//! (in progress)
use runit_backend::{BackendError, Buffer};
use crate::CudaBackend;
pub fn gather_rows(_b: &CudaBackend, _s: &Buffer, _r: &[u32], _w: usize, _o: &mut Buffer) -> Result<(), BackendError> { Err(BackendError::ForeignBuffer{op:"gather_rows", what:"todo"}) }
pub fn scatter_add_rows(_b: &CudaBackend, _s: &Buffer, _r: &[u32], _sc: &[f32], _w: usize, _d: &mut Buffer) -> Result<(), BackendError> { Err(BackendError::ForeignBuffer{op:"scatter_add_rows", what:"todo"}) }
