// Shared helpers of every RunIT kernel. No system headers: NVRTC compiles these with only
// what is written here, so CI can build them without a CUDA toolkit.
#pragma once

typedef unsigned char u8;
typedef signed char i8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef int i32;
typedef unsigned long long u64;
typedef long long i64;

// IEEE half <-> float through PTX (no cuda_fp16.h needed).
// Programmatic dependent launch (sm_90 and newer): first let the next kernel of the stream
// begin launching, then wait until every earlier kernel has finished and its writes are
// visible. Every kernel calls this first, so launching any kernel with the programmatic-
// serialization attribute keeps the stream's memory order while the launch overlaps the
// predecessor's tail (src/lib.rs launch!). A no-op on older devices.
// A kernel may split the two (pdl_launch_dependents first, then work that reads nothing an
// earlier kernel writes, such as prefetching weights, then pdl_wait).
__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_start() {
    pdl_launch_dependents();
    pdl_wait();
}

// The shared-memory address of a generic pointer into shared memory (for PTX operands).
__device__ __forceinline__ u32 shared_address(const void* pointer) {
    u32 address;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(address) : "l"(pointer));
    return address;
}

// cp.async (sm_80): copies global bytes into shared memory without registers; a thread's
// copies form groups (`cp_async_commit`), `cp_async_wait<N>` waits until at most N of its
// groups are in flight.
__device__ __forceinline__ void cp_async16(u32 shared, const void* global) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(shared), "l"(global));
}
// Zero-fills the 16 shared bytes (no global read).
__device__ __forceinline__ void cp_async16_zero(u32 shared, const void* global) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, 0;" ::"r"(shared), "l"(global));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}
// Copies 4 bytes (both addresses 4-byte aligned).
__device__ __forceinline__ void cp_async4(u32 shared, const void* global) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(shared), "l"(global));
}

// Asks for the bytes [p, p + bytes) to be brought into L2, one 128-byte line per thread and
// step (a hint: no value is read, and the address need not be aligned).
__device__ __forceinline__ void prefetch_l2(const u8* p, u64 bytes) {
    for (u64 offset = (u64)threadIdx.x * 128; offset < bytes; offset += (u64)blockDim.x * 128)
        asm volatile("prefetch.global.L2 [%0];" ::"l"(p + offset));
}

__device__ __forceinline__ float half_to_float(u16 h) {
    float f;
    asm("{ .reg .b16 t; mov.b16 t, %1; cvt.f32.f16 %0, t; }" : "=f"(f) : "h"(h));
    return f;
}

__device__ __forceinline__ u16 float_to_half(float f) {
    u16 h;
    asm("{ .reg .b16 t; cvt.rn.f16.f32 t, %1; mov.b16 %0, t; }" : "=h"(h) : "f"(f));
    return h;
}

// bfloat16 is the top half of an f32.
__device__ __forceinline__ float bf16_to_float(u16 b) {
    return __uint_as_float(((u32)b) << 16);
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
    return v;
}

// Sum over a block of up to 1024 threads; every thread gets the total. `scratch` holds 32 floats.
// silu(x) * u, silu(x) = x / (1 + e^-x). The product is rounded on its own (no fused
// multiply-add), as the CPU reference computes it.
__device__ __forceinline__ float silu_mul_value(float x, float u) { return __fmul_rn(x / (1.0f + expf(-x)), u); }

__device__ __forceinline__ float block_sum(float v, float* scratch) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    const int warps = (blockDim.x + 31) >> 5;
    v = lane < warps ? scratch[lane] : 0.0f;
    return warp_sum(v);
}

__device__ __forceinline__ float block_max(float v, float* scratch) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    const int warps = (blockDim.x + 31) >> 5;
    v = lane < warps ? scratch[lane] : -3.402823466e38f;
    return warp_max(v);
}

// The per-step inputs of one forward pass in device memory (see src/step.rs, which writes
// this layout). All offsets count i32 elements from the start of the step buffer.
struct StepHeader {
    i32 tokens;          // rows of the batch
    i32 spans;           // sequences in the batch
    i32 logit_rows;      // rows whose logits are wanted
    i32 block_size;      // KV cells per cache block
    i32 table_stride;    // block-table entries reserved per span
    i32 ids;             // offset of token ids [tokens]
    i32 positions;       // offset of positions [tokens]
    i32 row_span;        // offset of each row's span index [tokens]
    i32 span_info;       // offset of [spans][4]: first_row, rows, start_position, unused
    i32 logit_row_ids;   // offset of logit rows [logit_rows]
    i32 block_tables;    // offset of [spans][table_stride] block ids
    i32 reserved[5];
};

