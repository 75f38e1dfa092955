// The parameters and query entries of the decode attention kernels: ggml's one-chunk path
// (attention_chunk.wgsl) and the split path's two passes (attention_split.wgsl,
// attention_merge.wgsl).

struct Params {
    heads: u32,
    group: u32,     // query heads per KV head
    head_dim: u32,
    kv_width: u32,
    q_width: u32,
    scale: f32,
    zero: u32,      // always 0 (`opaque` in expf.wgsl)
    mode: u32,      // attention_chunk_quantize.wgsl's rounding (quantize_x.wgsl's mode)
    chunks: u32,    // the split path's key chunks a query (the partial records' stride)
    // Heads a workgroup of attention_merge.wgsl takes: 1, or 256 / head_dim where it rounds
    // Q8_K blocks of 256 values for the output projection from heads of fewer values.
    merge_heads: u32,
}

struct Query {
    row: u32,
    cells: u32, // offset of the sequence's position -> cell table
    lo: u32,    // first visible position
    pos: u32,   // the query's position (the last visible one)
}

@group(0) @binding(0) var<uniform> p: Params;

// Keys of chunk `chunk` of a query's positions lo ..= pos cut into p.chunks chunks of whole
// tiles of `tile` keys: its first position and its end (past its last; first >= end for a
// chunk past the keys).
fn chunk_keys(lo: u32, pos: u32, chunk: u32, tile: u32) -> vec2<u32> {
    let keys = pos + 1u - lo;
    let per_chunk = ((keys + tile - 1u) / tile + p.chunks - 1u) / p.chunks * tile;
    let first = lo + chunk * per_chunk;
    return vec2<u32>(first, min(first + per_chunk, pos + 1u));
}
