// llama.cpp's rotation of quantized-cache heads (`runit_backend::hadamard::rotate_chunks`):
// `count` chunks of n values (a power of two, at most 256) of x from chunk `first`, each scaled by
// 1 / sqrt(n) then transformed by butterflies of span 1, 2, 4, ...; one workgroup a chunk.

struct Params {
    n: u32,
    first: u32,
    count: u32,
    scale: f32,
    groups_x: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> x: array<f32>;

var<workgroup> chunk: array<f32, 256>;

@compute @workgroup_size(64)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let index = wid.x + wid.y * p.groups_x;
    if index >= p.count {
        return;
    }
    let base = (p.first + index) * p.n;
    for (var i = lid; i < p.n; i += 64u) {
        chunk[i] = x[base + i] * p.scale;
    }
    workgroupBarrier();
    for (var span = 1u; span < p.n; span *= 2u) {
        for (var pair = lid; pair < p.n / 2u; pair += 64u) {
            let i = (pair / span) * 2u * span + pair % span;
            let a = chunk[i];
            let b = chunk[i + span];
            chunk[i] = a + b;
            chunk[i + span] = a - b;
        }
        workgroupBarrier();
    }
    for (var i = lid; i < p.n; i += 64u) {
        x[base + i] = chunk[i];
    }
}