// The KV cell of position `pos` in span `span`.
__device__ __forceinline__ i32 step_cell(const i32* step, const StepHeader* h, i32 span, i32 pos) {
    const i32* table = step + h->block_tables + span * h->table_stride;
    return table[pos / h->block_size] * h->block_size + pos % h->block_size;
}

// The span owning `row`, or -1 when no span's rows include it.
__device__ __forceinline__ i32 owning_span(const i32* step, const StepHeader* h, i32 row) {
    if (row >= h->tokens) return -1;
    const i32 span = step[h->row_span + row];
    if (span < 0 || span >= h->spans) return -1;
    const i32* info = step + h->span_info + span * 4;
    return row >= info[0] && row < info[0] + info[1] ? span : -1;
}

// The cache cell that batch row `row` (of `rows`) is written to, or -1 when no span owns the row or the
// cell lies outside the cache.
__device__ __forceinline__ i64 row_cell(const i32* step, i32 row, u32 rows, u64 n_cells) {
    const StepHeader* h = (const StepHeader*)step;
    if ((u32)row >= rows) return -1;
    const i32 span = owning_span(step, h, row);
    if (span < 0) return -1;
    const i32 cell = step_cell(step, h, span, step[h->positions + row]);
    return cell < 0 || (u64)cell >= n_cells ? -1 : cell;
}

// The query tile of a prefill block: tiles of `tile_rows` rows, each span's in turn, tile
// `index` overall (span -1: none, the block returns).
struct PrefillTile {
    i32 span = -1, first_row = 0, span_end = 0;
    __device__ PrefillTile(const i32* step, u32 index, u32 tile_rows) {
        const StepHeader* h = (const StepHeader*)step;
        for (i32 s = 0; s < h->spans; ++s) {
            const i32* info = step + h->span_info + s * 4;
            const u32 tiles = ((u32)info[1] + tile_rows - 1) / tile_rows;
            if (index < tiles) {
                span = s;
                first_row = info[0] + (i32)(index * tile_rows);
                span_end = min(info[0] + info[1], h->tokens);
                return;
            }
            index -= tiles;
        }
    }
};

// step_cell of positions first, first + stride, ... (first >= 0) by additions: one division
// for the first position, then the offset in the block carried over into the next block.
struct CellWalk {
    const i32* table;
    i32 block_size, block, offset;
    __device__ __forceinline__ CellWalk(const i32* step, const StepHeader* h, i32 span, i32 first)
        : table(step + h->block_tables + span * h->table_stride), block_size(h->block_size) {
        block = (i32)((u32)first / (u32)block_size);
        offset = first - block * block_size;
    }
    // The cell of the current position (its block's table entry read now).
    __device__ __forceinline__ i32 cell() const { return table[block] * block_size + offset; }
    __device__ __forceinline__ void advance(i32 stride) {
        offset += stride;
        while (offset >= block_size) offset -= block_size, block++;
    }
};

// Orthonormal Walsh-Hadamard transform of each chunk of `n` values of x[0 .. width) in
// shared memory, as ggml-cpu computes it: scaled by 1/sqrt(n), then butterflies of growing
// span (llama.cpp's rotation of quantized caches). All threads of the block take part.
__device__ void hadamard_chunks(float* x, u32 width, u32 n) {
    const float scale = 1.0f / sqrtf((float)n);
    for (u32 i = threadIdx.x; i < width; i += blockDim.x) x[i] *= scale;
    __syncthreads();
    for (u32 span = 1; span < n; span *= 2) {
        for (u32 p = threadIdx.x; p < width / 2; p += blockDim.x) {
            const u32 chunk = p / (n / 2), pair = p % (n / 2);
            const u32 i = chunk * n + (pair / span) * 2 * span + pair % span;
            const float a = x[i], b = x[i + span];
            x[i] = a + b;
            x[i + span] = a - b;
        }
        __syncthreads();
    }
}
