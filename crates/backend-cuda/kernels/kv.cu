// Writes a step's keys or values ([tokens, width] f32) into the paged cache: row t goes to
// the cell of its position in its span's block table (step_cell), as f16 (rounded to nearest
// even) or f32. Rows outside every span are skipped.
//
// Launch: one block per row (grid.x = rows), any block size.
#include "common.cuh"

// The span owning `row`, or -1 when no span's rows include it.
__device__ __forceinline__ i32 owning_span(const i32* step, const StepHeader* h, i32 row) {
    if (row >= h->tokens) return -1;
    const i32 span = step[h->row_span + row];
    if (span < 0 || span >= h->spans) return -1;
    const i32* info = step + h->span_info + span * 4;
    return row >= info[0] && row < info[0] + info[1] ? span : -1;
}

extern "C" __global__ void kv_write_f16(u16* cache, const float* src, const i32* step, u32 width, u32 rows, u64 n_cells) { pdl_start();
    const StepHeader* h = (const StepHeader*)step;
    const i32 row = blockIdx.x;
    if ((u32)row >= rows) return;
    const i32 span = owning_span(step, h, row);
    if (span < 0) return;
    const i32 cell = step_cell(step, h, span, step[h->positions + row]);
    if (cell < 0 || (u64)cell >= n_cells) return;
    const float* in = src + (u64)row * width;
    u16* out = cache + (u64)cell * width;
    for (u32 i = threadIdx.x; i < width; i += blockDim.x) out[i] = float_to_half(in[i]);
}

extern "C" __global__ void kv_write_f32(float* cache, const float* src, const i32* step, u32 width, u32 rows, u64 n_cells) { pdl_start();
    const StepHeader* h = (const StepHeader*)step;
    const i32 row = blockIdx.x;
    if ((u32)row >= rows) return;
    const i32 span = owning_span(step, h, row);
    if (span < 0) return;
    const i32 cell = step_cell(step, h, span, step[h->positions + row]);
    if (cell < 0 || (u64)cell >= n_cells) return;
    const float* in = src + (u64)row * width;
    float* out = cache + (u64)cell * width;
    for (u32 i = threadIdx.x; i < width; i += blockDim.x) out[i] = in[i];
}
