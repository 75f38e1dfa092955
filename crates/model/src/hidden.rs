//! The decoder's final hidden states, for embeddings: a pass as [`Model::forward`] runs it,
//! read after the output norm (the input of the output projection).

use crate::forward::Batch;
use crate::workspace::{KvState, Scratch};
use crate::{Model, ModelError};

impl Model {
    /// Runs `batch` through the decoder as [`Model::forward`] does and writes the final
    /// hidden states of `batch.logit_rows`, after the output norm, into `hidden`
    /// (`[logit_rows.len(), embedding_length]`).
    pub fn forward_hidden(
        &self,
        batch: &Batch<'_>,
        kv: &mut KvState,
        scratch: &mut Scratch,
        hidden: &mut Vec<f32>,
    ) -> Result<(), ModelError> {
        self.run_pass(batch, kv, scratch, None)?;
        hidden.resize(batch.logit_rows.len() * self.config.embedding_length, 0.0);
        self.backend.download(&scratch.normed, hidden)?;
        Ok(())
    }
}
