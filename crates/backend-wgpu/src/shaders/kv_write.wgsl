// Writes rows of `src` ([rows, width]) into cache cells: entry e of `pairs` is (source row, cell),
// as the host read them from the spans' block tables. Cells hold f32 (KV_F16 false) or f16
// pairs packed in words (KV_F16 true; the width is even).

struct Params {
    len: u32,   // words to write: entries × width (f32) or entries × width / 2 (f16)
    width: u32,
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> src: array<f32>;
@group(0) @binding(2) var<storage, read> pairs: array<u32>; // [entries, 2]
@group(0) @binding(3) var<storage, read_write> cache: array<u32>;

@compute @workgroup_size(64)
fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) groups: vec3<u32>) {
    let i = gid.x + gid.y * groups.x * 64u;
    if i >= p.len {
        return;
    }
    if KV_F16 {
        let row_words = p.width / 2u;
        let entry = i / row_words;
        let j = i % row_words;
        let at = pairs[2u * entry] * p.width + 2u * j;
        cache[pairs[2u * entry + 1u] * row_words + j] = pack2x16float(vec2<f32>(src[at], src[at + 1u]));
    } else {
        let entry = i / p.width;
        let j = i % p.width;
        cache[pairs[2u * entry + 1u] * p.width + j] = bitcast<u32>(src[pairs[2u * entry] * p.width + j]);
    }
}
