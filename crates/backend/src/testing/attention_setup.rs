//! Inputs of the parity suite's attention cases: sequences with a cached prefix and new rows
//! in a paged cache whose blocks are handed out in a shuffled order.

use super::random::Rng;
use crate::{
    Attention, AttentionParams, Backend, BackendError, Buffer, KvRole, KvTypes, KvWrite,
    SequenceSpan,
};

type Output = Result<Vec<f32>, BackendError>;

/// A buffer holding `values`.
fn buffer(backend: &dyn Backend, values: &[f32]) -> Result<Buffer, BackendError> {
    let mut buffer = backend.alloc(values.len())?;
    backend.upload(&mut buffer, values)?;
    Ok(buffer)
}

/// The cached part of one sequence: its block table, length and keys and values.
struct Prefix {
    table: Vec<u32>,
    len: usize,
    k: Vec<f32>,
    v: Vec<f32>,
}

/// Inputs of one attention case: sequences with a cached prefix and new rows, in a paged
/// cache whose blocks are handed out in a scrambled order.
pub struct AttentionSetup {
    kv_width: usize,
    head_dim: usize,
    q_width: usize,
    block_size: usize,
    n_cells: usize,
    prefixes: Vec<Prefix>,
    spans: Vec<SequenceSpan>,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    rows: usize,
}

impl AttentionSetup {
    pub fn new(
        rng: &mut Rng,
        heads: usize,
        kv_heads: usize,
        head_dim: usize,
        sequences: &[(usize, usize)],
    ) -> AttentionSetup {
        let block_size = 16;
        let kv_width = kv_heads * head_dim;
        let q_width = heads * head_dim;
        let blocks: Vec<usize> = sequences
            .iter()
            .map(|(prefix, rows)| (prefix + rows).div_ceil(block_size))
            .collect();
        let total_blocks: usize = blocks.iter().sum::<usize>() + 1;
        // Hand blocks out in a shuffled order (Fisher-Yates), so tables are not contiguous.
        let mut order: Vec<u32> = (0..total_blocks as u32).collect();
        for i in (1..order.len()).rev() {
            order.swap(i, rng.below(i + 1));
        }
        let mut next = 0;
        let mut prefixes = Vec::new();
        let mut spans = Vec::new();
        let mut first_row = 0;
        for ((prefix, rows), count) in sequences.iter().zip(&blocks) {
            let table = order[next..next + count].to_vec();
            next += count;
            let k = rng.values(prefix * kv_width, -1.0, 1.0);
            let v = rng.values(prefix * kv_width, -1.0, 1.0);
            prefixes.push(Prefix {
                table: table.clone(),
                len: *prefix,
                k,
                v,
            });
            spans.push(SequenceSpan {
                first_row,
                rows: *rows,
                start_position: *prefix,
                block_table: table,
                block_size,
            });
            first_row += rows;
        }
        AttentionSetup {
            head_dim,
            kv_width,
            q_width,
            block_size,
            n_cells: total_blocks * block_size,
            prefixes,
            spans,
            q: rng.values(first_row * q_width, -2.0, 2.0),
            k: rng.values(first_row * kv_width, -1.0, 1.0),
            v: rng.values(first_row * kv_width, -1.0, 1.0),
            rows: first_row,
        }
    }

    pub fn run(
        &self,
        b: &dyn Backend,
        types: impl Into<KvTypes>,
        params: &AttentionParams,
    ) -> Output {
        let types = types.into();
        let mut k_cache = b.alloc_kv(
            self.n_cells,
            self.kv_width,
            self.head_dim,
            types.keys,
            KvRole::Keys,
        )?;
        let mut v_cache = b.alloc_kv(
            self.n_cells,
            self.kv_width,
            self.head_dim,
            types.values,
            KvRole::Values,
        )?;
        for prefix in &self.prefixes {
            if prefix.len == 0 {
                continue;
            }
            let (k, v) = (&prefix.k, &prefix.v);
            let span = SequenceSpan {
                first_row: 0,
                rows: prefix.len,
                start_position: 0,
                block_table: prefix.table.clone(),
                block_size: self.block_size,
            };
            b.kv_write(KvWrite {
                k: &buffer(b, k)?,
                v: &buffer(b, v)?,
                k_cache: &mut k_cache,
                v_cache: &mut v_cache,
                spans: &[span],
            })?;
        }
        let (k, v) = (buffer(b, &self.k)?, buffer(b, &self.v)?);
        b.kv_write(KvWrite {
            k: &k,
            v: &v,
            k_cache: &mut k_cache,
            v_cache: &mut v_cache,
            spans: &self.spans,
        })?;
        let mut out = b.alloc(self.rows * self.q_width)?;
        let attention = Attention {
            q: &buffer(b, &self.q)?,
            k_cache: &k_cache,
            v_cache: &v_cache,
            spans: &self.spans,
            params,
        };
        b.attention(&attention, &mut out)?;
        let mut values = vec![0.0; self.rows * self.q_width];
        b.download(&out, &mut values)?;
        Ok(values)
    }
}
